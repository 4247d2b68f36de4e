"""Spans of sinks for :class:`~.maxflow.FlowNetwork`'s scans under a time limit.

A scan over sinks is one compiled call, ~1 s at 1024 GPUs, which no clock check reaches;
under a limit it runs span by span with :func:`mccl_opt.anytime.check` before each
(docs/allgather_history.md, "Checks before every span, and the steps past a deadline").
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

from mccl_opt import anytime

if TYPE_CHECKING:
    from .maxflow import FlowNetwork

__all__ = ["SPAN_CPU_S", "SWEEP_WORK", "spans"]

#: sinks times arcs per compiled call of a scan under a time limit (:func:`spans`):
#: each sink's flow repair searches the residual network, so a call's time follows the
#: arcs: 32 sinks of HPN 8x16x8 (1024 GPUs, ~8,700 links) took ~12 ms CPU, and 32 of a
#: 1024-GPU logical graph 0.2 s, so spans of ``SWEEP_WORK // arcs`` sinks (at least 1)
SWEEP_WORK = 300_000
#: ... and at most this many CPU seconds, by the CPU per sink the network's last span
#: took (a span of a logical graph's sweep took 62 ms at 512 GPUs: its sinks cost more
#: than their arcs say)
SPAN_CPU_S = 0.01


def spans(size: int, net: "FlowNetwork") -> Iterator[tuple[int, int]]:
    """``(lo, hi)`` spans of a scan over ``size`` sinks of ``net``: one without a time
    limit; under one, :data:`SWEEP_WORK` ``// arcs`` sinks at a time (at least 1), fewer
    where the network's last span took more than :data:`SPAN_CPU_S` CPU seconds for as
    many (``net.span_sinks``, learned span by span and kept for the network's next scan),
    the clock checked before each span, the first included
    (:func:`mccl_opt.anytime.check`): a whole scan is one compiled call of up to ~1 s
    at 1024 GPUs, which no check point reached, and a scan begun past the limit ran
    its first span, 10-60 ms CPU, before the first check (docs/allgather_history.md, "Steps no
    check point reached", "Checks before every span")."""
    if anytime.current() is None:
        yield 0, size
        return
    most = max(1, SWEEP_WORK // max(net.num_arcs, 1))
    lo = 0
    while True:
        anytime.check("a rooted sweep (max-flows over the GPUs)")
        hi = min(lo + min(most, net.span_sinks), size)
        began = time.thread_time()
        yield lo, hi
        spent = time.thread_time() - began
        if hi > lo and spent > 0:
            net.span_sinks = max(1, min(most, int((hi - lo) * SPAN_CPU_S / spent)))
        if hi >= size:
            return
        lo = hi
