"""MSCCL XML export of a schedule and a symbolic checker that replays the XML.

The exporter writes the algorithm format loaded by msccl-executor-nccl
(``MSCCL_ALGO_DIR``, docs/executor.md):

``<algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes
maxBytes>`` / ``<gpu id i_chunks o_chunks s_chunks>`` / ``<tb id send recv chan>`` /
``<step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>``.

Lowering: the schedule is compiled by :mod:`mccl_opt.lowering.program` with one *chunk* per
element, ``C`` chunks per block (the least common denominator of the shares, at most
``MAX_COUNT - 1``).  Every GPU gets one send-only threadblock per (peer, channel), one
receive-only threadblock per (peer, channel) and one threadblock for local copies, so
each threadblock has at most one send and one receive peer.  Transfers are listed in
round order on both ends of every (peer, channel) connection; a send that forwards
data depends (``depid``/``deps``) on the receive that brought it, which ran in an
earlier round, so the program cannot deadlock (and :func:`check_msccl_xml` proves it).

Longer than ~400 lines on purpose: the exporter and the checker that replays its XML
are two halves of one format contract (every attribute written is one read back), kept
side by side so a change to one is seen next to the other.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

from mccl_opt.errors import ScheduleError
from mccl_opt.files import check_xml
from mccl_opt.schedule import Schedule

from .program import INP, OUT, STAGE, chunk_denominator, compile_schedule

__all__ = ["to_msccl_xml", "write_msccl_xml", "check_msccl_xml", "MscclCheck",
           "MAX_COUNT", "MAX_STEPS", "MAX_THREAD_BLOCKS", "MAX_CHANNELS", "MAX_GPUS", "MAX_BUFFER_CHUNKS"]

MAX_COUNT = 72            # msccl-executor-nccl: cnt < MSCCL_MAX_COUNT
MAX_STEPS = 256           # steps per threadblock
MAX_THREAD_BLOCKS = 216   # threadblocks per GPU
MAX_TB_PER_CHANNEL = 32   # send (or receive) peers per channel
MAX_CHANNELS = 32
MAX_GPUS = 1 << 16        # ranks of an algorithm checked
MAX_BUFFER_CHUNKS = 1 << 22   # chunks of all GPUs' buffers together (the replay holds a label each)
BUF = {INP: "i", OUT: "o", STAGE: "s"}
ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
              "outofplace", "minBytes", "maxBytes")
GPU_ATTRS = ("id", "i_chunks", "o_chunks", "s_chunks")
TB_ATTRS = ("id", "send", "recv", "chan")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps",
              "hasdep")


# ----------------------------------------------------------------------------- export
def _chunks_per_block(schedule: Schedule) -> int:
    groups: dict = defaultdict(list)
    for c in schedule.chunks:
        groups[(c.src, getattr(c, "dst", None))].append(c.share)
    c_total = 1
    for key, shares in sorted(groups.items()):
        k = chunk_denominator(shares, MAX_COUNT - 1)
        if k is None:
            raise ScheduleError(f"block {key[0]}{' -> ' + key[1] if key[1] else ''}: shares "
                                f"{shares} are not multiples of 1/K for any K < {MAX_COUNT}; "
                                "MSCCL counts whole chunks - export a rounded schedule")
        c_total = c_total * k // math.gcd(c_total, k)
    if c_total >= MAX_COUNT:
        raise ScheduleError(f"the schedule needs {c_total} chunks per block but MSCCL allows "
                            f"at most {MAX_COUNT - 1}; re-synthesize with fewer max_chunks")
    return c_total


@dataclass
class _Tb:
    send: int
    recv: int
    chan: int
    steps: list[dict] = field(default_factory=list)


def to_msccl_xml(schedule: Schedule, *, nchannels: int = 1, proto: str = "Simple",
                 min_bytes: int = 0, max_bytes: int = 1 << 40, name: str | None = None) -> str:
    """Return the MSCCL XML algorithm for ``schedule`` (AllGather or AllToAll).

    Transfers are spread over ``nchannels`` channels round-robin per connection.
    Raises :class:`ScheduleError` if the schedule exceeds MSCCL's limits.
    """
    if not 1 <= nchannels <= MAX_CHANNELS:
        raise ScheduleError(f"nchannels must be in 1..{MAX_CHANNELS}, got {nchannels}")
    if proto not in ("Simple", "LL", "LL128"):
        raise ScheduleError(f"proto must be Simple, LL or LL128, got {proto!r}")
    c = _chunks_per_block(schedule)
    prog = compile_schedule(schedule, c, 1)
    n = schedule.num_gpus
    tbs: list[dict[tuple, _Tb]] = [dict() for _ in range(n)]

    def tb(g: int, send: int, recv: int, chan: int) -> tuple[int, _Tb]:
        key = (send, recv, chan)
        if key not in tbs[g]:
            tbs[g][key] = _Tb(send, recv, chan)
        return list(tbs[g]).index(key), tbs[g][key]

    # copy threadblock first (id 0) so local copies never wait on the network
    writer: list[dict[tuple[int, int], tuple[int, int]]] = [dict() for _ in range(n)]
    for g, rp in enumerate(prog.ranks):
        tid, t = tb(g, -1, -1, 0)
        for s, d in rp.copies:
            if s.length:
                _add_step(t, "cpy", s.buf, s.offset, d.buf, d.offset, s.length)
                for x in range(d.length):
                    writer[g][(d.buf, d.offset + x)] = (tid, len(t.steps) - 1)
    sent = defaultdict(int)
    for m in sorted(prog.messages, key=lambda m: (m.round, m.src, m.dst)):
        for s, d in zip(m.src_segs, m.dst_segs):
            for lo, hi in _split_by_writer(writer[m.src], s.buf, s.offset, s.length):
                chan = sent[(m.src, m.dst)] % nchannels
                sent[(m.src, m.dst)] += 1
                stid, st = tb(m.src, m.dst, -1, chan)
                dep = writer[m.src].get((s.buf, s.offset + lo))
                _add_step(st, "s", s.buf, s.offset + lo, s.buf, s.offset + lo, hi - lo, dep)
                rtid, rt = tb(m.dst, -1, m.src, chan)
                _add_step(rt, "r", d.buf, d.offset + lo, d.buf, d.offset + lo, hi - lo)
                for x in range(lo, hi):
                    writer[m.dst][(d.buf, d.offset + x)] = (rtid, len(rt.steps) - 1)
    for g in range(n):
        for t in tbs[g].values():
            for step in t.steps:
                if step["depid"] >= 0:
                    list(tbs[g].values())[step["depid"]].steps[step["deps"]]["hasdep"] = 1
    _check_limits(tbs, nchannels)
    return _render(schedule, prog, tbs, c, nchannels, proto, min_bytes, max_bytes, name)


def _split_by_writer(writer: dict, buf: int, offset: int, length: int) -> list[tuple[int, int]]:
    """Cut ``[0, length)`` where the step that wrote the source chunks changes."""
    cuts, prev = [0], None
    for x in range(length):
        w = writer.get((buf, offset + x)) if buf != INP else None
        if x and w != prev:
            cuts.append(x)
        prev = w
    cuts.append(length)
    return list(zip(cuts, cuts[1:]))


def _add_step(t: _Tb, kind: str, sbuf: int, soff: int, dbuf: int, doff: int, cnt: int,
              dep: tuple[int, int] | None = None) -> None:
    t.steps.append({"s": len(t.steps), "type": kind, "srcbuf": BUF[sbuf], "srcoff": soff,
                    "dstbuf": BUF[dbuf], "dstoff": doff, "cnt": cnt,
                    "depid": dep[0] if dep else -1, "deps": dep[1] if dep else -1,
                    "hasdep": 0})


def _check_limits(tbs: list[dict], nchannels: int) -> None:
    for g, blocks in enumerate(tbs):
        if len(blocks) > MAX_THREAD_BLOCKS:
            raise ScheduleError(f"GPU {g} needs {len(blocks)} threadblocks (MSCCL allows "
                                f"{MAX_THREAD_BLOCKS}); use fewer channels")
        for t in blocks.values():
            if len(t.steps) > MAX_STEPS:
                raise ScheduleError(f"GPU {g}: a threadblock needs {len(t.steps)} steps (MSCCL "
                                    f"allows {MAX_STEPS}); export with more channels")
        for chan in range(nchannels):
            for side in (0, 1):
                peers = [k[side] for k in blocks if k[2] == chan and k[side] >= 0]
                if len(peers) > MAX_TB_PER_CHANNEL:
                    raise ScheduleError(f"GPU {g} channel {chan}: {len(peers)} peers; MSCCL "
                                        f"allows {MAX_TB_PER_CHANNEL} per channel - add channels")


def _render(schedule: Schedule, prog, tbs: list[dict], c: int, nchannels: int, proto: str,
            min_bytes: int, max_bytes: int, name: str | None) -> str:
    n = schedule.num_gpus
    i_chunks = c if schedule.collective == "allgather" else n * c
    o_chunks = n * c
    algo = {"name": name or f"mccl-{schedule.collective}-{schedule.topology}-v{schedule.version}",
            "proto": proto, "nchannels": nchannels, "nchunksperloop": max(i_chunks, o_chunks),
            "ngpus": n, "coll": schedule.collective, "inplace": 0, "outofplace": 1,
            "minBytes": min_bytes, "maxBytes": max_bytes}
    lines = [f"<algo {_attrs(algo)}>"]
    for g in range(n):
        gpu = {"id": g, "i_chunks": i_chunks, "o_chunks": o_chunks,
               "s_chunks": prog.ranks[g].stage_numel}
        lines.append(f"  <gpu {_attrs(gpu)}>")
        for tid, t in enumerate(tbs[g].values()):
            lines.append(f"    <tb {_attrs({'id': tid, 'send': t.send, 'recv': t.recv, 'chan': t.chan})}>")
            lines += [f"      <step {_attrs(s)}/>" for s in t.steps]
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def _attrs(d: dict) -> str:
    return " ".join(f'{k}="{v}"' for k, v in d.items())


def write_msccl_xml(schedule: Schedule, path: str | Path, **kwargs) -> None:
    """Write :func:`to_msccl_xml` to ``path`` after checking it with the replay checker."""
    text = to_msccl_xml(schedule, **kwargs)
    check_msccl_xml(text)
    Path(path).write_text(text)


# ---------------------------------------------------------------------------- checker
@dataclass(frozen=True)
class MscclCheck:
    """Result of a successful replay."""

    collective: str
    ngpus: int
    threadblocks: int
    steps: int
    transfers: int


def _int(el: ET.Element, attr: str, where: str) -> int:
    """An integer attribute in ASCII digits, as the executor's C parser reads it (Python's
    ``int`` also takes other scripts' digits and spaces)."""
    if attr not in el.attrib:
        raise ScheduleError(f"{where}: missing attribute '{attr}'")
    text = el.attrib[attr]
    if not re.fullmatch(r"-?[0-9]{1,20}", text):
        raise ScheduleError(f"{where}: attribute '{attr}' must be an integer, got {text[:40]!r}")
    return int(text)


