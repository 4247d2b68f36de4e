"""Size limits of the generated fabrics, checked before anything is allocated: a shape
like ``hpn 100000x100000x100000`` or ``mesh 20000`` is refused at once with its size,
instead of running out of memory minutes later."""

from __future__ import annotations

from mccl_opt.errors import TopologyError

__all__ = ["MAX_LINKS", "check_size"]

#: directed links of a generated fabric (a 1024-GPU HPN has ~8.5 thousand)
MAX_LINKS = 2_000_000


def check_size(name: str, links: int) -> None:
    """Refuse a fabric ``name`` that would have more than :data:`MAX_LINKS` links."""
    if links > MAX_LINKS:
        raise TopologyError(f"{name} would have {links:,} links; at most {MAX_LINKS:,} are generated "
                            "(pick a smaller shape)")
