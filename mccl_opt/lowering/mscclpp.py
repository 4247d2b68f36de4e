"""MSCCL++ execution-plan export of a schedule (docs/interop.md "MSCCL++ execution plans").

Target: the plan JSON that MSCCL++'s executor reads since its DSL rewrite
(``mscclpp.language.CollectiveProgram.to_json``; parsed by ``ExecutionPlan`` in
``src/executor/execution_plan.cc``): top-level ``name``, ``collective``, ``protocol``,
``inplace``, ``reuse_resources``, ``num_threads_per_block``, ``use_double_scratch_buffer``,
``buffer_alignment``, ``min_message_size``, ``max_message_size`` and ``gpus``; per GPU
``id``, ``input_chunks``, ``output_chunks``, ``scratch_chunks``, ``channels``
(``channel_type`` + ``connected_to``), ``remote_buffers`` (``rank``, ``type``,
``access_channel_types``), ``semaphores`` and ``threadblocks`` (``id``, ``ops``,
``channels`` = ``channel_type`` + ``channel_ids``, ``remote_buffer_refs``).  Ops used:
``copy``, ``put`` (``src_buff`` ``{type, index, size}`` to ``dst_buff``
``{buffer_id, index, size}``), ``signal``, ``wait`` and ``nop`` (a ``__syncthreads``).
The older camelCase plans (``inputChunks``, ``connectedTo``) are not written.

Lowering (paper §3.3 rounds, the same program as the MSCCL XML export): the schedule is
compiled by :mod:`.program` with ``C`` chunks per block; every message ``u -> v`` of a
round is one or more ``put`` ops by ``u``'s threadblock for peer ``v`` (push: the sender
writes into ``v``'s output or scratch buffer).  Synchronisation, per GPU ``u``:

* threadblock 0 does the local copies and waits for every incoming message that ``u``
  does not forward (so the kernel ends only once its output is complete);
* threadblock ``1 + i`` sends to ``u``'s ``i``-th peer; before a put it waits for each
  incoming message whose data the put forwards.  A waiting threadblock ``q`` of ``u``
  and a sender ``w`` share a channel pair ``(w, u, q)``; ``w`` signals it once per message
  ``q`` needs, after the puts (and a ``nop``), and ``q`` waits on it cumulatively (the
  ``k``-th wait is the ``k``-th signal), then ``nop`` before reading;
* first of all each threadblock signals every pair it waits on, and each sender waits on
  every pair it signals (a handshake: ``v``'s previous run has finished with its buffers
  before ``w`` writes into them), so signals and waits balance on every pair.

A channel pair is the ``k``-th channel of ``u`` to ``v`` and the ``k``-th of ``v`` to ``u``
(how the executor builds semaphores per connection, in list order); every GPU lists its
channels in one global order of pairs so the ``k``-th ones match.  ``channel_type``
``memory`` (CUDA IPC, one node) or ``port`` (proxy: IB or IPC) per pair; with
``gpus_per_node`` the pairs inside a node are memory channels and the others port.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from mccl_opt.errors import ScheduleError
from mccl_opt.schedule import Schedule

from .program import INP, OUT, STAGE, Message, chunk_denominator, compile_schedule

__all__ = ["to_mscclpp_plan", "mscclpp_plan_json", "MAX_CHUNKS_PER_BLOCK", "MAX_THREADBLOCKS",
           "CHANNEL_TYPES"]

#: chunks per block at most (the executor divides each buffer into whole chunks)
MAX_CHUNKS_PER_BLOCK = 1024
#: threadblocks per GPU at most: they spin on each other, so all must be resident at once
MAX_THREADBLOCKS = 128
#: channel indexes are one byte in the executor's operations
MAX_TB_CHANNELS = 255
CHANNEL_TYPES = ("memory", "port")
BUF = {INP: "i", OUT: "o", STAGE: "s"}


def _chunks_per_block(schedule: Schedule) -> int:
    groups: dict = defaultdict(list)
    for c in schedule.chunks:
        groups[(c.src, getattr(c, "dst", None))].append(c.share)
    total = 1
    for key, shares in sorted(groups.items()):
        k = chunk_denominator(shares)
        if k is None:
            raise ScheduleError(f"block {key[0]}{' -> ' + key[1] if key[1] else ''}: shares {shares} are "
                                "not multiples of 1/K for K <= 64; export a rounded schedule")
        total = total * k // math.gcd(total, k)
    if total > MAX_CHUNKS_PER_BLOCK:
        raise ScheduleError(f"the schedule needs {total} chunks per block (at most {MAX_CHUNKS_PER_BLOCK}); "
                            "re-synthesize with fewer max_chunks")
    return total


@dataclass
class _Tb:
    """One threadblock under construction: ops plus its local channel and buffer tables."""

    ops: list[dict] = field(default_factory=list)
    channels: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    buffers: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def channel(self, ctype: str, gpu_channel: int) -> int:
        ids = self.channels[ctype]
        if gpu_channel not in ids:
            ids.append(gpu_channel)
        return ids.index(gpu_channel)

    def buffer(self, ctype: str, gpu_buffer: int) -> int:
        ids = self.buffers[ctype]
        if gpu_buffer not in ids:
            ids.append(gpu_buffer)
        return ids.index(gpu_buffer)

    def sync(self) -> None:
        """A ``nop`` (``__syncthreads``) unless the last op is one already."""
        if self.ops and self.ops[-1]["name"] != "nop":
            self.ops.append({"name": "nop"})


class _Plan:
    """Threadblocks, channel pairs and remote buffers of every GPU."""

    def __init__(self, prog, n: int, ctype_of) -> None:
        self.n, self.ctype_of = n, ctype_of
        peers = [sorted({m.dst for m in prog.messages if m.src == g}) for g in range(n)]
        self.tb_of_peer = [{v: 1 + i for i, v in enumerate(p)} for p in peers]
        self.tbs = [[_Tb() for _ in range(1 + len(p))] for p in peers]
        self.remote: list[list[tuple[int, str]]] = [[] for _ in range(n)]
        self.pairs: list[tuple[int, int, int]] = []          # (sender, receiver, waiting tb)
        self.connected: list[dict[str, list[int]]] = [defaultdict(list) for _ in range(n)]

    def remote_buffer(self, g: int, rank: int, buf: str) -> int:
        key = (rank, buf)
        if key not in self.remote[g]:
            self.remote[g].append(key)
        return self.remote[g].index(key)

    def gpu_channels(self) -> dict[tuple[int, int, int, int], int]:
        """``(gpu, sender, receiver, waiter) -> gpu channel id`` of its type, both ends."""
        order = sorted(set(self.pairs), key=lambda p: (min(p[0], p[1]), max(p[0], p[1]), p[0], p[2]))
        ids = {}
        for w, u, q in order:
            ctype = self.ctype_of(w, u)
            for g, peer in ((w, u), (u, w)):
                ids[(g, w, u, q)] = len(self.connected[g][ctype])
                self.connected[g][ctype].append(peer)
        return ids


def to_mscclpp_plan(schedule: Schedule, *, channel_type: str = "port", gpus_per_node: int | None = None,
                    threads_per_block: int = 1024, min_bytes: int = 0, max_bytes: int = 2**64 - 1,
                    name: str | None = None) -> dict[str, Any]:
    """The MSCCL++ execution plan (a JSON object) of ``schedule`` (AllGather or AllToAll);
    module docstring for the format and the lowering.  ``channel_type`` is used for every
    pair, or only across nodes when ``gpus_per_node`` is given (memory channels inside).
    Raises :class:`ScheduleError` when the schedule does not fit the executor's limits."""
    if channel_type not in CHANNEL_TYPES:
        raise ScheduleError(f"channel_type must be one of {CHANNEL_TYPES}, got {channel_type!r}")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise ScheduleError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    if not 32 <= threads_per_block <= 1024 or threads_per_block % 32:
        raise ScheduleError(f"threads_per_block must be a multiple of 32 in 32..1024, got {threads_per_block}")

    def ctype_of(a: int, b: int) -> str:
        if gpus_per_node is not None and a // gpus_per_node == b // gpus_per_node:
            return "memory"
        return channel_type

    c = _chunks_per_block(schedule)
    prog = compile_schedule(schedule, c, 1)
    n = schedule.num_gpus
    messages = sorted(prog.messages, key=lambda m: (m.round, m.src, m.dst))
    plan = _Plan(prog, n, ctype_of)
    writer: dict[tuple[int, int, int], int] = {}          # (gpu, buf, chunk) -> message index
    for i, m in enumerate(messages):
        for seg in m.dst_segs:
            for x in range(seg.offset, seg.offset + seg.length):
                writer[(m.dst, seg.buf, x)] = i
    needs = _needs(messages, writer)
    waiters: list[set[int]] = [set() for _ in messages]   # tbs on the receiver that wait for it
    for i, m in enumerate(messages):
        for j in needs[i]:
            waiters[j].add(plan.tb_of_peer[m.src][m.dst])
    for j, m in enumerate(messages):
        if not waiters[j]:
            waiters[j].add(0)
        plan.pairs += [(m.src, m.dst, q) for q in waiters[j]]
    ids = plan.gpu_channels()
    _emit(plan, prog, messages, needs, waiters, ids)
    return _render(schedule, plan, c, prog, threads_per_block, min_bytes, max_bytes, name)