def _need(el: ET.Element, attrs: tuple[str, ...], where: str) -> None:
    for a in attrs:
        if a not in el.attrib:
            raise ScheduleError(f"{where}: missing attribute '{a}' (msccl-executor-nccl "
                                "requires it and would silently skip this algorithm)")


def check_msccl_xml(text: str, fifo_capacity: int = 1, *,
                    hops: dict[tuple[int, int], list[tuple[int, int]]] | None = None) -> MscclCheck:
    """Replay MSCCL XML symbolically and prove it delivers the collective without deadlock.

    Checks the attributes the msccl-executor-nccl parser requires and its limits, then
    runs every threadblock as a sequential process: steps in order, a step waits for its
    ``depid``/``deps`` step, a send waits for room in the FIFO of its
    (sender, receiver, channel) connection (``fifo_capacity`` messages: the strictest
    buffering), a receive for a message there, whose chunk count must match.  Buffers
    hold symbolic chunk labels; reading a chunk nobody wrote is an error.  At the end
    every FIFO must be empty and every output chunk must hold the right label.
    Raises :class:`ScheduleError` naming the first violation.  ``hops``, when given, is
    filled with every GPU-to-GPU move of each input chunk ``(source GPU, index)`` in replay
    order (``(from, to)`` ranks), what :mod:`mccl_opt.interop.msccl_xml` reads the
    algorithm's trees and paths from.
    """
    check_xml(text, "MSCCL XML", ScheduleError)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ScheduleError(f"MSCCL XML is not well-formed: {exc}") from None
    if root.tag != "algo":
        raise ScheduleError(f"top element must be <algo>, got <{root.tag}>")
    _need(root, ALGO_ATTRS, "<algo>")
    coll = root.attrib["coll"]
    if coll not in ("allgather", "alltoall"):
        raise ScheduleError(f"<algo> coll={coll!r}: the checker knows allgather and alltoall")
    if root.attrib["proto"] not in ("Simple", "LL", "LL128"):
        raise ScheduleError(f"<algo> proto={root.attrib['proto']!r} is not Simple/LL/LL128")
    n = _int(root, "ngpus", "<algo>")
    nch = _int(root, "nchannels", "<algo>")
    for a in ("nchunksperloop", "inplace", "outofplace", "minBytes", "maxBytes"):
        _int(root, a, "<algo>")
    if not 1 <= nch <= MAX_CHANNELS:
        raise ScheduleError(f"<algo> nchannels={nch} outside 1..{MAX_CHANNELS}")
    gpus = root.findall("gpu")
    if not 1 <= n <= MAX_GPUS or len(gpus) != n:
        raise ScheduleError(f"<algo> ngpus={n} but {len(gpus)} <gpu> elements (at most {MAX_GPUS})")
    ids = sorted(_int(g, "id", "<gpu>") for g in gpus)
    if ids != list(range(n)):
        raise ScheduleError(f"<gpu> ids {ids} must be exactly 0..{n - 1} (ngpus={n})")

    bufs: dict[int, dict[str, list]] = {}
    procs: list[tuple[int, int, int, int, int, list[dict]]] = []   # gpu, tb, send, recv, chan, steps
    n_chunks, total = {}, 0
    for g_el in sorted(gpus, key=lambda e: int(e.attrib["id"])):
        g = int(g_el.attrib["id"])
        where = f"<gpu id={g}>"
        _need(g_el, GPU_ATTRS, where)
        ic, oc, sc = (_int(g_el, a, where) for a in ("i_chunks", "o_chunks", "s_chunks"))
        total += max(ic, 0) + max(oc, 0) + max(sc, 0)
        if min(ic, oc, sc) < 0 or total > MAX_BUFFER_CHUNKS:
            raise ScheduleError(f"{where}: i_chunks={ic} o_chunks={oc} s_chunks={sc}: each >= 0, and at most "
                                f"{MAX_BUFFER_CHUNKS} chunks in all GPUs' buffers together")
        n_chunks[g] = (ic, oc)
        bufs[g] = {"i": [(g, k) for k in range(ic)], "o": [None] * oc, "s": [None] * sc}
        tb_ids, seen = [], set()
        for t_el in g_el.findall("tb"):
            _need(t_el, TB_ATTRS, f"{where} <tb>")
            tid, send, recv, chan = (_int(t_el, a, f"{where} <tb>") for a in TB_ATTRS)
            w = f"{where} <tb id={tid}>"
            if send == g or recv == g or not (-1 <= send < n and -1 <= recv < n):
                raise ScheduleError(f"{w}: peers send={send} recv={recv} must be other GPUs or -1")
            if not 0 <= chan < nch:
                raise ScheduleError(f"{w}: chan={chan} outside 0..{nch - 1}")
            for side, peer in (("send", send), ("recv", recv)):
                if peer >= 0 and (side, peer, chan) in seen:
                    raise ScheduleError(f"{w}: a second threadblock with {side} peer {peer} on "
                                        f"channel {chan}; each connection has one threadblock")
                seen.add((side, peer, chan))
            steps = []
            for i, s_el in enumerate(t_el.findall("step")):
                sw = f"{w} <step {i}>"
                _need(s_el, STEP_ATTRS, sw)
                st = {a: (s_el.attrib[a] if a in ("type", "srcbuf", "dstbuf") else _int(s_el, a, sw))
                      for a in STEP_ATTRS}
                if st["s"] != i:
                    raise ScheduleError(f"{sw}: s={st['s']} but steps must be numbered 0, 1, ...")
                if not 0 < st["cnt"] < MAX_COUNT:
                    raise ScheduleError(f"{sw}: cnt={st['cnt']} outside 1..{MAX_COUNT - 1}")
                if st["type"] not in ("s", "r", "rcs", "cpy", "nop"):
                    raise ScheduleError(f"{sw}: type {st['type']!r} is not a data-movement step")
                if st["type"] in ("s", "rcs") and send < 0 or st["type"] in ("r", "rcs") and recv < 0:
                    raise ScheduleError(f"{sw}: a {st['type']!r} step in a threadblock without "
                                        "the matching send/recv peer")
                if st["hasdep"] not in (0, 1):
                    raise ScheduleError(f"{sw}: hasdep must be 0 or 1")
                steps.append(st)
            if len(steps) > MAX_STEPS:
                raise ScheduleError(f"{w}: {len(steps)} steps (max {MAX_STEPS})")
            tb_ids.append(tid)
            procs.append((g, tid, send, recv, chan, steps))
        if sorted(tb_ids) != list(range(len(tb_ids))):
            raise ScheduleError(f"{where}: threadblock ids {sorted(tb_ids)} must be 0..k without gaps")
        if len(tb_ids) > MAX_THREAD_BLOCKS:
            raise ScheduleError(f"{where}: {len(tb_ids)} threadblocks (max {MAX_THREAD_BLOCKS})")

    index = {(p[0], p[1]): p for p in procs}
    for g, tid, _, _, _, steps in procs:
        for st in steps:
            if st["depid"] >= 0:
                dep = index.get((g, st["depid"]))
                if dep is None or not 0 <= st["deps"] < len(dep[5]):
                    raise ScheduleError(f"<gpu id={g}> <tb id={tid}> <step {st['s']}>: dependency "
                                        f"on missing step {st['depid']}:{st['deps']}")
                if not dep[5][st["deps"]]["hasdep"]:
                    raise ScheduleError(f"<gpu id={g}> <tb id={st['depid']}> <step {st['deps']}> "
                                        "is a dependency but has hasdep=0 (it would never signal)")
    transfers = _replay(procs, bufs, fifo_capacity, hops)
    _check_outputs(coll, n, bufs, n_chunks)
    return MscclCheck(coll, n, len(procs), sum(len(p[5]) for p in procs), transfers)


