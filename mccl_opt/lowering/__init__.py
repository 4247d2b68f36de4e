"""Schedule lowering, torch-free: a ``mccl-schedule/1`` schedule compiled into per-rank
point-to-point programs (:mod:`.program`, the executor's input, paper §3.3) and into
MSCCL XML for msccl-executor-nccl (:mod:`.msccl`) and MSCCL++ execution plans (:mod:`.mscclpp`).  Depends on the schedule model only,
so ``mccl export msccl`` works without torch; the torch executor (``executor_cuda``)
runs the programs.
"""

from __future__ import annotations

from .msccl import check_msccl_xml, to_msccl_xml
from .program import compile_schedule, direct_schedule

__all__ = ["compile_schedule", "direct_schedule", "to_msccl_xml", "check_msccl_xml"]
