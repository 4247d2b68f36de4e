"""The reporter's drop rule on noise only (docs/executor.md, "A confirmed drop at its newest
windows' level"): busy-core stalls read 0.38-0.7 of nominal with probability ``p`` per
window, else 1 +- 5 %; per ``p``, 400 runs of 60 windows (seed 1): windows reported below
0.9 of nominal, drop onsets (a report below 0.9 after one at or above it) and the median
level of those reports.  Run from the root of the tree to measure:
``PYTHONPATH=. python bench/bench_reporter_noise.py``."""

from __future__ import annotations

import random
import statistics

from tests.test_executor_scenario import _bare_reporter


def main() -> None:
    for p in (0.2, 0.35, 0.5):
        rng = random.Random(1)
        levels: list[float] = []
        windows = onsets = 0
        for _ in range(400):
            rep = _bare_reporter(drop_window=5)
            for _ in range(5):
                rep._level(("a", "b"), 1.0, 0.0)
            prev = 1.0
            for _ in range(60):
                r = rng.uniform(0.38, 0.7) if rng.random() < p else rng.uniform(0.95, 1.05)
                g = rep._level(("a", "b"), min(1.0, r), 0.0)["gbps"]
                windows += 1
                onsets += g < 0.9 <= prev
                prev = g
                if g < 0.9:
                    levels.append(g)
        med = f"{statistics.median(levels):.3f}" if levels else "-"
        print(f"p={p}: windows {windows}, reported below 0.9: {len(levels)}, drop onsets {onsets}, median level {med}")


if __name__ == "__main__":
    main()
