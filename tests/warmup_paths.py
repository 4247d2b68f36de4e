"""Solves on every path, after the warm-up, with every new kernel signature recorded.

Run as ``python -m tests.warmup_paths`` in a fresh process (``tests/test_warmup.py``
points ``NUMBA_CACHE_DIR`` at an empty folder first): it runs
:func:`mccl_runtime.warmup.load_kernels`, then solves on fabrics the warm-up does not use
(other sizes, two segments, shared aggregation, leaf-spine, irregular and hand-made
fabrics), on every path: AllToAll cold, warm in memory, from a file and restored, warm from
a warm result (a chain of events), local, step bounds, time-limited; AllGather ForestColl
cold and warm the same ways, time-limited, unbalanced switches (weaker directions, balanced
restriction, general method), step-aware; the validator, the simulator and the
controller's closed loop.  It prints one JSON object: ``misses`` (every kernel dispatched
with a signature it had not been given in this process, compiled or loaded from the
cache: a dispatcher-level hook) and ``compiles`` (numba's ``"numba:compile"`` events: a
real compilation), each a list of ``"module.kernel (argument types)"``, the seconds of
the warm-up and of the solves, and the number of paths run.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Callable, Iterator

from numba.core import event, sigutils
from numba.core.dispatcher import Dispatcher

_misses: list[str] = []
_compiles: list[str] = []


def _name(dispatcher: Dispatcher, args) -> str:
    fn = dispatcher.py_func
    return f"{fn.__module__}.{fn.__qualname__} {tuple(str(a) for a in args)}"


def _record_new_signatures() -> None:
    """Record every dispatch of a signature a kernel has not been given yet (the hook
    wraps ``Dispatcher.compile``, which numba calls only then: to load from the cache or
    to compile) and every compilation (numba's event)."""
    compile_for = Dispatcher.compile

    def compile(self, sig):
        args, _ = sigutils.normalize_signature(sig)
        if tuple(args) not in self.overloads:
            _misses.append(_name(self, args))
        return compile_for(self, sig)

    class Compiles(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            _compiles.append(_name(ev.data["dispatcher"], ev.data["args"]))

        def on_end(self, ev: event.Event) -> None:
            pass

    Dispatcher.compile = compile
    event.register("numba:compile", Compiles())


def _topology(nodes: list[tuple[str, str]], links: list[tuple[str, str, float]]):
    import mccl_opt as mo

    return mo.Topology.from_dict({
        "format": "mccl-topology/1", "name": "hand-made",
        "nodes": [{"id": i, "kind": k} for i, k in nodes],
        "links": [{"src": a, "dst": b, "capacity_gbps": c, "latency_us": 1.0} for a, b, c in links]})


def _three_spines():
    """Three spines, three GPUs, unbalanced switches (tests/test_allgather_general.py)."""
    return _topology(
        [("sp0", "switch"), ("sp1", "switch"), ("sp2", "switch"), ("h0g1", "gpu"), ("h1g0", "gpu"),
         ("h1g1", "gpu")],
        [("h0g1", "sp1", 400.), ("sp1", "h0g1", 100.), ("h1g0", "sp1", 100.), ("sp1", "h1g0", 100.),
         ("h1g1", "sp2", 18.), ("sp2", "h1g1", 18.), ("sp0", "sp1", 200.), ("sp1", "sp0", 200.),
         ("sp1", "sp2", 800.), ("sp2", "sp1", 100.), ("sp2", "sp0", 100.)])


def paths() -> Iterator[tuple[str, Callable[[], object]]]:
    """(label, solve) for every path, on fabrics the warm-up does not use (each is run
    before the next is made, so the lambdas may read the loop variables)."""
    import mccl_opt as mo
    from instances import fabrics, fail1, fail2, hpn
    from instances.aggregation import leaf_spine, shared_aggregation, superpod
    from mccl_opt import restore_warm_state
    from mccl_opt.allgather.general.method import solve_general
    from mccl_opt.schedule import Schedule
    from mccl_opt.sim import simulate

    def on_file(schedule: Schedule) -> Schedule:
        return Schedule.from_dict(json.loads(json.dumps(schedule.to_dict())))

    def one_way(topo):
        return topo.with_capacity(src="s1h1g1", dst="s1tor1", gbps=75.0, both_directions=False)

    healthy = hpn(2, 2, 4)
    for name, solve in (("alltoall", mo.solve_alltoall), ("allgather", mo.solve_allgather)):
        for k in (10, None):
            previous = solve(healthy, max_chunks=k)
            for fail in (fail1, fail2, one_way):
                topo = fail(healthy, 5) if fail is not one_way else one_way(healthy)
                yield f"{name} K={k} {fail.__name__} cold", lambda: solve(topo, max_chunks=k)
                for how, warm in (("in memory", previous), ("from a file", on_file(previous)),
                                  ("restored", restore_warm_state(on_file(previous), healthy))):
                    yield f"{name} K={k} {fail.__name__} warm {how}", \
                        lambda: solve(topo, warm=warm, max_chunks=k)
            # a chain of events (the closed loop's ``further``): warm from a warm result
            halved = healthy.with_capacity(src="s1h0g2", dst="s1tor2", gbps=200.0)
            yield f"{name} K={k} warm from a warm result", lambda: solve(
                halved.with_capacity(src="s1h0g2", dst="s1tor2", gbps=50.0),
                warm=solve(halved, warm=previous, max_chunks=k), max_chunks=k)
        for seed in range(6):
            yield f"{name} irregular({seed})", lambda: solve(fabrics.irregular(seed))
        for fabric in (shared_aggregation(2, 2, 4), leaf_spine(2, 2, 4)):
            base = solve(fabric)
            for k in (10, None):
                yield f"{name} {fabric.name} K={k}", lambda: solve(fabric, max_chunks=k)
                yield f"{name} {fabric.name} fail2 warm K={k}", \
                    lambda: solve(fail2(fabric, 3), warm=base, max_chunks=k)
            yield f"{name} {fabric.name} fail2 time limit", lambda: solve(fail2(fabric, 3), time_limit=30.0)
        for fabric in (fabrics.dgx(), fabrics.ring(6), fabrics.ring(5, bidirectional=False),
                       _three_spines()):
            for k in (10, None):
                yield f"{name} {fabric.name} K={k}", lambda: solve(fabric, max_chunks=k)
        schedule = solve(fail2(healthy))
        yield f"{name} validate", lambda: mo.validate(fail2(healthy), schedule)
        yield f"{name} simulate", lambda: simulate(fail2(healthy), schedule, 2**22)
        yield f"{name} simulate fluid", lambda: simulate(fail2(healthy), schedule, 2**22, fluid=True)
    yield "alltoall min steps", lambda: mo.solve_alltoall(hpn(1, 3, 4), max_steps="min")
    yield "alltoall 3 steps", lambda: mo.solve_alltoall(fail2(hpn(1, 3, 4)), max_steps=3)
    yield "alltoall time limit", lambda: mo.solve_alltoall(hpn(1, 3, 4), time_limit=30.0)
    yield "alltoall time limit passed", lambda: mo.solve_alltoall(hpn(1, 3, 4), time_limit=1e-6)
    yield "allgather time limit", lambda: mo.solve_allgather(fail2(hpn(1, 3, 4)), time_limit=30.0)
    yield "allgather time limit passed", lambda: mo.solve_allgather(fail2(hpn(1, 3, 4)), time_limit=1e-6)
    yield "allgather time limit, 80 GPUs (the GPU line)", \
        lambda: mo.solve_allgather(hpn(1, 10, 8), time_limit=1e-6)
    # ForestColl's greedy packing (both orders) on the exact path: a SuperPOD-like 2x2x8
    # with a NIC uplink at 1 % one way (the fuzz compiled it inside this solve: 19 s)
    pod = superpod(2, 2, 8).with_capacity(src="u1h0g1", dst="u1leaf0", gbps=4.0,
                                          both_directions=False)
    yield "allgather superpod one-way NIC K=None", lambda: mo.solve_allgather(pod, max_chunks=None)
    lane = hpn(1, 3, 4).with_capacity({("s0h1g1", "s0h1nvs"): 300.0})
    yield "allgather balanced restriction", lambda: mo.solve_allgather(lane, max_chunks=None)
    odd = healthy.with_capacity(src="s0h0g1", dst="s0h0nvs", gbps=594.087) \
        .with_capacity(src="s1h1g2", dst="s1tor2", gbps=445.565)
    yield "allgather general method", lambda: mo.solve_allgather(odd, max_chunks=None)
    past = shared_aggregation(2, 2, 4).with_capacity(src="s0h0g0", dst="s0tor0", gbps=123.457)
    yield "allgather balanced past the exact tree limit (seeded general method)", \
        lambda: mo.solve_allgather(past, max_chunks=None)
    from mccl_opt.allgather.canonical import canonical
    from mccl_opt.allgather.general.quotient import solve_quotient

    quot = canonical(shared_aggregation(2, 3, 4).with_capacity(
        src="s0h0g0", dst="s0tor0", gbps=150.8, both_directions=False))
    yield "allgather symmetric quotient (the chain's at >= 128 GPUs)", lambda: solve_quotient(quot)
    yield "allgather general method warm", \
        lambda: solve_general(fail2(healthy), warm=solve_general(healthy), max_chunks=None)
    yield "allgather step-aware", lambda: mo.solve_allgather(hpn(1, 3, 4), step_aware=True)
    yield "allgather step-aware fail1", lambda: mo.solve_allgather(fail1(hpn(1, 3, 4)), step_aware=True)
    from mccl_runtime.loop import LoopConfig, run_loop

    for collective in ("allgather", "alltoall"):
        yield f"closed loop {collective}", \
            lambda: run_loop(LoopConfig(shape="1x3x4", collective=collective, duration_ms=60.0))


def main(verbose: bool = False) -> None:
    _record_new_signatures()
    start = time.perf_counter()
    from mccl_runtime.warmup import load_kernels

    load_kernels()
    warmup_s = time.perf_counter() - start
    del _misses[:], _compiles[:]
    start, count, labelled = time.perf_counter(), 0, 0
    for label, run in paths():
        began = time.perf_counter()
        run()
        if verbose:
            print(f"{time.perf_counter() - began:7.2f} s  {label}", file=sys.stderr, flush=True)
        _misses[labelled:] = [f"{label} (or its setup): {m}" for m in _misses[labelled:]]
        labelled, count = len(_misses), count + 1
    print(json.dumps({"misses": _misses, "compiles": _compiles, "paths": count,
                      "warmup_s": warmup_s, "paths_s": time.perf_counter() - start}))


if __name__ == "__main__":
    main(verbose="-v" in sys.argv)
