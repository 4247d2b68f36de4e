"""Parallel groups mapped onto a fabric's GPUs (paper §6.3, docs/training.md "Placement").

Megatron-LM and DeepSeek order ranks with the tensor-parallel coordinate innermost,
then expert, then data: rank ``r`` has coordinates ``c_k = (r // prod(sizes[:k])) %
sizes[k]``, and a group instance of dimension ``k`` is the set of ranks that differ only
in ``c_k``.  With the fabric's rank order host-major (HPN: ``s{s}h{h}g{g}``), a group of
8 innermost ranks is one host (tensor parallelism on NVLink), a group of 64 is eight
whole hosts (DeepSeek's expert parallelism), and the outer data-parallel group takes
one GPU per host on one rail.
"""

from __future__ import annotations

from math import prod
from typing import Sequence

from ..errors import WorkloadError
from .workload import WORLD, Workload

__all__ = ["group_sizes", "place_groups"]


def group_sizes(workload: Workload, num_gpus: int) -> dict[str, int]:
    """Each group's size with ``"rest"`` resolved; :class:`WorkloadError` when the sizes
    do not multiply to ``num_gpus``."""
    fixed = prod(s for _, s in workload.groups if s != "rest")
    rest = [n for n, s in workload.groups if s == "rest"]
    if num_gpus % fixed or (not rest and fixed != num_gpus):
        sizes = " x ".join(f"{n}={s}" for n, s in workload.groups)
        raise WorkloadError(f"the groups ({sizes}) do not fit {num_gpus} GPUs: their sizes must "
                            f"multiply to the GPU count (choose --gpus a multiple of {fixed})")
    out = {n: (num_gpus // fixed if s == "rest" else int(s)) for n, s in workload.groups}
    out[WORLD] = num_gpus
    return out


def place_groups(workload: Workload, gpus: Sequence[str]) -> dict[str, list[tuple[str, ...]]]:
    """For each group (and ``world``), its instances as member lists in rank order."""
    n = len(gpus)
    sizes = group_sizes(workload, n)
    out: dict[str, list[tuple[str, ...]]] = {WORLD: [tuple(gpus)]}
    stride = 1
    for name, _ in workload.groups:
        size = sizes[name]
        block = stride * size
        out[name] = [tuple(gpus[base + off + j * stride] for j in range(size))
                     for base in range(0, n, block) for off in range(stride)]
        stride = block
    return out