def _needs(messages: list[Message], writer: dict) -> list[list[int]]:
    """Per message, the incoming messages whose data it forwards (in message order)."""
    out = []
    for m in messages:
        deps = set()
        for seg in m.src_segs:
            if seg.buf == INP:
                continue
            for x in range(seg.offset, seg.offset + seg.length):
                if (m.src, seg.buf, x) not in writer:
                    raise ScheduleError(f"GPU {m.src} forwards {BUF[seg.buf]}[{x}] in round {m.round} "
                                        "before any message delivers it")
                deps.add(writer[(m.src, seg.buf, x)])
        out.append(sorted(deps))
    return out


def _emit(plan: _Plan, prog, messages: list[Message], needs: list[list[int]], waiters: list[set[int]],
          ids: dict) -> None:
    """Fill every threadblock's ops (module docstring: handshake, waits, puts, signals)."""
    signals_on: dict[tuple[int, int, int], list[int]] = defaultdict(list)   # pair -> messages, in order
    for j, m in enumerate(messages):
        for q in sorted(waiters[j]):
            signals_on[(m.src, m.dst, q)].append(j)
    waited: dict[tuple[int, int, int], int] = defaultdict(int)

    def op(ctype: str, name: str, tb: _Tb, gpu: int, pair: tuple[int, int, int]) -> None:
        tb.ops.append({"name": name, "channel_ids": [tb.channel(ctype, ids[(gpu, *pair)])],
                       "channel_type": ctype})

    def wait_for(tb: _Tb, gpu: int, pair: tuple[int, int, int], upto: int) -> None:
        while waited[pair] < upto:
            op(plan.ctype_of(pair[0], pair[1]), "wait", tb, gpu, pair)
            waited[pair] += 1

    for g in range(plan.n):                        # handshake: signal what I wait on, then wait
        for q, tb in enumerate(plan.tbs[g]):
            for pair in sorted(p for p in signals_on if p[1] == g and p[2] == q):
                op(plan.ctype_of(pair[0], g), "signal", tb, g, pair)
        for v, q in plan.tb_of_peer[g].items():
            tb = plan.tbs[g][q]
            for pair in sorted(p for p in signals_on if p[0] == g and p[1] == v):
                op(plan.ctype_of(g, v), "wait", tb, g, pair)
            tb.sync()
    for g, rp in enumerate(prog.ranks):
        for s, d in rp.copies:
            if s.length:
                plan.tbs[g][0].ops.append({"name": "copy", "src_buff": [_local(s)], "dst_buff": [_local(d)]})
    for i, m in enumerate(messages):
        q = plan.tb_of_peer[m.src][m.dst]
        tb = plan.tbs[m.src][q]
        for j in needs[i]:
            src = messages[j]
            pair = (src.src, m.src, q)
            wait_for(tb, m.src, pair, signals_on[pair].index(j) + 1)
        tb.sync()
        ctype = plan.ctype_of(m.src, m.dst)
        for s, d in zip(m.src_segs, m.dst_segs):
            put = {"name": "put", "src_buff": [_local(s)],
                   "dst_buff": [{"buffer_id": tb.buffer(ctype, plan.remote_buffer(m.src, m.dst, BUF[d.buf])),
                                 "index": d.offset, "size": d.length}]}
            if ctype == "port":
                put["channel_ids"] = [tb.channel(ctype, ids[(m.src, m.src, m.dst, min(waiters[i]))])]
            put["channel_type"] = ctype
            tb.ops.append(put)
        tb.sync()
        for w in sorted(waiters[i]):
            op(ctype, "signal", tb, m.src, (m.src, m.dst, w))
    for pair, sent in sorted(signals_on.items()):  # what nobody forwards: its receiver's tb waits
        wait_for(plan.tbs[pair[1]][pair[2]], pair[1], pair, len(sent))


