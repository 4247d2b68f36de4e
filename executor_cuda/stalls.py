"""A rank's stall told from a link's drop, one collective at a time (docs/executor.md,
"A rank's stall is not a link's drop").

On shared cores a descheduled rank makes every message it has in flight slow: the ones
it receives (its waiting threads wake late) and the ones it sends (posted late), over
all of its links.  A link that drops slows only the pairs whose route crosses it, on
every rank.  After each collective every rank marks each pair it received as measured
and slow or not (:meth:`StallDetector.row`, read against the pair's level by
:meth:`~executor_cuda.pair_levels.ModelReporter.readings`); the rows are all-reduced
(max) with the ranks' lock-step flags, so each rank sees the whole collective and finds
the same stalled ranks (:meth:`StallDetector.stalled`).  A rank has stalled when in one
role (sending or receiving) it has slow pairs that no other link explains (a link explains
a pair when most other ranks' pairs crossing it read slow too) on at least two of its own
cables: a stalled sender posts all its sends late, a stalled receiver wakes late for all
its receives, and no drop of one cable makes that.  The readings of a stalled rank's pairs in that collective are
not link evidence (the reporter reports their levels unchanged).  A "stall" read in more
than ``max_run`` collectives in a row is not one (a GPU losing two cables at once): its
readings count again, so no drop stays hidden.  The passive measurement windows of
paper §3.3 and §5, filtered per window.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .faults import FabricEmulator

__all__ = ["MAX_RUN", "SLOW", "StallDetector"]

#: a pair whose collective read below this share of its level is slow (healthy readings on
#: gloo ranks are exact, a stall reads 0.38-0.72 of nominal; docs/executor.md "Stalls are not drops")
SLOW = 0.85
#: collectives in a row a rank may be read as stalled; past that its readings count
MAX_RUN = 2

UNMEASURED, MEASURED, SLOW_MARK = 0, 1, 2


class StallDetector:
    """Per collective, the ranks whose readings are a stall (module docstring)."""

    def __init__(self, emu: FabricEmulator, slow: float = SLOW, max_run: int = MAX_RUN) -> None:
        self.emu, self.slow, self.max_run = emu, slow, max_run
        self.world = len(emu.gpus)
        arrays = emu.topo.arrays
        self.ends = list(zip(arrays.tail.tolist(), arrays.head.tolist()))   # per link: (tail, head) nodes
        self.gpu_node = [emu.topo.node_index(g) for g in emu.gpus]
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self.runs = [0] * self.world          # collectives in a row each rank was read as stalled
        self.seen: list[tuple[int, tuple[int, ...]]] = []      # (collective, stalled ranks)

    def row(self, readings: Mapping[tuple[int, int], float]) -> list[int]:
        """This rank's part of the all-reduced matrix (``world * world``, entry
        ``src * world + dst``): per pair it received, ``readings`` (its collective's ratio
        to the pair's level) marked slow or measured; 0 for pairs it did not measure."""
        out = [UNMEASURED] * (self.world * self.world)
        for (s, d), y in readings.items():
            out[s * self.world + d] = SLOW_MARK if y < self.slow else MEASURED
        return out

    def agree(self, readings: Mapping[tuple[int, int], float], flags: list[int], group: Any,
              seq: int = 0) -> tuple[list[int], set[int]]:
        """All-reduce (max, over ``group``) the ranks' lock-step ``flags`` with this rank's
        :meth:`row` of ``readings``; the reduced flags and the stalled ranks (the same on
        every rank)."""
        import torch
        import torch.distributed as dist

        both = torch.tensor(flags + self.row(readings), dtype=torch.int64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
        out = both.tolist()
        return out[:len(flags)], self.stalled(out[len(flags):], seq)

    def stalled(self, matrix: Sequence[int], seq: int = 0) -> set[int]:
        """The ranks whose readings in this collective are a stall, from the all-reduced
        ``matrix`` (every rank's :meth:`row`); counts each rank's run of such collectives."""
        marks = {(k // self.world, k % self.world): int(v) for k, v in enumerate(matrix) if int(v) != UNMEASURED}
        crossing: dict[int, list[tuple[int, int, bool]]] = {}       # link -> (src, dst, slow) of its pairs
        for (s, d), mark in marks.items():
            for link in self._route(s, d):
                crossing.setdefault(link, []).append((s, d, mark == SLOW_MARK))
        found = {r for r in range(self.world) if self._cables(r, marks, crossing) >= 2}
        for r in range(self.world):
            self.runs[r] = self.runs[r] + 1 if r in found else 0
        found = {r for r in found if self.runs[r] <= self.max_run}
        if found:
            self.seen.append((seq, tuple(sorted(found))))
        return found

    def _cables(self, r: int, marks: Mapping[tuple[int, int], int],
                crossing: Mapping[int, list[tuple[int, int, bool]]]) -> int:
        """How many of rank ``r``'s cables carry a slow pair that no other link explains,
        in the role (sending or receiving) where they are most."""
        slow: dict[bool, set[int]] = {True: set(), False: set()}   # role (True: r sends) -> cables
        for (s, d), mark in marks.items():
            if mark != SLOW_MARK or r not in (s, d):
                continue
            route = self._route(s, d)
            if not any(_explains(crossing[link], r) for link in route):
                tail, head = self.ends[route[0] if s == r else route[-1]]
                slow[s == r].add(head if tail == self.gpu_node[r] else tail)
        return max(len(c) for c in slow.values())

    def _route(self, s: int, d: int) -> tuple[int, ...]:
        """Link indices of the switch-only path from rank ``s`` to rank ``d``."""
        hit = self._routes.get((s, d))
        if hit is None:
            hit = self._routes[(s, d)] = tuple(int(x) for x in self.emu.route(s, d))
        return hit


def _explains(pairs: Sequence[tuple[int, int, bool]], r: int) -> bool:
    """Whether a link whose measured pairs are ``pairs`` (src, dst, slow) explains a slow pair
    of rank ``r``: more than half of the pairs of other ranks that cross it read slow."""
    others = [slow for s, d, slow in pairs if r not in (s, d)]
    return bool(others) and 2 * sum(others) > len(others)
