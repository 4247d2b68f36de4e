"""A :class:`~mccl_runtime.telemetry.MeasurementStore` in the state file and back: its channels
(direct, pair and host-reduction, each with its value and last time) and its counters, so a
restarted controller keeps the ``M`` it had (paper §3.2; docs/runtime.md, "State file")."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Mapping

from mccl_opt.errors import TelemetryError

from .channels import FULL, MAX_KEYED_CHANNELS
from .keyed import host_key
from .samples import parse_sample

if TYPE_CHECKING:
    from .telemetry import MeasurementStore

__all__ = ["store_to_dict", "restore_store"]


def store_to_dict(store: "MeasurementStore") -> dict[str, Any]:
    """The store's channels that have a sample, and its counters."""
    links = store.topo.links
    return {
        "alpha": store.alpha,
        "direct": [{"src": links[a].src, "dst": links[a].dst, "value": v, "t": t}
                   for a, (v, t) in sorted(store._direct.items())],
        "pairs": [{"src": k[0], "dst": k[1], "value": v, "t": t}
                  for k, (v, t) in sorted(store._pairs.items())],
        "hosts": store.keyed.to_list(),
        "accepted": store.accepted,
        "rejected": dict(store.rejected),
    }


def restore_store(store: "MeasurementStore", data: Mapping[str, Any]) -> None:
    """Load what :func:`store_to_dict` wrote (same topology); raises
    :class:`~mccl_opt.errors.TelemetryError` for a corrupt entry."""
    try:
        direct = [(store.topo.link_index(d["src"], d["dst"]), float(d["value"]), float(d["t"]))
                  for d in data.get("direct", [])]
        chan = store.chan
        chan.clear()
        store._channels, store._trackers, store._layout = {}, {}, None
        store.rises.moved_t.clear()
        store.keyed.reset()
        for a, value, t in direct:
            chan.value[a], chan.t[a] = value, t
        for d in data.get("pairs", []):
            s = parse_sample({"kind": "pair", "src": d["src"], "dst": d["dst"], "gbps": 0.0, "t": 0.0})
            links, nominal = store.map.resolve(s)
            cid = _registered(chan.pair((s.src, s.dst), links, nominal))
            chan.value[cid], chan.t[cid] = float(d["value"]), float(d["t"])
        for d in data.get("hosts", []):
            a = store.topo.link_index(d["src"], d["dst"])
            kind = d.get("kind", "host")
            if kind not in ("host", "max"):
                raise KeyError(f"kind {kind!r}")
            cid = _registered(chan.pair(host_key(int(d["reporter"]), a, kind), (a,), float(chan.capacity[a])))
            chan.value[cid], chan.t[cid] = float(d["value"]), float(d["t"])
        store.accepted = int(data.get("accepted", 0))
        store.rejected = Counter({str(k): int(v) for k, v in dict(data.get("rejected", {})).items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise TelemetryError(f"telemetry state is corrupt ({exc}); delete the state file to start fresh") from None


def _registered(cid: int) -> int:
    """A restored channel's id; a state holding more keyed channels than a controller
    registers (:data:`~mccl_runtime.channels.MAX_KEYED_CHANNELS`) is corrupt."""
    if cid == FULL:
        raise TelemetryError(f"more than {MAX_KEYED_CHANNELS} pair and host channels")
    return cid
