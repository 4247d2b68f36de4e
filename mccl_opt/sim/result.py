"""What a simulation returns: completion time, algbw and per-link throughput over time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np

from .model import SimulationError

__all__ = ["SimResult"]

LinkRef = Union[int, tuple[str, str]]


@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`mccl_opt.sim.simulate`.

    ``times`` (K+1 breakpoints, from 0 to ``completion_s``) and ``link_gbps`` (K x links)
    describe each link's achieved throughput as a step function: link ``a`` carried
    ``link_gbps[k, a]`` Gbps during ``[times[k], times[k+1])``.  Consecutive equal rows
    are merged.  ``fluid_rate_gbps`` is the rate the schedule's link loads allow at the
    initial capacities (``schedule_rate``); ``fluid_time_s`` the time that rate implies.
    """

    collective: str
    num_gpus: int
    message_bytes: float
    completion_s: float
    fluid_rate_gbps: float
    link_names: tuple[tuple[str, str], ...]
    times: np.ndarray
    link_gbps: np.ndarray
    num_streams: int
    num_events: int
    wall_s: float
    _index: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index.update({name: a for a, name in enumerate(self.link_names)})

    # ------------------------------------------------------------------ headline figures
    @property
    def algbw_gbytes_per_s(self) -> float:
        """nccl-tests algorithm bandwidth ``N * message_bytes / time`` in GB/s (README "Units and definitions")."""
        return self.num_gpus * self.message_bytes / self.completion_s / 1e9

    @property
    def fluid_time_s(self) -> float:
        """``8 * message_bytes / fluid_rate``: the time the schedule's claimed rate implies."""
        return 8.0 * self.message_bytes / (self.fluid_rate_gbps * 1e9)

    @property
    def efficiency(self) -> float:
        """``fluid_time_s / completion_s`` (1 = the schedule runs at its claimed rate;
        below 1: pipeline fill, latency, unfair sharing or a capacity drop)."""
        return self.fluid_time_s / self.completion_s

    # ------------------------------------------------------------------ link telemetry
    def _link(self, link: LinkRef) -> int:
        if isinstance(link, tuple):
            try:
                return self._index[link]
            except KeyError:
                raise SimulationError(f"{link!r} is not a link of the simulated topology") from None
        if not 0 <= int(link) < len(self.link_names):
            raise SimulationError(f"link index {link} out of range 0..{len(self.link_names) - 1}")
        return int(link)

    def link_throughput(self, link: LinkRef) -> tuple[np.ndarray, np.ndarray]:
        """``(times, gbps)`` of one link (index or ``(src, dst)``): a step function,
        ``gbps[k]`` during ``[times[k], times[k+1])``; ``len(times) == len(gbps) + 1``."""
        return self.times.copy(), self.link_gbps[:, self._link(link)].copy()

    def link_bytes(self) -> np.ndarray:
        """Bytes each link carried over the whole run (link order)."""
        dt = np.diff(self.times)
        return (dt @ self.link_gbps) * 1e9 / 8.0

    def mean_link_throughput(self) -> np.ndarray:
        """Each link's average throughput (Gbps) over ``[0, completion_s]``."""
        return self.link_bytes() * 8.0 / 1e9 / self.completion_s

    def sampled_throughput(self, interval_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Throughput averaged over bins of ``interval_s``: ``(bin_starts, gbps[bins, links])``,
        the view a periodic telemetry sampler would report."""
        if not interval_s > 0:
            raise SimulationError(f"interval_s must be > 0, got {interval_s!r}")
        n_bins = max(1, int(np.ceil(self.completion_s / interval_s - 1e-9)))
        edges = np.minimum(np.arange(n_bins + 1) * interval_s, self.completion_s)
        cum = np.zeros((self.times.size, self.link_gbps.shape[1]))
        cum[1:] = np.cumsum(np.diff(self.times)[:, None] * self.link_gbps, axis=0)
        at_edges = np.stack([np.interp(edges, self.times, cum[:, a]) for a in range(cum.shape[1])], axis=1)
        width = np.diff(edges)
        width[width <= 0] = np.inf
        return edges[:-1], np.diff(at_edges, axis=0) / width[:, None]

    def summary(self) -> dict[str, float]:
        """Headline figures as a JSON-able dict."""
        return {"collective": self.collective, "gpus": self.num_gpus,
                "message_bytes": self.message_bytes, "completion_s": self.completion_s,
                "algbw_gbytes_per_s": self.algbw_gbytes_per_s,
                "fluid_rate_gbps": self.fluid_rate_gbps, "fluid_time_s": self.fluid_time_s,
                "efficiency": self.efficiency, "streams": self.num_streams,
                "events": self.num_events, "wall_s": self.wall_s}
