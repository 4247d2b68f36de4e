"""Which link slowed a message: link levels from one rank's received messages.

On the emulated fabric (and on a real one, paper §4.2's step model) a message lasts as
long as its path's most loaded link, relative to capacity, takes to drain.  So a
message measures one link only, and which one is not known: its *nominal* bottleneck,
or another link of its path that slowed down.  Reading every message as its whole
path's level (a ``pair`` sample) made the controller chase the schedule (issue 26):
a message bottlenecked on the receiver's link reads a slowed sender link as faster
than it is, and once a new version stops loading a slowed link, its pairs read near
nominal and the link looks recovered.

:func:`infer_levels` explains the slow messages of one collective by as few links as
possible (greedy set cover, the usual network-tomography rule):

* message ``m`` has, for each link ``l`` of its path, the nominal drain ``d[l]`` (the
  seconds its round's load on ``l`` takes at nominal capacity) and a measured time
  ``T``; if ``l`` alone slowed it, ``l``'s level is ``d[l] / T`` (``y[l, m]``);
* every message is a lower bound: ``level[l] >= y[l, m]`` for all ``l`` of its path
  (the link carried that much); a link's candidate level is the largest bound of the
  messages crossing it, and it *explains* a slow message if that message's bound is
  within ``tol`` of it;
* the link explaining the most unexplained slow messages is taken first (ties: the one
  crossed by more messages); links that explain the same messages and are crossed by
  as many (the two links of a path only one GPU pair uses) cannot be told apart and
  are all charged, as a ``pair`` sample would charge the whole path;
* a message that is not slow proves its nominal bottleneck links healthy (their level
  is at least ``d / T``, about nominal), and nothing about its other links.

Links about which the messages say nothing are not returned: the controller keeps
their last level (its direct ``link`` channels), as the simulated loop keeps the level
of a link no measurement window saturates (paper §5).
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["infer_levels", "SLOW", "TIE"]

#: a message below this share of its nominal speed is slow
SLOW = 0.85
#: drains within this share of each other are tied
TIE = 0.02


def infer_levels(messages: Sequence[tuple[Mapping[int, float], float]], tol: float = 0.1
                 ) -> dict[int, tuple[float, float]]:
    """``{link: (level, weight)}`` from ``messages``, each ``(drains, seconds)``: the
    nominal drain of every link of its path and its measured seconds.  ``level`` is a
    share of nominal in ``(0, 1]``; ``weight`` the nominal seconds behind it (to merge
    collectives)."""
    bound: dict[int, float] = {}
    crossing: dict[int, int] = {}
    for drains, t in messages:
        for link, d in drains.items():
            bound[link] = max(bound.get(link, 0.0), d / t)
            crossing[link] = crossing.get(link, 0) + 1
    out: dict[int, tuple[float, float]] = {}
    slow = []
    for drains, t in messages:
        e = max(drains.values())
        if e / t < SLOW:
            slow.append((drains, t))
            continue
        for link, d in drains.items():                  # its bottleneck links are healthy
            if d >= (1 - TIE) * e:
                lvl, w = out.get(link, (0.0, 0.0))
                out[link] = ((lvl * w + min(1.0, d / t) * d) / (w + d), w + d)
    culprits: dict[int, tuple[float, float]] = {}
    left = list(range(len(slow)))
    while left:
        explains: dict[int, list[int]] = {}
        for i in left:
            drains, t = slow[i]
            for link, d in drains.items():
                if d / t >= (1 - tol) * bound[link] and bound[link] < SLOW:
                    explains.setdefault(link, []).append(i)
        if not explains:
            break
        key = (lambda l: (-len(explains[l]), -crossing[l]))
        ranked = sorted(explains, key=lambda l: (key(l), bound[l], l))
        best = ranked[0]
        tied = [l for l in ranked if key(l) == key(best) and set(explains[l]) == set(explains[best])]
        for link in tied:                      # indistinguishable: the path is that slow, charge all
            culprits[link] = (min(1.0, bound[link]), sum(slow[i][0][link] for i in explains[best]))
        left = [i for i in left if i not in explains[best]]
    out.update(culprits)                                  # a culprit's own bound wins
    return out
