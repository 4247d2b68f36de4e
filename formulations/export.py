"""MPS and CPLEX-LP writers for :class:`~formulations.lp.LinearProgram`, and a free-MPS
reader that re-imports what :func:`write_mps` writes (and ordinary free MPS files).

Conventions of the files written here (any MPS/LP reader, e.g. HiGHS ``readModel``,
Gurobi ``read``, SCIP ``readProblem`` loads them):

* MPS is written in free format with an ``OBJSENSE`` section (``MAX``/``MIN``); the
  objective constant is the negated RHS of the objective row (the usual convention).
* A row ``lo <= a x <= hi`` with both sides finite and different is an ``L`` row with
  RHS ``hi`` and a RANGES entry ``hi - lo``; a row with no finite side is an ``N`` row
  after the objective (readers that drop extra ``N`` rows, like HiGHS by default, see
  one row fewer).  LP files have no two-sided rows, so a range row is written as CPLEX
  does, ``a x - Rg<row> = 0`` with a column ``lo <= Rg<row> <= hi`` appended after the
  model's columns; a free row is ``a x >= -inf``; an objective constant is the cost of
  a column ``obj_constant`` fixed at 1 (as Gurobi writes it).
* Integer columns sit between ``MARKER INTORG/INTEND`` lines and always get explicit
  bounds, so no reader applies the old "integer without bounds is binary" rule.
* Names: ``col_names``/``row_names`` are used when every name on that axis is a valid,
  unique identifier for the format; otherwise that axis is written as ``x<j>``/``r<i>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .errors import FormulationError
from .lp import LinearProgram

__all__ = ["write_mps", "write_lp", "read_mps"]

_MPS_NAME = re.compile(r"^\S{1,255}$")
# CPLEX LP identifiers: no leading digit/period, not a number in exponent form, no operators.
_LP_NAME = re.compile(r"^[A-Za-z_!\"#$%&(),;?@`'{}|~][A-Za-z0-9_!\"#$%&(),.;?@`'{}|~\[\]]{0,254}$")
_LP_RESERVED = {"st", "s.t.", "subject", "to", "bounds", "bound", "free", "inf", "infinity",
                "end", "general", "generals", "gen", "binary", "binaries", "bin",
                "maximize", "minimize", "max", "min", "maximum", "minimum"}


def _fmt(v: float) -> str:
    """Shortest text that reads back as exactly ``v``."""
    return repr(float(v))


def _names(given: Sequence[str] | None, count: int, prefix: str, valid) -> list[str]:
    if given is not None and len(set(given)) == count and all(valid(s) for s in given):
        return list(given)
    return [f"{prefix}{k}" for k in range(count)]


def _valid_lp_name(s: str) -> bool:
    return (bool(_LP_NAME.match(s)) and s.lower() not in _LP_RESERVED
            and not re.match(r"^[eE][0-9+-]", s))


def _fresh(name: str, taken: Iterable[str]) -> str:
    taken = set(taken)
    while name in taken:
        name += "_"
    return name


# ---------------------------------------------------------------------------- MPS
def write_mps(lp: LinearProgram, path: str | Path) -> Path:
    """Write ``lp`` as a free-format MPS file (see module docstring); returns the path."""
    path = Path(path)
    cols = _names(lp.col_names, lp.num_cols, "x", lambda s: bool(_MPS_NAME.match(s)))
    rows = _names(lp.row_names, lp.num_rows, "r", lambda s: bool(_MPS_NAME.match(s)))
    obj = _fresh("OBJ", rows)
    lo, hi = lp.row_lo, lp.row_hi
    eq = lo == hi
    fin_lo, fin_hi = np.isfinite(lo), np.isfinite(hi)
    kind = np.where(eq, "E", np.where(fin_hi, "L", np.where(fin_lo, "G", "N")))
    rhs = np.where(eq | fin_hi, hi, np.where(fin_lo, lo, 0.0))
    ranged = ~eq & fin_lo & fin_hi

    out = [f"NAME {lp.name if _MPS_NAME.match(lp.name or '') else 'mccl'}",
           "OBJSENSE", "    MAX" if lp.sense == "max" else "    MIN", "ROWS", f" N  {obj}"]
    out += [f" {k}  {r}" for k, r in zip(kind.tolist(), rows)]
    out.append("COLUMNS")
    A = lp.A.tocsc()
    in_int = False
    for j in range(lp.num_cols):
        integer = bool(lp.integrality[j])
        if integer != in_int:
            out.append(f"    MARKER 'MARKER' '{'INTORG' if integer else 'INTEND'}'")
            in_int = integer
        entries = [(obj, lp.c[j])] if lp.c[j] != 0 else []
        s, e = A.indptr[j], A.indptr[j + 1]
        entries += [(rows[i], v) for i, v in zip(A.indices[s:e].tolist(), A.data[s:e].tolist())]
        if not entries:  # a column must appear in COLUMNS to exist
            entries = [(obj, 0.0)]
        out += [f"    {cols[j]} {r} {_fmt(v)}" for r, v in entries]
    if in_int:
        out.append("    MARKER 'MARKER' 'INTEND'")
    out.append("RHS")
    if lp.objective_offset:
        out.append(f"    RHS {obj} {_fmt(-lp.objective_offset)}")
    out += [f"    RHS {rows[i]} {_fmt(rhs[i])}" for i in np.flatnonzero((rhs != 0) & (kind != "N"))]
    if ranged.any():
        out.append("RANGES")
        out += [f"    RNG {rows[i]} {_fmt(hi[i] - lo[i])}" for i in np.flatnonzero(ranged)]
    out.append("BOUNDS")
    for j in range(lp.num_cols):
        out += [f" {t} BND {cols[j]}" + (f" {_fmt(v)}" if v is not None else "")
                for t, v in _mps_bounds(lp.col_lo[j], lp.col_hi[j], bool(lp.integrality[j]))]
    out.append("ENDATA")
    path.write_text("\n".join(out) + "\n")
    return path


def _mps_bounds(lo: float, hi: float, integer: bool) -> list[tuple[str, float | None]]:
    """MPS bound records for one column (default bounds are [0, inf))."""
    if lo == hi:
        return [("FX", lo)]
    if np.isneginf(lo) and np.isposinf(hi):
        return [("FR", None)]
    recs: list[tuple[str, float | None]] = []
    if np.isneginf(lo):
        recs.append(("MI", None))
    elif lo != 0 or integer:
        recs.append(("LO", lo))
    if np.isfinite(hi):
        recs.append(("UP", hi))
    elif integer:
        recs.append(("PL", None))
    return recs


def read_mps(path: str | Path) -> LinearProgram:
    """Read a free-format MPS file into a :class:`LinearProgram`.

    Supports NAME, OBJSENSE, ROWS (the first N row is the objective, later N rows are
    free rows), COLUMNS with integer markers, RHS, RANGES and BOUNDS of types
    UP/LO/FX/FR/MI/PL/BV/LI/UI.  Raises :class:`FormulationError` naming the line of
    anything else.
    """
    text = Path(path).read_text().splitlines()
    name, sense = "mccl", "min"
    obj: str | None = None
    row_index: dict[str, int] = {}
    row_kind: list[str] = []
    col_index: dict[str, int] = {}
    costs: list[float] = []
    integer: list[bool] = []
    ent_r: list[int] = []
    ent_c: list[int] = []
    ent_v: list[float] = []
    rhs: dict[int, float] = {}
    rng: dict[int, float] = {}
    bounds: list[tuple[int, str, float | None, int]] = []
    offset = 0.0
    section = ""
    in_int = False

    def bad(lineno: int, why: str) -> FormulationError:
        return FormulationError(f"{path}: line {lineno}: {why}")

    for lineno, raw in enumerate(text, 1):
        line = raw.split("$", 1)[0].rstrip() if not raw.startswith("*") else ""
        if not line.strip():
            continue
        tok = line.split()
        if not raw[0].isspace():
            section = tok[0].upper()
            if section == "NAME":
                name = tok[1] if len(tok) > 1 else name
            elif section == "OBJSENSE" and len(tok) > 1:
                sense = _sense(tok[1], lambda why: bad(lineno, why))
            elif section == "ENDATA":
                break
            elif section not in ("ROWS", "COLUMNS", "RHS", "RANGES", "BOUNDS", "OBJSENSE"):
                raise bad(lineno, f"unsupported section {section!r}")
            continue
        if section == "OBJSENSE":
            sense = _sense(tok[0], lambda why: bad(lineno, why))
        elif section == "ROWS":
            kind, rname = tok[0].upper(), tok[1]
            if kind == "N" and obj is None:
                obj = rname
            elif kind in ("N", "L", "G", "E"):
                row_index[rname] = len(row_kind)
                row_kind.append(kind)
            else:
                raise bad(lineno, f"unknown row type {kind!r}")
        elif section == "COLUMNS":
            if len(tok) >= 3 and tok[1].strip("'\"").upper() == "MARKER":
                in_int = tok[2].strip("'\"").upper() == "INTORG"
                continue
            cname = tok[0]
            if cname not in col_index:
                col_index[cname] = len(costs)
                costs.append(0.0)
                integer.append(in_int)
            j = col_index[cname]
            for rname, val in _pairs(tok[1:], lambda why: bad(lineno, why)):
                if rname == obj:
                    costs[j] = val
                elif rname in row_index:
                    ent_r.append(row_index[rname])
                    ent_c.append(j)
                    ent_v.append(val)
                else:
                    raise bad(lineno, f"unknown row {rname!r}")
        elif section in ("RHS", "RANGES"):
            body = tok[1:] if len(tok) % 2 == 1 else tok
            for rname, val in _pairs(body, lambda why: bad(lineno, why)):
                if rname == obj and section == "RHS":
                    offset = -val
                elif rname in row_index:
                    (rhs if section == "RHS" else rng)[row_index[rname]] = val
                else:
                    raise bad(lineno, f"unknown row {rname!r}")
        elif section == "BOUNDS":
            btype = tok[0].upper()
            if btype in ("FR", "MI", "PL", "BV") and len(tok) in (2, 3):
                cname, val = tok[-1], None
            elif len(tok) == 4:
                cname, val = tok[2], float(tok[3])
            elif len(tok) == 3:
                cname, val = tok[1], float(tok[2])
            else:
                raise bad(lineno, f"cannot parse bound record {line.strip()!r}")
            if cname not in col_index:
                raise bad(lineno, f"bound on unknown column {cname!r}")
            bounds.append((col_index[cname], btype, val, lineno))

    n, m = len(costs), len(row_kind)
    col_lo, col_hi = np.zeros(n), np.full(n, np.inf)
    is_int = np.array(integer, dtype=bool)
    for j, btype, val, lineno in bounds:
        if btype in ("UP", "UI"):
            col_hi[j] = val
            if val < 0 and col_lo[j] == 0:
                col_lo[j] = -np.inf  # the classic MPS rule for a negative upper bound
        elif btype in ("LO", "LI"):
            col_lo[j] = val
        elif btype == "FX":
            col_lo[j] = col_hi[j] = val
        elif btype == "FR":
            col_lo[j], col_hi[j] = -np.inf, np.inf
        elif btype == "MI":
            col_lo[j] = -np.inf
        elif btype == "PL":
            col_hi[j] = np.inf
        elif btype == "BV":
            col_lo[j], col_hi[j] = 0.0, 1.0
        else:
            raise FormulationError(f"{path}: line {lineno}: unsupported bound type {btype!r}")
        if btype in ("BV", "LI", "UI"):
            is_int[j] = True
    row_lo, row_hi = _row_bounds(row_kind, rhs, rng)
    A = sp.csr_matrix((ent_v, (ent_r, ent_c)), shape=(m, n))
    by_col = sorted(col_index, key=col_index.__getitem__)
    by_row = sorted(row_index, key=row_index.__getitem__)
    return LinearProgram(c=np.array(costs), A=A, row_lo=row_lo, row_hi=row_hi, col_lo=col_lo,
                         col_hi=col_hi, integrality=is_int, sense=sense, col_names=by_col,
                         row_names=by_row, name=name, objective_offset=offset)


def _sense(word: str, bad) -> str:
    w = word.upper()
    if w in ("MAX", "MAXIMIZE", "MAXIMISE"):
        return "max"
    if w in ("MIN", "MINIMIZE", "MINIMISE"):
        return "min"
    raise bad(f"unknown OBJSENSE {word!r}")


def _pairs(tok: list[str], bad) -> list[tuple[str, float]]:
    if len(tok) not in (2, 4):
        raise bad(f"expected one or two (name, value) pairs, got {tok}")
    try:
        return [(tok[k], float(tok[k + 1])) for k in range(0, len(tok), 2)]
    except ValueError as exc:
        raise bad(str(exc)) from None


def _row_bounds(kind: list[str], rhs: dict[int, float],
                rng: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """Row sides from row types, RHS and RANGES (MPS semantics)."""
    m = len(kind)
    lo, hi = np.full(m, -np.inf), np.full(m, np.inf)
    for i, k in enumerate(kind):
        b = rhs.get(i, 0.0)
        r = rng.get(i)
        if k == "L":
            hi[i] = b
            lo[i] = b - abs(r) if r is not None else -np.inf
        elif k == "G":
            lo[i] = b
            hi[i] = b + abs(r) if r is not None else np.inf
        elif k == "E":
            lo[i] = hi[i] = b
            if r is not None and r > 0:
                hi[i] = b + r
            elif r is not None and r < 0:
                lo[i] = b + r
    return lo, hi


# ---------------------------------------------------------------------------- LP
def write_lp(lp: LinearProgram, path: str | Path) -> Path:
    """Write ``lp`` in CPLEX LP format (see module docstring); returns the path."""
    path = Path(path)
    cols = _names(lp.col_names, lp.num_cols, "x", _valid_lp_name)
    rows = _names(lp.row_names, lp.num_rows, "r", _valid_lp_name)
    obj = _fresh("obj", rows)
    out = [f"\\ {lp.name}", "Maximize" if lp.sense == "max" else "Minimize"]
    # a column in no row must still appear somewhere, or readers drop it (with its bounds)
    shown = np.flatnonzero((lp.c != 0) | (np.diff(lp.A.tocsc().indptr) == 0))
    vals, names = lp.c[shown].tolist(), [cols[j] for j in shown]
    taken = set(cols) | set(rows)
    const = None
    if lp.objective_offset:
        # Not every reader takes a bare constant; a column fixed at 1 is portable.
        const = _fresh("obj_constant", taken)
        taken.add(const)
        vals.append(lp.objective_offset)
        names.append(const)
    terms = _terms(np.array(vals, dtype=float), names)
    if not terms and lp.num_cols:
        terms = [f"0 {cols[0]}"]
    out += _wrap(f" {obj}:", terms)
    out.append("Subject To")
    A = lp.A.tocsr()
    range_vars: list[tuple[str, float, float]] = []
    for i in range(lp.num_rows):
        s, e = A.indptr[i], A.indptr[i + 1]
        t = _terms(A.data[s:e], [cols[j] for j in A.indices[s:e]]) or [f"0 {cols[0]}"]
        lo, hi = lp.row_lo[i], lp.row_hi[i]
        if lo == hi:
            tail = f"= {_fmt(hi)}"
        elif np.isfinite(lo) and np.isfinite(hi):
            # LP files have no two-sided rows: a x - Rg = 0 with lo <= Rg <= hi, as CPLEX writes
            rg = _fresh(f"Rg{rows[i]}", taken)
            taken.add(rg)
            range_vars.append((rg, lo, hi))
            t, tail = t + [f"- 1 {rg}"], "= 0"
        elif np.isfinite(hi):
            tail = f"<= {_fmt(hi)}"
        elif np.isfinite(lo):
            tail = f">= {_fmt(lo)}"
        else:
            tail = ">= -inf"
        out += _wrap(f" {rows[i]}:", t + [tail])
    out.append("Bounds")
    for j in range(lp.num_cols):
        lo, hi, c = lp.col_lo[j], lp.col_hi[j], cols[j]
        if lo == hi:
            out.append(f" {c} = {_fmt(lo)}")
        elif np.isneginf(lo) and np.isposinf(hi):
            out.append(f" {c} free")
        elif lo != 0 or np.isfinite(hi):
            out.append(f" {_lp_num(lo)} <= {c} <= {_lp_num(hi)}")
    out += [f" {_fmt(lo)} <= {rg} <= {_fmt(hi)}" for rg, lo, hi in range_vars]
    if const is not None:
        out.append(f" {const} = 1")
    ints = [cols[j] for j in np.flatnonzero(lp.integrality)]
    if ints:
        out.append("General")
        out += _wrap("", ints)
    out.append("End")
    path.write_text("\n".join(out) + "\n")
    return path


def _lp_num(v: float) -> str:
    return "-inf" if np.isneginf(v) else "+inf" if np.isposinf(v) else _fmt(v)


def _terms(vals: np.ndarray, names: list[str]) -> list[str]:
    """Signed terms; the first carries no ``+`` (``lo <= + 1 x`` confuses LP parsers)."""
    out = [f"{'-' if v < 0 else '+'} {_fmt(abs(v))} {n}" for v, n in zip(vals.tolist(), names)]
    if out and out[0].startswith("+ "):
        out[0] = out[0][2:]
    return out


def _wrap(head: str, items: list[str], per_line: int = 8) -> list[str]:
    """Split a long expression over lines (LP readers cap line length)."""
    lines = []
    for k in range(0, max(len(items), 1), per_line):
        chunk = " ".join(items[k:k + per_line])
        lines.append(f"{head} {chunk}".rstrip() if k == 0 else f"   {chunk}")
    return lines
