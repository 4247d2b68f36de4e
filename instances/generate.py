"""Regenerate the JSON instances shipped under ``instances/data``.

Run ``python -m instances.generate``; the files are deterministic.
"""

from __future__ import annotations

from . import DATA_DIR, apply_failure, dgx, hpn, irregular, ring

SHAPES = [(1, 2, 4), (1, 2, 8), (1, 4, 8)]


def generate() -> list[str]:
    DATA_DIR.mkdir(exist_ok=True)
    topos = []
    for shape in SHAPES:
        base = hpn(*shape)
        topos += [apply_failure(base, f) for f in (None, "fail1", "fail2", "fail3")]
    topos += [dgx(), ring(8), irregular(1), irregular(4)]
    for topo in topos:
        topo.save(DATA_DIR / f"{topo.name}.json")
    return [t.name for t in topos]


if __name__ == "__main__":
    for name in generate():
        print(name)