def _replay(procs: list, bufs: dict, cap: int, hops: dict | None) -> int:
    pc = {(p[0], p[1]): 0 for p in procs}
    fifo: dict[tuple[int, int, int], deque] = defaultdict(deque)
    transfers, progress = 0, True

    def read(g: int, buf: str, off: int, cnt: int, where: str) -> list:
        data = list(_slot(bufs, g, buf, off, cnt, where))
        if any(x is None for x in data):
            raise ScheduleError(f"{where}: reads {buf}[{off}:{off + cnt}] before it was written")
        return list(data)

    while progress:
        progress = False
        for g, tid, send, recv, chan, steps in procs:
            while pc[(g, tid)] < len(steps):
                st = steps[pc[(g, tid)]]
                where = f"<gpu id={g}> <tb id={tid}> <step {st['s']}>"
                if st["depid"] >= 0 and pc[(g, st["depid"])] <= st["deps"]:
                    break
                kind, cnt = st["type"], st["cnt"]
                out_q = fifo[(g, send, chan)] if kind in ("s", "rcs") else None
                in_q = fifo[(recv, g, chan)] if kind in ("r", "rcs") else None
                if (out_q is not None and len(out_q) >= cap) or (in_q is not None and not in_q):
                    break
                if kind == "s":
                    out_q.append(read(g, st["srcbuf"], st["srcoff"], cnt, where))
                elif kind in ("r", "rcs"):
                    msg = in_q.popleft()
                    if len(msg) != cnt:
                        raise ScheduleError(f"{where}: receives {cnt} chunks but GPU {recv} sent "
                                            f"{len(msg)} on channel {chan}")
                    _slot(bufs, g, st["dstbuf"], st["dstoff"], cnt, where)[:] = msg
                    if hops is not None:
                        for label in msg:
                            hops.setdefault(label, []).append((recv, g))
                    if kind == "rcs":
                        out_q.append(list(msg))
                    transfers += 1
                elif kind == "cpy":
                    data = read(g, st["srcbuf"], st["srcoff"], cnt, where)
                    _slot(bufs, g, st["dstbuf"], st["dstoff"], cnt, where)[:] = data
                pc[(g, tid)] += 1
                progress = True
    stuck = [f"gpu {g} tb {t} at step {pc[(g, t)]}" for g, t, *_ , steps in procs
             if pc[(g, t)] < len(steps)]
    if stuck:
        raise ScheduleError("deadlock: no threadblock can progress; stuck: " + ", ".join(stuck[:8]))
    leftover = [k for k, q in fifo.items() if q]
    if leftover:
        raise ScheduleError(f"sends without a matching receive on (src, dst, chan) {leftover[:8]}")
    return transfers


