"""What a JSON parse takes against what :func:`mccl_opt.files.parse_cost` said before it.

    python bench/bench_parse_memory.py                  # shapes sized to 16 MiB of estimate
    python bench/bench_parse_memory.py --limit-mib 64

For each JSON shape (hostile ones built to cost the most memory per byte of text, and one of
the project's own topologies), a file is written whose estimate is just under the limit,
then read with :func:`mccl_opt.files.read_json` (the reader every command and the
controller use) under ``tracemalloc``.  The table gives the file's size, the estimate,
the measured peak (the bytes read, the decoded text and the parsed objects together) and
their ratio: the estimate must stay above the peak (ratio below 1) for every shape, so a
file accepted under a limit never takes more than the limit to parse.  The second table
does the same for XML (:func:`mccl_opt.files.xml_parse_cost` against ``xml.etree``, as
the MSCCL, ForestColl and NCCL topology readers parse it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import tracemalloc
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mccl_opt.errors import MCCLError  # noqa: E402
from mccl_opt.files import parse_cost, read_json, xml_parse_cost  # noqa: E402

#: name -> one repeated unit of a top-level list (``{i}``: a number unique per unit)
SHAPES = {
    "empty objects": '{},',
    "empty lists": '[],',
    "one-key objects": '{"a":0},',
    "unique one-key objects": '{"k{i}":0},',
    "six-key objects": '{"a":0,"b":0,"c":0,"d":0,"e":0,"f":0},',
    "nested object": '{"a":{}},',
    "nested lists": '[[]],',
    "short strings": '"ab",',
    "unique strings": '"s{i}",',
    "empty strings": '"",',
    "floats": '1.5,',
    "exponents": '1e1,',
    "big integers": '123456789012,',
    "small integers": '7,',
    "non-ASCII strings": '"\u00e9\u4e2d",',
    "astral strings": '"\U0001f600",',
    "literals": 'null,',
    "one astral, then floats": '1.5,',
}
#: shapes whose first element is a string (one long string, or one making the text 4 bytes a character)
LEADS = {"one astral, then floats": '"\U0001f600",'}
LONG = {"long ASCII string": "a", "long string, one astral": "\U0001f600"}
#: XML: name -> one repeated unit inside a root element (``{i}``: a number unique per unit)
XML_SHAPES = {
    "empty elements": "<x/>",
    "one attribute": '<x a="1"/>',
    "unique attribute names": ' a{i}="1"',
    "nine attributes": '<x a="1" b="2" c="3" d="4" e="5" f="6" g="7" h="8" i="9"/>',
    "nested": "<x>",
    "text nodes": "<x>t</x>",
    "long text": "a",
    "character references": "&#233;",
    "astral character references": "&#128512;",
    "astral attributes": '<x a="\U0001f600"/>',
}


def _text(name: str, n: int) -> bytes:
    if name in LONG:                                   # one string of n characters, the last one given
        return ('["' + "a" * (n - 1) + LONG[name] + '"]').encode()
    unit = SHAPES[name].rstrip(",")
    body = ",".join(unit.replace("{i}", str(i)) for i in range(n)) if "{i}" in unit else ",".join([unit] * n)
    return ("[" + LEADS.get(name, "") + body + "]").encode()


def _sized(name: str, limit: int) -> bytes:
    """A text of shape ``name`` whose estimate is about 90% of ``limit``."""
    probe = _text(name, 1000)
    return _text(name, max(1, int(0.9 * limit / parse_cost(probe) * 1000)))


def _xml(name: str, n: int) -> bytes:
    unit = XML_SHAPES[name]
    body = "".join(unit.replace("{i}", str(i)) for i in range(n)) if "{i}" in unit else unit * n
    if name == "unique attribute names":
        return f"<r{body}/>".encode()
    return f"<r>{body}{'</x>' * n if name == 'nested' else ''}</r>".encode()


def _measure(parse: Callable[[], object]) -> int:
    """The peak of the memory ``parse`` takes (``tracemalloc``)."""
    tracemalloc.start()
    try:
        obj = parse()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del obj
    return peak


def _table(rows: list[tuple[str, bytes, int, int]], limit: int) -> float:
    """Print ``(shape, text, estimate, peak)`` rows; the worst peak/estimate."""
    print(f"{'shape':28s} {'file MiB':>9s} {'estimate MiB':>13s} {'peak MiB':>9s} {'peak/estimate':>14s} {'peak/limit':>11s}")
    for name, raw, cost, peak in rows:
        print(f"{name:28s} {len(raw) / 2**20:9.2f} {cost / 2**20:13.2f} {peak / 2**20:9.2f} "
              f"{peak / cost:14.2f} {peak / limit:11.2f}")
    worst = max(peak / cost for _, _, cost, peak in rows)
    print(f"worst peak/estimate: {worst:.2f} ({'bounded' if worst < 1 else 'NOT bounded'})\n")
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit-mib", type=int, default=16, help="the parse-cost limit the files are sized to")
    args = ap.parse_args(argv)
    limit = args.limit_mib << 20
    own = (ROOT / "instances" / "data" / "hpn-1x2x4.json").read_bytes()
    texts = [(name, _sized(name, limit)) for name in [*SHAPES, *LONG]]
    texts.append(("hpn-1x2x4.json (own)", own))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "x.json"
        for name, raw in texts:
            f.write_bytes(raw)
            cost = parse_cost(raw)
            rows.append((name, raw, cost, _measure(lambda: read_json(f, MCCLError, "test", max(limit, cost)))))
    worst = _table(rows, limit)
    rows = []
    for name in XML_SHAPES:
        n = max(1, int(0.9 * limit / xml_parse_cost(_xml(name, 1000)) * 1000))
        raw = _xml(name, n)
        rows.append((name, raw, xml_parse_cost(raw), len(raw) + _measure(lambda: ET.fromstring(raw.decode()))))
    worst = max(worst, _table(rows, limit))
    return 0 if worst < 1 else 1


if __name__ == "__main__":
    sys.exit(main())
