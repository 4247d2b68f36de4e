"""Pair telemetry of real ranks in the topology's units (docs/executor.md, "Scenarios on
real ranks"): :class:`ModelReporter` turns a collective's per-pair seconds into the
controller's ``pair`` samples against the schedule's own round model, and
:class:`PieceWindow` reads the telemetry of a collective run in pieces in windows bounded
in time (paper §3.2-3.3, §5).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np

from .faults import FabricEmulator
from .telemetry import LinkSample

__all__ = ["EARLY_DROP", "LOW", "PROBE_OVER_COST", "ModelReporter", "PieceWindow"]

LOW = 0.95              # a pair reported below this share of nominal is probed once unused
#: a probe is sent, and raises a level, only when at the pair's current level it would take
#: at least this many times its own cost (docs/executor.md, "Late receivers and short probes")
PROBE_OVER_COST = 3.0
#: a drop is reported from two samples in a row when both read below this share of the
#: reported level: deeper than any stall of a busy core measured on 8 gloo ranks (the
#: lowest stalled reading of 23 316: 0.38; AllGather ``three``'s NVSwitch links at 800 of
#: 2880 Gbps, 0.28, are read in two windows like its NIC, so one version covers both);
#: shallower drops need 3 of ``drop_window`` samples (docs/executor.md, "Stalls are not drops")
DEEP = 0.3
#: with ``ModelReporter(early=True)``, a drop not reported yet is sent as an ``early`` estimate
#: once the two newest samples agree and read more than this share below the reported level
#: (the level estimator's ``2 k``: a change worth acting on; docs/executor.md, "Speculation
#: on real ranks")
EARLY_DROP = 0.1


class ModelReporter:
    """Executor telemetry in the topology's units, for the controller's ``pair`` samples.

    A message's time on the emulated fabric depends on how many messages share its
    links in its round, which changes with the schedule; so each pair's measured
    seconds over a collective are compared with the seconds the schedule's own round
    model predicts on the *nominal* fabric (:meth:`FabricEmulator.program_delays`).
    gloo adds a roughly fixed cost per message (posting, copying, waking the receiving
    thread), which would make a slow link look faster than it is if it were divided
    out as a ratio; so the healthy warm-up collectives (:attr:`calibrating`, like the
    paper's startup probing) estimate it per message, as the median of
    ``(measured - expected) / messages`` of the pair (for a pair first used later, of
    all pairs), and later samples report
    ``nominal * min(1, expected / (measured - messages * cost))``.  Each pair reports
    the median of its last ``window`` collectives: the median of a few measurement
    windows (paper §5) ignores one slow collective (a busy shared core) and follows a
    lasting rise after ``window // 2 + 1`` collectives.  A drop needs more: a busy core
    stalls a rank for up to ~50 ms, sometimes in two of three collectives, and a pair of
    ~10 ms messages then reads 0.4-0.7 of nominal twice; so a drop is reported once the
    median of the last ``drop_window`` (5) samples shows it (3 of 5 windows), or at once
    from two samples in a row that both read below ``DEEP`` times the reported level (a
    dead or 1/8 link, which no stall mimics).  A confirmed drop of more than
    ``EARLY_DROP`` whose two newest samples agree (within ``1 + tol``) is reported at the
    median of the last ``window`` samples, the level they agree on, not the 5-sample
    median: a collective straddling a ramp step reads in between (278 and 163 Gbps for
    steps to 225 and 137.5) and that median was the in-between reading, a version more
    (issue 26).  A sample shorter than
    ``PROBE_OVER_COST`` times its messages' cost cannot tell the link from that cost (an
    AllToAll block on an NVSwitch link is emulated in 0.2 ms, gloo's cost is 1-10 ms on
    shared cores; a schedule loading a recovered link lightly reads it part-way up), so
    it carries no news: it counts as the pair's level, and a rise marks the pair ``blind``
    (probed alone while low); a link that slows such messages past that is seen.

    A pair's ratio ``expected / measured`` is exact only for a degraded link that is also
    the pair's bottleneck on the nominal fabric.  Once a new schedule moves load off a
    degraded link, another link of the path becomes the nominal bottleneck and the ratio
    overstates the degraded one (a link at 800 Gbps read as 1200-2880 on real ranks, so
    the controller published a version per swap).  So a sample of the program the pair's
    level was measured on is taken as it is (the same bottlenecks: a rise is real, and a
    slow collective's dip recovers; a new program's readings become the pair's after two
    samples in a row within ``1 + tol`` of its level: the first collective after a swap
    is often slow, and one low reading must not adopt a program that reads high), while
    a sample of another program may lower the level or raise it by at most ``1 + tol``.
    A larger rise carries no news: the level is reported again and the pair is
    ``blind``, so the prober measures it alone (:class:`~executor_cuda.reporting.PairProber`).
    (Taking such a rise as far as every link of the path proves it in the round model,
    :meth:`proven`, was tried: ranks do not run rounds in lock step, so the "proven"
    level still overstated the degraded link on real ranks.)  A pair first used by a
    later version starts at :meth:`proven`: low for a link its messages load lightly.

    A rise is reported once the samples it rests on agree (:meth:`_level`): the
    collective that runs while a link recovers reads between the old level and the new
    one (0.25-0.8 of nominal for a link going from 0.125 back to 1), and the median of
    ``[old, between, new]`` is that in-between reading, so a version was published for a
    partial recovery and another for the full one.  While the median rises but the two
    newest samples differ by more than ``1 + tol``, the last reported level stands, for
    at most ``window - 1`` samples in a row; a step up is then reported in one step, at
    the level the new samples agree on.  Drops are reported at once (a dead link's next
    collective may take seconds).
    """

    early = False                       # send drops still being confirmed as ``early`` (``__init__``)

    def __init__(self, emulator: FabricEmulator, nominal: dict[tuple[str, str], float],
                 window: int = 3, tol: float = 0.2, drop_window: int = 5, early: bool = False) -> None:
        self.emu = emulator
        self.early = early
        self.nominal = nominal
        self.nominal_cap = emulator.topo.arrays.capacity.astype(float)
        self.window = window
        self.drop_window = max(window, drop_window)
        self.tol = tol
        self.overhead: dict[tuple[str, str], list[float]] = {}
        self.recent: dict[tuple[str, str], deque[float]] = {}
        self.low: dict[tuple[str, str], bool] = {}          # last report below LOW x nominal
        self.blind: dict[tuple[str, str], bool] = {}        # last sample fit its level and nominal
        self.folded: dict[tuple[str, str], int | None] = {}  # id of the program the level is measured on
        self._agree: dict[tuple[str, str], tuple[int | None, int]] = {}   # (program, samples in a row at the level)
        self.shown: dict[tuple[str, str], float] = {}        # the level last reported
        self._held: dict[tuple[str, str], int] = {}          # samples in a row a rise was held
        self._calibrating = True
        self._expected: dict[int, tuple[Any, dict[tuple[int, int], np.ndarray]]] = {}
        self._messages: dict[int, tuple[Any, dict[tuple[int, int, int], float]]] = {}   # nominal s per message

    @property
    def calibrating(self) -> bool:
        """Whether the healthy warm-up is still running (samples set the per-message cost)."""
        return self._calibrating

    @calibrating.setter
    def calibrating(self, on: bool) -> None:
        """Ending the warm-up fills the window of every pair it measured with its healthy
        level, so the first collectives after it are judged like any later one: a level
        moves once enough samples agree (class docstring).  An empty window reported its first
        sample alone, and the first collectives after the warm-up are the ones a busy core
        stalls most (8 gloo ranks: a pair's first sample read 0.38-0.51 of nominal from 26-51
        ms of stall on ~10 ms messages; the controller published a version for it and one to
        undo it, docs/executor.md "Stalls are not drops")."""
        if self._calibrating and not on:
            for key in self.overhead:
                self.recent.setdefault(key, deque([1.0] * self.drop_window, maxlen=self.drop_window))
        self._calibrating = on

    def drains(self, prog: Any, elem_bytes: int) -> dict[tuple[int, int], np.ndarray]:
        """Per rank pair of ``prog``: nominal-fabric drain seconds, one row per message of
        the pair and one column per link of its route (:meth:`FabricEmulator.route_drains`)."""
        hit = self._expected.get(id(prog))
        if hit is None or hit[0] is not prog:
            rows: dict[tuple[int, int], list[np.ndarray]] = {}
            for (_, s, d), dr in self.emu.route_drains(prog, elem_bytes, self.nominal_cap).items():
                rows.setdefault((s, d), []).append(dr)
            hit = self._expected[id(prog)] = (prog, {k: np.vstack(v) for k, v in rows.items()})
        return hit[1]

    def expected(self, prog: Any, elem_bytes: int) -> dict[tuple[int, int], float]:
        """Nominal-fabric seconds per rank pair of one collective of ``prog``."""
        return {k: float(d.max(axis=1).sum()) for k, d in self.drains(prog, elem_bytes).items()}

    #: ratios tried when solving for a pair's proven level (:meth:`proven`)
    GRID = np.geomspace(1e-3, 1.0, 241)

    @classmethod
    def proven(cls, drains: np.ndarray, seconds: float) -> float:
        """The level every link of a pair's route must at least have for its messages
        (``drains``, :meth:`drains`) to have taken no more than ``seconds``: per link, the
        smallest ratio at which that link alone would not make them slower, and the
        lowest of these (the most lightly loaded link proves the least).  Delays (a busy
        core, the per-message cost) only add time, so this is a lower bound; a pair that
        loads one of its links lightly proves little about it, however fast it ran."""
        bottleneck = drains.max(axis=1)[None, :, None]
        t = np.maximum(bottleneck, drains[None, :, :] / cls.GRID[:, None, None]).sum(axis=1)  # grid x links
        # a time below the nominal model's (the per-message cost over-subtracted) proves no
        # more than the model's own time would: nominal on the bottleneck, little elsewhere
        ok = t <= max(seconds, float(t[-1].max()))
        return float(cls.GRID[ok.argmax(axis=0)].min())

    def level(self, key: tuple[str, str]) -> float | None:
        """The pair's current level: the median of its last ``window`` samples, or the
        level reported last while a drop below it is not yet confirmed; 1 for a pair
        measured in the healthy warm-up and not since, ``None`` for one never measured."""
        recent = self.recent.get(key)
        if recent:
            return max(statistics.median(list(recent)[-self.window:]), self.shown.get(key, 0.0))
        return 1.0 if key in self.overhead else None

    def _ratio(self, key: tuple[str, str], drains: np.ndarray, seconds: float,
               prog: int | None = None) -> float | None:
        """The ratio one collective's sample (of the program with id ``prog``) adds to the
        pair's median, ``None`` when it carries no news (class docstring)."""
        level, high = self.level(key), float(drains.max(axis=1).sum()) / seconds
        self.blind[key] = False
        if level is None:                   # a pair first used by a later version: only what it proves
            return self.proven(drains, seconds)
        if prog is not None and self.folded.get(key) == prog:
            return high                     # the program its level was measured on
        agree = level / (1.0 + self.tol) <= high <= (1.0 + self.tol) * level
        runs = self._agree.get(key, (None, 0))
        self._agree[key] = (prog, runs[1] + 1 if runs[0] == prog else 1) if agree else (None, 0)
        if self._agree[key][1] >= 2:        # two samples in a row that read the level:
            self.folded[key] = prog         # this program's readings are the pair's from now on
        if high <= (1.0 + self.tol) * level:
            return high                     # a drop, or a small rise
        self.blind[key] = True              # a larger rise read through another program's bottlenecks:
        return None                         # not news (the prober measures the pair alone)

    def __call__(self, samples: Sequence[LinkSample], prog: Any, elem_bytes: int,
                 now: float, times: int = 1, stalled: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
        """The ``pair`` samples of ``samples``, measured over ``times`` runs of ``prog``; a
        pair with an end in ``stalled`` (GPU ids, :class:`~executor_cuda.stalls.StallDetector`)
        that reads below its level carries no news: its level is reported again (a stall
        only slows; a rise is read as usual)."""
        out: list[dict[str, Any]] = []
        for s, dr, net, cost in self._measured(samples, prog, elem_bytes, times):
            key = (s.src, s.dst)
            level = self.level(key)
            if (s.src in stalled or s.dst in stalled) and level and float(dr.max(axis=1).sum()) / net < level:
                out.append(self._report(key, self.shown.get(key, level), now))
                continue
            ratio = self._ratio(key, dr, net, id(prog))
            if ratio is not None and level is not None and s.seconds < PROBE_OVER_COST * s.count * cost:
                self.blind[key] = ratio > level     # as short as gloo's cost: no news (a rise: probe it alone)
                ratio = level
            out.append(self._level(key, ratio, now) if ratio is not None
                       else self._report(key, self.shown.get(key, self.level(key)), now))
        return out

    def readings(self, samples: Sequence[LinkSample], prog: Any, elem_bytes: int) -> dict[tuple[int, int], float]:
        """Per rank pair ``(src, dst)`` of ``samples``: one collective's ratio to the pair's
        level (1: as before, below 1: slower), without folding it in; left out: pairs without
        a level, pairs whose level was measured on another program (after a swap a pair reads
        through other bottlenecks, class docstring), samples as short as gloo's cost (no
        news); none while calibrating."""
        rank = {g: r for r, g in enumerate(self.emu.gpus)}
        out: dict[tuple[int, int], float] = {}
        for s, dr, net, cost in ([] if self.calibrating else self._measured(samples, prog, elem_bytes)):
            level = self.level((s.src, s.dst))
            if level and self.folded.get((s.src, s.dst), id(prog)) == id(prog) \
                    and s.seconds >= PROBE_OVER_COST * s.count * cost:
                out[(rank[s.src], rank[s.dst])] = float(dr.max(axis=1).sum()) / net / level
        return out

    def _measured(self, samples: Sequence[LinkSample], prog: Any, elem_bytes: int,
                  times: int = 1) -> list[tuple[LinkSample, np.ndarray, float, float]]:
        """Per sample of a known pair: ``(sample, drains, seconds less gloo's per-message
        cost, that cost)``; while calibrating, samples set the cost and none is returned."""
        rank = {g: r for r, g in enumerate(self.emu.gpus)}
        drains = self.drains(prog, elem_bytes)
        if times > 1:
            drains = {k: np.tile(d, (times, 1)) for k, d in drains.items()}
        pooled = [x for h in self.overhead.values() for x in h]
        out = []
        for s in samples:
            key = (s.src, s.dst)
            dr = drains.get((rank.get(s.src, -1), rank.get(s.dst, -1)))
            exp = float(dr.max(axis=1).sum()) if dr is not None else 0.0
            if self.nominal.get(key) is None or exp <= 0 or s.seconds <= 0 or s.count < 1:
                continue
            if self.calibrating:
                self.overhead.setdefault(key, []).append((s.seconds - exp) / s.count)
                continue
            hist = self.overhead.get(key) or pooled
            if hist:
                cost = max(0.0, statistics.median(hist))
                out.append((s, dr, max(s.seconds - s.count * cost, 1e-9), cost))
        return out

    def progress(self, prog: Any, elem_bytes: int, rnd: int, src: int, dst: int, nbytes: int,
                 delivered: float, seconds: float, now: float) -> dict[str, Any] | None:
        """The ``pair`` sample of a message of round ``rnd`` of ``prog`` from rank ``src`` to
        rank ``dst`` still in flight: ``delivered`` of its ``nbytes`` bytes arrived in
        ``seconds`` (a window closed on time, :class:`~executor_cuda.abort.StaleAbort`), read
        against the message's nominal time in the round model, folded into the pair's
        median like a collective's sample.  It only lowers a level: a window that reads the
        level or more is not folded in (the message is still being measured); if the pair
        is low, its level is sent again, so the controller keeps hearing a link that stays
        low while no collective completes (its decisions follow telemetry: a drop heard
        within its dwell time after a version would otherwise wait for the stale
        collective's end).  ``None`` while calibrating, for pairs without a nominal level,
        and for a window that reads a pair that is not low at its level or more."""
        key = (self.emu.gpus[src], self.emu.gpus[dst])
        hit = self._messages.get(id(prog))
        if hit is None or hit[0] is not prog:
            hit = self._messages[id(prog)] = (prog, self.emu.program_delays(prog, elem_bytes, self.nominal_cap))
        expected = hit[1].get((rnd, src, dst), 0.0)
        if self.calibrating or key not in self.nominal or expected <= 0 or seconds <= 0 or nbytes <= 0:
            return None
        ratio, level = expected * delivered / nbytes / seconds, self.level(key)
        if level is not None and ratio >= level:
            return self._report(key, self.shown.get(key, level), now) if self.low.get(key) else None
        return self._level(key, ratio, now)

    def probe(self, src: str, dst: str, seconds: float, expected: float, now: float,
              cost: float = 0.0) -> dict[str, Any] | None:
        """The ``pair`` sample of one probe of ``src -> dst`` (one message measured
        ``seconds``: its emulated time, or the real one when gloo took longer; ``expected``
        on the nominal fabric), folded into the pair's median like a collective's sample
        (a pair with a level only rises: waiting for a busy core reads as a slow link);
        ``None`` while calibrating, for an unknown pair, or when at the pair's current
        level the probe would take less than ``PROBE_OVER_COST`` times its own ``cost``
        (real seconds of a probe on gloo, :meth:`PairProber.warm_up`): such a probe
        measures the cost, not the link (docs/executor.md, "Late receivers and short
        probes")."""
        key = (src, dst)
        level = self.level(key)
        if self.calibrating or key not in self.nominal or expected <= 0 \
                or expected / (self.shown.get(key, level) or 1.0) < PROBE_OVER_COST * cost:
            return None
        ratio = expected / max(seconds, 1e-9)
        # a late probe may only have waited for a busy core: it raises a level, never lowers one
        return self._level(key, ratio if level is None else max(ratio, level), now)

    def _level(self, key: tuple[str, str], ratio: float, now: float) -> dict[str, Any]:
        """Fold ``ratio`` into the pair's median and report it; a rise whose two newest
        samples disagree by more than ``1 + tol`` is held, a drop waits for 3 of
        ``drop_window`` samples unless the two newest are below ``DEEP`` (class docstring)."""
        recent = self.recent.setdefault(key, deque(maxlen=self.drop_window))
        recent.append(min(1.0, ratio))
        window = list(recent)
        level, last = statistics.median(window[-self.window:]), self.shown.get(key)
        newest = sorted(window[-2:])
        if last is not None and level < last and not (len(newest) == 2 and newest[1] < DEEP * last):
            agree = len(newest) == 2 and newest[1] <= (1.0 + self.tol) * newest[0]
            confirmed = statistics.median(window)                         # 3 of drop_window below last
            # a drop some stalls could make: reported once confirmed, at the level of the newest
            # windows when the two newest agree and the drop is one (not a straddling window's
            # in-between reading; nor noise under ``last`` beside two stalls)
            level = min(last, level if agree and confirmed < (1.0 - EARLY_DROP) * last else max(level, confirmed))
        if (last is not None and level > last and len(newest) == 2
                and newest[1] > (1.0 + self.tol) * newest[0] and self._held.get(key, 0) < self.window - 1):
            self._held[key] = self._held.get(key, 0) + 1
            return self._report(key, last, now)
        self._held[key] = 0
        return self._report(key, level, now, self._early(newest, level))

    def _early(self, newest: list[float], level: float) -> float | None:
        """The ``early`` estimate of a drop not reported yet (class docstring): the mean of
        the two newest samples when they agree within ``1 + tol`` and read more than
        ``EARLY_DROP`` below ``level``, the level being reported; ``None`` otherwise."""
        if not self.early or len(newest) < 2 or newest[1] > (1.0 + self.tol) * newest[0]:
            return None
        mean = 0.5 * (newest[0] + newest[1])
        return mean if mean < (1.0 - EARLY_DROP) * level else None

    def _report(self, key: tuple[str, str], level: float, now: float,
                early: float | None = None) -> dict[str, Any]:
        self.shown[key] = level
        gbps = self.nominal[key] * level
        self.low[key] = gbps < LOW * self.nominal[key]
        out = {"kind": "pair", "src": key[0], "dst": key[1], "gbps": gbps, "t": now}
        if early is not None:
            out["early"] = self.nominal[key] * early
        return out


class PieceWindow:
    """Telemetry of collectives run in pieces (:class:`~executor_cuda.pieces.InFlightSwitch`),
    read in windows bounded in time as well as in bytes.

    A healthy collective is read once, when it ends (:meth:`flush`), like one run whole:
    pieces are small and gloo's per-message cost would make per-piece samples noisy (8
    pieces per collective read healthy links at 0.5-0.7 of nominal and published a
    version every second).  But a collective on a link at 1 % of nominal lasts 100
    healthy ones; once the pieces since the last report have taken ``window_s`` (three
    healthy collectives, pieces included, as the warm-up measured), what they measured
    is reported at the end of the piece, so the controller hears of the drop after a piece or two and the new version
    can take over inside the same collective.  ``read()`` drains the rank's telemetry,
    ``report(samples, prog, times)`` folds samples that ran ``prog`` ``times`` times
    (:meth:`ModelReporter.__call__`) and pushes them.
    """

    def __init__(self, read: Callable[[], list[LinkSample]],
                 report: Callable[[list[LinkSample], Any, int], None], window_s: float) -> None:
        self.read, self.report, self.window_s = read, report, window_s
        self._samples: list[LinkSample] = []
        self._prog: Any = None
        self._pieces = 0
        self._since = time.monotonic()

    def piece(self, prog: Any) -> None:
        """One piece of ``prog`` (the piece-size program) ended."""
        if self._prog is not None and prog is not self._prog:    # a switch: one program per window
            self.flush()
        self._prog = prog
        self._pieces += 1
        self._samples += self.read()
        if time.monotonic() - self._since >= self.window_s:
            self.flush()

    def flush(self) -> None:
        """Report what the pieces since the last report measured (a collective ended)."""
        self._samples += self.read()
        if self._samples and self._prog is not None:
            acc: dict[tuple[str, str], list] = {}
            for x in self._samples:
                a = acc.setdefault((x.src, x.dst), [0, 0.0, 0, x.first_seq, x.last_seq])
                a[0], a[1], a[2] = a[0] + x.bytes, a[1] + x.seconds, a[2] + x.count
                a[3], a[4] = min(a[3], x.first_seq), max(a[4], x.last_seq)
            self.report([LinkSample(src, dst, *a) for (src, dst), a in acc.items()], self._prog, self._pieces)
        self._samples, self._prog, self._pieces = [], None, 0
        self._since = time.monotonic()
