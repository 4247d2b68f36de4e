"""Segments of a rank's buffers (input, output, staging) as tensors: the views, packing
and unpacking that :class:`~executor_cuda.communicator.Communicator` does around each
coalesced message (docs/executor.md, "Compiler")."""

from __future__ import annotations

import torch

from mccl_opt.errors import InputError
from mccl_opt.lowering.program import Segment

__all__ = ["view", "pack", "gather_target", "scatter", "check_pair"]


def view(bufs: tuple, seg: Segment) -> torch.Tensor:
    """The elements ``seg`` names in its buffer (no copy)."""
    return bufs[seg.buf].narrow(0, seg.offset, seg.length)


def pack(bufs: tuple, segs: tuple[Segment, ...]) -> torch.Tensor:
    """A message's payload: one segment in place, several concatenated in order."""
    if len(segs) == 1:
        return view(bufs, segs[0])
    return torch.cat([view(bufs, s) for s in segs])


def gather_target(bufs: tuple, segs: tuple[Segment, ...], unpack: list) -> torch.Tensor:
    """Where a message is received: one segment in place, else a temporary that
    :func:`scatter` copies out later (recorded in ``unpack``)."""
    if len(segs) == 1:
        return view(bufs, segs[0])
    ref = bufs[segs[0].buf]
    tmp = torch.empty(sum(s.length for s in segs), dtype=ref.dtype, device=ref.device)
    unpack.append((tmp, segs))
    return tmp


def scatter(bufs: tuple, segs: tuple[Segment, ...], tmp: torch.Tensor) -> None:
    """Copy a received temporary into its segments, in order."""
    pos = 0
    for s in segs:
        view(bufs, s).copy_(tmp.narrow(0, pos, s.length))
        pos += s.length


def check_pair(out: torch.Tensor, inp: torch.Tensor) -> None:
    """Raise :class:`InputError` unless a collective's tensors have one dtype and device
    and are contiguous (torch's requirements)."""
    if out.dtype != inp.dtype or out.device != inp.device:
        raise InputError(f"input ({inp.dtype}, {inp.device}) and output ({out.dtype}, "
                         f"{out.device}) must have the same dtype and device")
    if not (out.is_contiguous() and inp.is_contiguous()):
        raise InputError("input and output tensors must be contiguous")