def _slot(bufs: dict, g: int, buf: str, off: int, cnt: int, where: str):
    if buf not in ("i", "o", "s"):
        raise ScheduleError(f"{where}: unknown buffer {buf!r} (use i, o or s)")
    arr = bufs[g][buf]
    if off < 0 or off + cnt > len(arr):
        raise ScheduleError(f"{where}: {buf}[{off}:{off + cnt}] is outside the {len(arr)} "
                            f"chunks declared for GPU {g}")
    return _Slice(arr, off, cnt)


class _Slice:
    """A writable window ``arr[off:off+cnt]`` (``[:] =`` assigns in place)."""

    def __init__(self, arr: list, off: int, cnt: int) -> None:
        self.arr, self.off, self.cnt = arr, off, cnt

    def __iter__(self):
        return iter(self.arr[self.off:self.off + self.cnt])

    def __setitem__(self, key: slice, values: list) -> None:
        self.arr[self.off:self.off + self.cnt] = list(values)


def _check_outputs(coll: str, n: int, bufs: dict, n_chunks: dict) -> None:
    for d in range(n):
        ic, oc = n_chunks[d]
        c = oc // n
        if oc != n * c or (coll == "allgather" and ic != c) or (coll == "alltoall" and ic != oc):
            raise ScheduleError(f"<gpu id={d}>: i_chunks={ic}, o_chunks={oc} do not fit a "
                                f"{coll} over {n} GPUs")
        for s in range(n):
            for k in range(c):
                want = (s, k) if coll == "allgather" else (s, d * c + k)
                got = bufs[d]["o"][s * c + k]
                if got != want:
                    raise ScheduleError(f"GPU {d} output chunk {s * c + k} holds {got}, expected "
                                        f"input chunk {want[1]} of GPU {want[0]}")
