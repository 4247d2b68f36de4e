"""The layered training workload, ``mccl-workload/1`` (paper §6.3, docs/training.md).

One pipeline stage's iteration as seen by one GPU (every GPU of the stage is alike)::

    {"format": "mccl-workload/1", "name": "tiny", "gpu_tflops": 400,
     "groups": [{"name": "tp", "size": 8}, {"name": "dp", "size": "rest"}],
     "phases": [{"name": "forward", "repeat": 8, "ops": [
         {"kind": "compute", "flops": 2.5e12},
         {"kind": "allgather", "name": "tp-ag", "bytes": 8388608, "group": "tp"},
         {"kind": "allgather", "name": "fsdp-ag", "bytes": 4194304, "group": "dp",
          "overlap": true}]}]}

* ``groups``: the parallel dimensions, innermost first (Megatron's rank order: a group of
  size ``s`` at position ``k`` joins the ranks that differ only in coordinate ``k``);
  exactly one may be ``"rest"`` (the GPU count divided by the others).  ``world`` (every
  GPU of the stage) is always available.
* ``phases`` run one after the other, each ``repeat`` times.  A phase's ops without
  ``overlap`` run in order on the critical path; its ``overlap: true`` collectives run in
  order in the background from the phase's start (prefetch, gradient reduction), sharing
  links with whatever runs at the same time.  The phase ends when both are done.
* A compute op takes ``seconds``, or ``flops`` at ``gpu_tflops`` (10^12 FLOP/s).
* A collective op: ``kind`` (allgather | alltoall | reducescatter | allreduce), ``bytes``
  per GPU (AllGather shard, AllToAll send buffer, ReduceScatter / AllReduce buffer) and
  the ``group`` whose communicators run it (every instance of the group at once).

The flat profile form of the same format (``compute_share`` + ``collectives``, read by
``mccl loop --workload``) has no phases; :func:`load_workload` names the missing field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import WorkloadError
from ..files import SMALL_PARSE_BYTES, read_json

__all__ = ["WORKLOAD_FORMAT", "COLLECTIVE_KINDS", "Op", "Phase", "Workload", "load_workload"]

WORKLOAD_FORMAT = "mccl-workload/1"
COLLECTIVE_KINDS = ("allgather", "alltoall", "reducescatter", "allreduce")
WORLD = "world"


@dataclass(frozen=True)
class Op:
    """A compute op (``kind == "compute"``, ``seconds`` or ``flops``) or a collective."""

    kind: str
    name: str
    bytes: float = 0.0
    group: str = ""
    overlap: bool = False
    seconds: float | None = None
    flops: float | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "compute":
            return {"kind": "compute", "name": self.name,
                    **({"seconds": self.seconds} if self.seconds is not None else {"flops": self.flops})}
        return {"kind": self.kind, "name": self.name, "bytes": self.bytes, "group": self.group,
                "overlap": self.overlap}


@dataclass(frozen=True)
class Phase:
    name: str
    repeat: int
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Workload:
    """A validated layered workload (module docstring)."""

    name: str
    groups: tuple[tuple[str, int | str], ...]
    phases: tuple[Phase, ...]
    gpu_tflops: float | None = None
    notes: tuple[str, ...] = ()

    def compute_seconds(self, op: Op) -> float:
        """A compute op's duration."""
        if op.seconds is not None:
            return op.seconds
        return float(op.flops) / (float(self.gpu_tflops) * 1e12)

    def to_dict(self) -> dict[str, Any]:
        """The ``mccl-workload/1`` dictionary (round-trips through :func:`load_workload`)."""
        out: dict[str, Any] = {"format": WORKLOAD_FORMAT, "name": self.name}
        if self.gpu_tflops is not None:
            out["gpu_tflops"] = self.gpu_tflops
        out["groups"] = [{"name": n, "size": s} for n, s in self.groups]
        out["phases"] = [{"name": p.name, "repeat": p.repeat, "ops": [o.to_dict() for o in p.ops]}
                         for p in self.phases]
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def _positive(v: Any, where: str, integer: bool = False) -> float:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not v > 0 or v != v or v == float("inf"):
        what = "a positive integer" if integer else "a positive finite number"
        raise WorkloadError(f"{where} must be {what}, got {v!r}")
    return v


