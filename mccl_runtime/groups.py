"""Communicators over sub-fabrics: one controller for a job's many groups.

A job's tensor-, data- and expert-parallel communicators each span a subset of the
measured fabric's GPUs.  :class:`Groups` keeps each communicator's members and the
sub-fabric they induce (:func:`mccl_opt.subfabric.induced`: members, switches, no other
GPU); the :class:`~mccl_runtime.manager.ScheduleManager` synthesizes a member
communicator's collectives on that sub-fabric under the measured capacities.

Algorithm 1 (paper §3.2) runs on every collective at once over the *parent* fabric's
links (:class:`~mccl_runtime.drift.ProfileStack`), so a sub-fabric schedule's profile is
lifted onto them (:func:`lift_profile`): ``n`` and the share loads are zero on links
outside the sub-fabric and the cut names parent links.  Algorithm 1 on the lifted
profile is Algorithm 1 on the sub-fabric, because a link with ``n_a = 0`` enters neither
``x_min`` nor the cut.  The tests that compare capacities (capacity gained, superseded,
known fabric) look only at the sub-fabric's links (:meth:`Groups.links`), so a drift
elsewhere in the cluster never touches the communicator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mccl_opt.errors import TopologyError
from mccl_opt.subfabric import SubFabric, check_members, induced
from mccl_opt.topology import Topology

from .drift import ScheduleProfile

__all__ = ["Groups", "lift_profile"]


def lift_profile(profile: ScheduleProfile, sub: SubFabric) -> ScheduleProfile:
    """``profile`` (on the sub-fabric's links) on the parent fabric's links."""
    arrays = (sub.lift(profile.n), np.asarray(sub.links[profile.cut], dtype=np.int64),
              np.array(profile.base_slack, dtype=float), sub.lift(profile.loads))
    for arr in arrays:
        arr.setflags(write=False)
    return ScheduleProfile(*arrays)


class Groups:
    """Each communicator's members (``None``: the whole fabric) and their sub-fabrics,
    shared by communicators with the same member list."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._members: dict[str, tuple[str, ...] | None] = {}
        self._fabrics: dict[tuple[str, ...], SubFabric] = {}
        self._measured: dict[tuple[str, ...] | None, tuple[bytes, Topology]] = {}
        self._masks: dict[tuple[str, ...] | None, np.ndarray] = {}

    def members(self, comm: str, gpus: Any = None) -> tuple[str, ...] | None:
        """The members of ``comm`` once ``gpus`` is checked: a new communicator takes
        ``gpus`` (``None``, or every GPU in rank order: the whole fabric); a known one
        must be given ``None`` or the same list.  Raises :class:`TopologyError` for bad
        or disconnected members (nothing is recorded then)."""
        known = self._members.get(comm, ())
        if gpus is None:
            return known if known != () else None
        members = check_members(self.topo, gpus)
        if members == self.topo.gpus:
            members = None
        if known != () and known != members:
            shown = "the whole fabric" if known is None else f"{len(known)} GPUs from {known[0]!r}"
            raise TopologyError(f"communicator {comm[:40]!r} is registered over {shown}; register its "
                                "collectives with the same members, or under another communicator name")
        if members is not None:
            self.fabric(members)                  # a disconnected group fails here, before anything
        return members

    def bind(self, comm: str, members: tuple[str, ...] | None) -> None:
        """Record ``comm``'s members (after :meth:`members` accepted them)."""
        self._members.setdefault(comm, members)

    def unbind(self, comm: str) -> None:
        """Forget ``comm``'s members (its last collective was unregistered)."""
        self._members.pop(comm, None)

    def fabric(self, members: tuple[str, ...]) -> SubFabric:
        """The sub-fabric ``members`` induce (built once)."""
        sub = self._fabrics.get(members)
        if sub is None:
            sub = self._fabrics[members] = induced(self.topo, members)
        return sub

    def links(self, members: tuple[str, ...] | None) -> np.ndarray | slice:
        """The parent links of a communicator's fabric (every link: ``slice(None)``)."""
        return slice(None) if members is None else self.fabric(members).links

    def mask(self, members: tuple[str, ...] | None) -> np.ndarray:
        """:meth:`links` as a mask over the parent links (read only, built once)."""
        mask = self._masks.get(members)
        if mask is None:
            mask = self._masks[members] = np.zeros(self.topo.num_links, dtype=bool)
            mask[self.links(members)] = True
            mask.setflags(write=False)
        return mask

    def topology(self, members: tuple[str, ...] | None, capacity: np.ndarray) -> Topology:
        """The communicator's fabric under the parent capacities ``capacity``.  The last
        one built per member list is kept (topologies are immutable): collectives that
        register on one ``M`` (a job's start) share it instead of each validating a copy."""
        capacity = np.asarray(capacity, dtype=float)
        key = capacity.tobytes()
        last = self._measured.get(members)
        if last is not None and last[0] == key:
            return last[1]
        topo = self.topo.with_capacities(capacity) if members is None else self.fabric(members).measured(capacity)
        self._measured[members] = (key, topo)
        return topo

    def lift(self, members: tuple[str, ...] | None, profile: ScheduleProfile) -> ScheduleProfile:
        """A job's profile on the parent fabric's links."""
        return profile if members is None else lift_profile(profile, self.fabric(members))
