"""Hostile environment, ninth pass (issue 27): the eighth pass's leftovers.  A subscriber
that never reads must not make the controller queue libzmq's default 1000 publications,
and every output (`eval --csv`/`--png`, `export teccl|taccl|teccl-flows|forestcoll`,
`bench --out`, the loop's and train's plots) is written whole or not at all
(`mccl_opt.files.write_output`), as `-o` of `solve`/`topo`/`export msccl` already was.
`bench/audit_issue27.py` re-plays every example of the issue end to end."""

from __future__ import annotations

import errno

import pytest

from mccl_opt import files
from mccl_opt.cli import main


def _full_disk(monkeypatch) -> None:
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)


def test_the_publication_socket_queues_few_messages_per_subscriber():
    import zmq

    from mccl_runtime.service import PUB_HWM, open_sockets

    ctx = zmq.Context()
    router, pub = open_sockets(ctx, 1024)
    try:
        assert pub.getsockopt(zmq.TYPE) == zmq.PUB and router.getsockopt(zmq.MAXMSGSIZE) == 1024
        assert pub.getsockopt(zmq.SNDHWM) == PUB_HWM <= 64       # libzmq's default is 1000
    finally:
        router.close(0)
        pub.close(0)
        ctx.term()


def test_a_matrix_export_keeps_the_previous_file_when_the_disk_fills(tmp_path, monkeypatch, capsys):
    out = tmp_path / "m.json"
    assert main(["export", "teccl", "hpn-1x2x4", "-o", str(out)]) == 0
    before = out.read_bytes()
    _full_disk(monkeypatch)
    assert main(["export", "teccl", "hpn-1x1x2", "-o", str(out)]) == 2     # written in place: truncated
    assert "No space left" in capsys.readouterr().err
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_eval_csv_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    from mccl_opt.cli.eval import _write_csv
    from mccl_opt.sweep import ROW_FIELDS

    out = tmp_path / "rows.csv"
    rows = [dict.fromkeys(ROW_FIELDS, 1), dict.fromkeys(ROW_FIELDS, 2)]
    _write_csv(rows, out)
    before = out.read_text()
    assert before.splitlines()[0] == ",".join(ROW_FIELDS) and len(before.splitlines()) == 3
    _full_disk(monkeypatch)
    with pytest.raises(OSError):
        _write_csv(rows * 1000, out)
    assert out.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv"]


def test_a_figure_is_saved_through_the_atomic_writer(tmp_path, monkeypatch):
    class Figure:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def savefig(self, buf, format: str, dpi: int) -> None:     # noqa: A002 - matplotlib's name
            assert format == "png"
            buf.write(self.data)

    out = tmp_path / "f.png"
    files.write_figure(Figure(b"first"), out)
    assert out.read_bytes() == b"first"
    _full_disk(monkeypatch)
    with pytest.raises(OSError):
        files.write_figure(Figure(b"second" * 1000), out)
    assert out.read_bytes() == b"first" and sorted(p.name for p in tmp_path.iterdir()) == ["f.png"]



def test_a_rank_that_torchrun_stops_names_its_collective(capsys):
    """torchrun SIGTERMs the survivors once a rank dies; a survivor not yet told by gloo
    ended silently (``exitcode -15``).  Now SIGTERM inside the collectives is one
    ``error:`` line naming the rank, the collective and the iteration."""
    import os
    import signal

    from executor_cuda import torchrun

    step, before = "iteration 7", signal.getsignal(signal.SIGTERM)
    with pytest.raises(torchrun.Terminated) as err:
        with torchrun.sigterm_names_the_collective(lambda: f"rank 2: the allgather collective w/ag at {step}"):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000_000):          # the handler runs between bytecodes
                pass
    assert str(err.value) == "rank 2: the allgather collective w/ag at iteration 7"
    assert signal.getsignal(signal.SIGTERM) is before                 # restored on the way out


def test_a_subscriber_counts_the_publications_it_missed():
    """With a send high-water mark the controller drops publications for a subscriber
    that falls behind; the subscriber sees the ``seq`` gap and counts it (``missed``),
    so an executor knows to ask ``get_schedule``."""
    from mccl_runtime.protocol import encode, new_id
    from tests.test_runtime_service import KEY, _publisher_and_subscriber

    epoch = new_id()

    def hold(seq: int) -> list[bytes]:
        body = {"comm": "w", "name": "ag", "version": 2, "held": []}
        return [b"schedule", encode("hold", body, KEY, epoch=epoch, seq=seq)]

    with _publisher_and_subscriber() as (pub, sub):
        for seq in (1, 2, 5, 6, 9):
            pub.send_multipart(hold(seq))
        got = [sub.recv_any(2.0) for _ in range(5)]
        assert all(g is not None for g in got) and sub.missed == 4       # 3, 4, 7 and 8 (1 opens the epoch)
