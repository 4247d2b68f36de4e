"""A small interpreter of MSCCL++ execution plans, written for the tests from the format
(MSCCL++'s ``ExecutionPlan`` reader), independent of ``mccl_opt.lowering.mscclpp``.

Each GPU's buffers hold chunk labels: input chunk ``k`` of GPU ``g`` is ``(g, k)``.  Every
threadblock runs its ops in order; the interpreter steps whichever threadblock can move:

* channels: per type, GPU ``g``'s ``k``-th channel to ``p`` is paired with ``p``'s ``k``-th
  channel to ``g``; a ``signal`` adds a token on the peer's end, a ``wait`` takes one (and
  blocks while none is there);
* ``put`` writes into the buffer a ``remote_buffers`` entry names (through the
  threadblock's ``remote_buffer_refs``); a port put's channel must lead to that rank;
* visibility: a signal releases every earlier op of its threadblock; a reader may read a
  chunk another GPU put only after it consumed a signal its writer sent after that put
  (happens-before, without transitive edges: stricter than the hardware);
* ``nop`` is ``__syncthreads``: a put or copy after a wait, and a signal after a put, need one
  in between (the wait/signal run on few threads).

It fails on a deadlock, a read of an unwritten or not yet visible chunk, a chunk written
twice, a token left on a channel at the end (the next run would see it), a put never
signalled, or a wrong output.  :func:`run_plan` returns the counts of what ran and, under
``"moved"``, the chunks put per (source GPU, destination GPU).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


class PlanError(Exception):
    """The plan is malformed, deadlocks, races or computes the wrong output."""


@dataclass
class _Tb:
    gpu: int
    id: int
    ops: list
    channels: dict          # type -> [gpu channel ids]
    buffers: dict           # type -> [gpu remote buffer ids]
    pc: int = 0
    synced: bool = True     # no wait/put since the last nop
    dirty: bool = False     # a put since the last nop
    seen: dict = field(default_factory=dict)   # (gpu, tb) -> ops of it released to me


def _need(obj: dict, key: str, where: str):
    if key not in obj:
        raise PlanError(f"{where}: missing '{key}'")
    return obj[key]


def run_plan(plan: dict) -> dict:
    """Execute ``plan`` (module docstring); raise :class:`PlanError` or return counts."""
    for key in ("name", "collective", "protocol", "inplace", "gpus", "num_threads_per_block",
                "min_message_size", "max_message_size"):
        _need(plan, key, "plan")
    coll, gpus = plan["collective"], plan["gpus"]
    n = len(gpus)
    if [g["id"] for g in gpus] != list(range(n)):
        raise PlanError("gpu ids must be 0..n-1 in order")
    bufs, writer, peers_of, remote, tbs = {}, {}, {}, {}, []
    for g in gpus:
        gid = g["id"]
        ic, oc, sc = (_need(g, k, f"gpu {gid}") for k in ("input_chunks", "output_chunks", "scratch_chunks"))
        bufs[gid] = {"i": [(gid, k) for k in range(ic)], "o": [None] * oc, "s": [None] * sc}
        peers_of[gid] = {ch["channel_type"]: list(ch["connected_to"]) for ch in _need(g, "channels", f"gpu {gid}")}
        remote[gid] = [(r["rank"], r["type"], set(r["access_channel_types"]))
                       for r in _need(g, "remote_buffers", f"gpu {gid}")]
        for i, t in enumerate(_need(g, "threadblocks", f"gpu {gid}")):
            if t["id"] != i:
                raise PlanError(f"gpu {gid}: threadblock ids must be 0..k-1 in order")
            tbs.append(_Tb(gid, i, t["ops"], {c["channel_type"]: c["channel_ids"] for c in t["channels"]},
                           {b["access_channel_type"]: b["remote_buffer_ids"] for b in t["remote_buffer_refs"]}))
    # pair channel ends: (gpu, type, index) <-> (peer, type, index')
    other_end = {}
    for g in range(n):
        for ctype, peers in peers_of[g].items():
            seen = defaultdict(int)
            for idx, p in enumerate(peers):
                k = seen[p]
                seen[p] += 1
                theirs = [j for j, q in enumerate(peers_of.get(p, {}).get(ctype, [])) if q == g]
                if k >= len(theirs):
                    raise PlanError(f"gpu {g}'s {ctype} channel {idx} to {p} has no partner on GPU {p}")
                other_end[(g, ctype, idx)] = (p, ctype, theirs[k])
    tokens: dict = defaultdict(list)      # channel end -> [(sender gpu, tb, released op count)]
    counts: dict = defaultdict(int)
    moved: dict = defaultdict(int)

    def chan(tb: _Tb, op: dict, where: str) -> list:
        ctype = _need(op, "channel_type", where)
        out = []
        for c in _need(op, "channel_ids", where):
            ids = tb.channels.get(ctype, [])
            if not 0 <= c < len(ids) or not 0 <= ids[c] < len(peers_of[tb.gpu].get(ctype, [])):
                raise PlanError(f"{where}: channel {c} of type {ctype} is not this threadblock's")
            out.append((tb.gpu, ctype, ids[c]))
        return out

    def read(tb: _Tb, ref: dict, where: str) -> list:
        typ, idx, size = ref["type"], ref["index"], ref["size"]
        data = bufs[tb.gpu][typ][idx:idx + size]
        if len(data) != size or idx < 0:
            raise PlanError(f"{where}: {typ}[{idx}:{idx + size}] is outside the buffer")
        for x in range(idx, idx + size):
            if data[x - idx] is None:
                raise PlanError(f"{where}: reads {typ}[{x}] before anything wrote it")
            w = writer.get((tb.gpu, typ, x))
            if w is not None and w[0] != tb.gpu and tb.seen.get(w[:2], 0) <= w[2]:
                raise PlanError(f"{where}: reads {typ}[{x}] that GPU {w[0]} put without a signal "
                                "this threadblock waited for")
        return data

    def write(g: int, typ: str, idx: int, data: list, stamp: tuple, where: str) -> None:
        arr = bufs[g][typ]
        if idx < 0 or idx + len(data) > len(arr):
            raise PlanError(f"{where}: writes {typ}[{idx}:{idx + len(data)}] outside GPU {g}'s buffer")
        for x, v in enumerate(data, idx):
            if (g, typ, x) in writer:
                raise PlanError(f"{where}: GPU {g} {typ}[{x}] written twice")
            arr[x] = v
            writer[(g, typ, x)] = stamp

    def step(tb: _Tb) -> bool:
        op = tb.ops[tb.pc]
        name = op["name"]
        where = f"gpu {tb.gpu} tb {tb.id} op {tb.pc} ({name})"
        if name == "wait":
            ends = chan(tb, op, where)
            if any(not tokens[e] for e in ends):
                return False
            for e in ends:
                g, t, released = tokens[e].pop(0)
                tb.seen[(g, t)] = max(tb.seen.get((g, t), 0), released)
            tb.synced = False
        elif name == "signal":
            if tb.dirty:
                raise PlanError(f"{where}: signals after a put without a nop in between")
            for e in chan(tb, op, where):
                tokens[other_end[e]].append((tb.gpu, tb.id, tb.pc))
        elif name == "nop":
            tb.synced, tb.dirty = True, False
        elif name in ("put", "copy"):
            if not tb.synced:
                raise PlanError(f"{where}: reads after a wait without a nop in between")
            for s, d in zip(op["src_buff"], op["dst_buff"], strict=True):
                if s["size"] != d["size"]:
                    raise PlanError(f"{where}: source and destination sizes differ")
                data = read(tb, s, where)
                if name == "copy":
                    write(tb.gpu, d["type"], d["index"], data, (tb.gpu, tb.id, tb.pc), where)
                    continue
                ctype = op["channel_type"]
                ids = tb.buffers.get(ctype, [])
                if not 0 <= d["buffer_id"] < len(ids):
                    raise PlanError(f"{where}: buffer_id {d['buffer_id']} not in the threadblock's refs")
                rank, typ, access = remote[tb.gpu][ids[d["buffer_id"]]]
                if ctype not in access or rank not in peers_of[tb.gpu].get(ctype, []):
                    raise PlanError(f"{where}: GPU {tb.gpu} has no {ctype} access to GPU {rank}")
                if ctype == "port" and any(peers_of[tb.gpu]["port"][e[2]] != rank for e in chan(tb, op, where)):
                    raise PlanError(f"{where}: the port channel does not lead to GPU {rank}")
                write(rank, typ, d["index"], data, (tb.gpu, tb.id, tb.pc), where)
                moved[(tb.gpu, rank)] += len(data)
            tb.dirty = tb.dirty or name == "put"
        else:
            raise PlanError(f"{where}: op {name!r} is not interpreted here")
        counts[name] += 1
        tb.pc += 1
        return True

    progress = True
    while progress:
        progress = False
        for tb in tbs:
            while tb.pc < len(tb.ops) and step(tb):
                progress = True
    stuck = [f"gpu {t.gpu} tb {t.id} op {t.pc}" for t in tbs if t.pc < len(t.ops)]
    if stuck:
        raise PlanError("deadlock: " + ", ".join(stuck[:6]))
    left = [e for e, q in tokens.items() if q]
    if left:
        raise PlanError(f"signals never waited for on {left[:4]} (the next run would consume them)")
    _check_visible(tbs, writer)
    _check_output(coll, n, bufs)
    counts["threadblocks"] = len(tbs)
    return {**counts, "moved": dict(moved)}


def _check_visible(tbs: list[_Tb], writer: dict) -> None:
    """Every chunk a GPU received was released to some threadblock of that GPU."""
    by_gpu = defaultdict(list)
    for t in tbs:
        by_gpu[t.gpu].append(t)
    for (g, typ, x), (w, t, pc) in writer.items():
        if w != g and not any(tb.seen.get((w, t), 0) > pc for tb in by_gpu[g]):
            raise PlanError(f"GPU {g} {typ}[{x}] was put by GPU {w} but never signalled to GPU {g}")


def _check_output(coll: str, n: int, bufs: dict) -> None:
    for d in range(n):
        out = bufs[d]["o"]
        c = len(out) // n
        for s in range(n):
            for k in range(c):
                want = (s, k) if coll == "allgather" else (s, d * c + k)
                if out[s * c + k] != want:
                    raise PlanError(f"GPU {d} output chunk {s * c + k} holds {out[s * c + k]}, expected {want}")
