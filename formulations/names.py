"""Row and column names of the exported models, built from a fabric's node ids
(docs/benchmarks.md, "Names in exported models").

A node id may hold any character, so every name part is a *token*: the id with each
character outside ``[A-Za-z0-9.]`` replaced by ``.`` and cut to :data:`TOKEN_MAX`
characters (an empty id becomes ``.``).  When two nodes end up with the same token, the
first in node order keeps it and the k-th further one gets ``~k`` appended.  Tokens are
therefore unique and never contain ``_``, so a name such as ``cap_<tail>_<head>`` splits
back into its parts at ``_``; :attr:`FabricLabels.node_of` maps each token back to its id.
Parallel links (same tail and head, possible in plain arrays) get ``~k`` the same way.

Every name starts with a letter, is at most 255 characters and has no blank, so HiGHS,
Gurobi and SCIP read it in free MPS and in CPLEX LP files (:mod:`formulations.export`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["TOKEN_MAX", "tokens", "disambiguate", "numbered", "FabricLabels"]

TOKEN_MAX = 40              # five tokens and the prefixes stay under 255 characters
_UNSAFE = re.compile(r"[^A-Za-z0-9.]")


def tokens(ids: Sequence[str]) -> list[str]:
    """Unique MPS/LP-safe tokens for ``ids``, deterministic (module docstring)."""
    return disambiguate([_UNSAFE.sub(".", str(s))[:TOKEN_MAX] or "." for s in ids])


def disambiguate(names: Sequence[str]) -> list[str]:
    """``names`` with the k-th repeat of a name (k >= 1) suffixed ``~k``."""
    seen: Counter[str] = Counter()
    out = []
    for name in names:
        k = seen[name]
        seen[name] += 1
        out.append(name if k == 0 else f"{name}~{k}")
    return out


def numbered(prefix: str, labels: Sequence[str], groups: np.ndarray) -> list[str]:
    """``<prefix>_<labels[g]>_<k>`` for each entry ``g`` of ``groups``, ``k`` counting
    the earlier entries of the same group (path or tree columns per pair or root)."""
    seen: Counter[int] = Counter()
    out = []
    for g in np.asarray(groups, dtype=np.int64).tolist():
        out.append(f"{prefix}_{labels[g]}_{seen[g]}")
        seen[g] += 1
    return out


@dataclass(frozen=True)
class FabricLabels:
    """Name parts of one fabric: ``node`` (token per node), ``link`` (``<tail>_<head>``
    per link, unique) and ``gpu`` (token per GPU rank)."""

    node: tuple[str, ...]
    link: tuple[str, ...]
    gpu: tuple[str, ...]
    node_of: dict[str, str]

    @classmethod
    def of(cls, node_ids: Sequence[str], tails: np.ndarray, heads: np.ndarray,
           gpus: np.ndarray) -> "FabricLabels":
        """Labels from node ids, the links' tail/head node indices and the GPU nodes."""
        node = tokens(node_ids)
        raw = [f"{node[t]}_{node[h]}" for t, h in zip(np.asarray(tails).tolist(),
                                                      np.asarray(heads).tolist())]
        link = disambiguate(raw)
        return cls(tuple(node), tuple(link), tuple(node[g] for g in np.asarray(gpus).tolist()),
                   dict(zip(node, map(str, node_ids))))

    def capacity_rows(self) -> list[str]:
        """``cap_<tail>_<head>`` per link."""
        return [f"cap_{lk}" for lk in self.link]

    def ordered_pairs(self) -> list[str]:
        """``<src>_<dst>`` per ordered GPU pair, in the masters' order
        (pair ``s·(N-1) + d - (d > s)``)."""
        g = self.gpu
        return [f"{g[s]}_{g[d]}" for s in range(len(g)) for d in range(len(g)) if d != s]