def _local(seg) -> dict[str, Any]:
    return {"type": BUF[seg.buf], "index": seg.offset, "size": seg.length}


def _render(schedule: Schedule, plan: _Plan, c: int, prog, threads: int, min_bytes: int, max_bytes: int,
            name: str | None) -> dict[str, Any]:
    n = plan.n
    gpus = []
    for g in range(n):
        if len(plan.tbs[g]) > MAX_THREADBLOCKS:
            raise ScheduleError(f"GPU {g} needs {len(plan.tbs[g])} threadblocks (at most {MAX_THREADBLOCKS} "
                                "resident at once); the schedule sends to too many peers")
        tbs = []
        for t, tb in enumerate(plan.tbs[g]):
            if any(len(v) > MAX_TB_CHANNELS for v in tb.channels.values()):
                raise ScheduleError(f"GPU {g} threadblock {t} uses more than {MAX_TB_CHANNELS} channels")
            tbs.append({"id": t, "ops": tb.ops,
                        "channels": [{"channel_type": k, "channel_ids": v} for k, v in tb.channels.items()],
                        "remote_buffer_refs": [{"access_channel_type": k, "remote_buffer_ids": v}
                                               for k, v in tb.buffers.items()]})
        access = defaultdict(set)
        for tb in plan.tbs[g]:
            for ctype, bufs in tb.buffers.items():
                for b in bufs:
                    access[b].add(ctype)
        gpus.append({
            "id": g,
            "input_chunks": c if schedule.collective == "allgather" else n * c,
            "output_chunks": n * c,
            "scratch_chunks": prog.ranks[g].stage_numel,
            "threadblocks": tbs,
            "channels": [{"channel_type": k, "connected_to": v} for k, v in plan.connected[g].items()],
            "remote_buffers": [{"rank": r, "type": b, "access_channel_types": sorted(access[i])}
                               for i, (r, b) in enumerate(plan.remote[g])],
            "semaphores": [],
        })
    return {"name": name or f"mccl-{schedule.collective}-{schedule.topology}-v{schedule.version}",
            "collective": schedule.collective, "protocol": "Simple", "inplace": False,
            "reuse_resources": False, "gpus": gpus, "num_threads_per_block": threads,
            "use_double_scratch_buffer": False, "buffer_alignment": 16,
            "min_message_size": int(min_bytes), "max_message_size": int(max_bytes)}


def mscclpp_plan_json(schedule: Schedule, **kwargs: Any) -> str:
    """:func:`to_mscclpp_plan` as JSON text (indent 1)."""
    return json.dumps(to_mscclpp_plan(schedule, **kwargs), indent=1) + "\n"
