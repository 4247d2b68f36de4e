"""The exit hook of mccl_opt.process_exit: objects frozen at exit only once numba is
loaded, the process's own exit handlers and files unaffected, MCCL_EXIT_GC=1 opting out."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

EXIT_WITH_A_CYCLE = """
    import atexit
    import numpy as np
    import mccl_opt
    from mccl_opt.alltoall import _segments
    _segments.column_sums(np.array([0, 1]), np.array([0]), np.ones(1))  # numba loaded
    plain = open({plain!r}, "w"); plain.write("plain")                    # never closed
    class Cycle:
        pass
    c = Cycle(); c.self = c; c.handle = open({cyclic!r}, "w"); c.handle.write("cyclic")
    atexit.register(lambda: print("handler ran"))
"""


def _run(code: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_freezes_only_after_numba_is_loaded():
    out = _run("""
        import gc
        import mccl_opt
        from mccl_opt import process_exit
        process_exit._freeze_if_numba_loaded()
        before = gc.get_freeze_count()
        import numba
        process_exit._freeze_if_numba_loaded()
        print(before, gc.get_freeze_count() > 1000)
    """)
    assert out.split() == ["0", "True"]


def test_exit_runs_handlers_and_flushes_files(tmp_path):
    plain, cyclic = tmp_path / "plain.txt", tmp_path / "cyclic.txt"
    out = _run(EXIT_WITH_A_CYCLE.format(plain=str(plain), cyclic=str(cyclic)))
    assert out.strip() == "handler ran"
    assert plain.read_text() == "plain"
    assert cyclic.read_text() == ""        # documented: a cycle alive at exit is not collected


def test_opt_out_keeps_the_full_exit_collection(tmp_path):
    plain, cyclic = tmp_path / "plain.txt", tmp_path / "cyclic.txt"
    _run(EXIT_WITH_A_CYCLE.format(plain=str(plain), cyclic=str(cyclic)), MCCL_EXIT_GC="1")
    assert cyclic.read_text() == "cyclic"