def _groups(data: Any) -> tuple[tuple[str, int | str], ...]:
    if not isinstance(data, list) or not data:
        raise WorkloadError("'groups' must be a non-empty list of {\"name\": ..., \"size\": ...}, "
                            "innermost first")
    out: list[tuple[str, int | str]] = []
    for i, g in enumerate(data):
        where = f"groups[{i}]"
        if not isinstance(g, Mapping) or not isinstance(g.get("name"), str) or not g["name"]:
            raise WorkloadError(f"{where} must be an object with a non-empty string 'name'")
        name, size = g["name"], g.get("size")
        if name == WORLD or name in dict(out):
            raise WorkloadError(f"{where}: group name {name!r} is reserved or used twice")
        out.append((name, size if size == "rest" else int(_positive(size, f"{where}.size", True))))
    if sum(1 for _, s in out if s == "rest") > 1:
        raise WorkloadError("at most one group may have size \"rest\"")
    return tuple(out)


def _op(data: Any, where: str, groups: set[str]) -> Op:
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{where} must be an object")
    kind = data.get("kind")
    name = data.get("name", where)
    if not isinstance(name, str):
        raise WorkloadError(f"{where}.name must be a string")
    if kind == "compute":
        has = [k for k in ("seconds", "flops") if k in data]
        if len(has) != 1:
            raise WorkloadError(f"{where}: a compute op takes exactly one of 'seconds' or 'flops'")
        value = float(_positive(data[has[0]], f"{where}.{has[0]}"))
        return Op("compute", name, **{has[0]: value})
    if kind not in COLLECTIVE_KINDS:
        raise WorkloadError(f"{where}.kind must be 'compute' or one of {COLLECTIVE_KINDS}, got {kind!r}")
    group = data.get("group")
    if group not in groups:
        raise WorkloadError(f"{where}.group must name a group ({sorted(groups)}), got {group!r}")
    overlap = data.get("overlap", False)
    if not isinstance(overlap, bool):
        raise WorkloadError(f"{where}.overlap must be true or false, got {overlap!r}")
    return Op(kind, name, float(_positive(data.get("bytes"), f"{where}.bytes")), group, overlap)


def load_workload(data: Any) -> Workload:
    """Validate a layered workload (dict or path); :class:`WorkloadError` names the bad entry."""
    if isinstance(data, (str, Path)):
        data = read_json(data, WorkloadError, "workload", SMALL_PARSE_BYTES)
    if not isinstance(data, Mapping) or data.get("format") != WORKLOAD_FORMAT:
        raise WorkloadError(f"a workload is a JSON object with \"format\": \"{WORKLOAD_FORMAT}\"")
    if "phases" not in data:
        raise WorkloadError("the workload has no 'phases' (the flat 'compute_share' profile is read by "
                            "'mccl loop --workload'; 'mccl train' needs groups and phases, "
                            "see docs/training.md)")
    groups = _groups(data.get("groups"))
    names = {n for n, _ in groups} | {WORLD}
    tflops = data.get("gpu_tflops")
    if tflops is not None:
        tflops = float(_positive(tflops, "gpu_tflops"))
    phases = data["phases"]
    if not isinstance(phases, list) or not phases:
        raise WorkloadError("'phases' must be a non-empty list")
    out = []
    for i, p in enumerate(phases):
        where = f"phases[{i}]"
        if not isinstance(p, Mapping) or not isinstance(p.get("ops"), list) or not p["ops"]:
            raise WorkloadError(f"{where} must be an object with a non-empty 'ops' list")
        repeat = int(_positive(p.get("repeat", 1), f"{where}.repeat", True))
        ops = tuple(_op(o, f"{where}.ops[{j}]", names) for j, o in enumerate(p["ops"]))
        if tflops is None and any(o.flops is not None for o in ops):
            raise WorkloadError(f"{where}: a compute op gives 'flops' but the workload has no "
                                "'gpu_tflops' to turn them into seconds")
        out.append(Phase(str(p.get("name", where)), repeat, ops))
    notes = data.get("notes", [])
    return Workload(str(data.get("name", "")), groups, tuple(out), tflops,
                    tuple(str(n) for n in notes) if isinstance(notes, list) else ())
