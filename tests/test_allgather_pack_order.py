"""The repair packer's growth order and bookkeeping (mccl_opt/allgather/forestcoll/packing/growth_order.py,
repair.py): rails from links narrow both ways, per-class parts, class merging, and
packings that stay valid where the few-missing marks and the part counts cut scans."""

from __future__ import annotations

import numpy as np
import pytest

from instances import fail1, fail2, fail3, hpn
from instances.designs import fat_tree
from mccl_opt.allgather.forestcoll.packing.growth_order import growth_order
from mccl_opt.allgather.forestcoll.packing.repair import repair_pack
from tests.test_allgather import assert_packing_arrays, logical_graph


@pytest.fixture(scope="module")
def fail3_512():
    return logical_graph(fail3(hpn(8, 8, 8)))


def test_rails_ignore_links_narrow_one_way(fail3_512):
    """HPN Fail3 at 512 GPUs: the backup's degraded NVLink links are narrow for the
    healthy GPUs of its host only; counted both ways they would join all rails.  The
    rail-first order sees eight rails of 64 ranks, the backup on its old rail."""
    lg, _ = fail3_512
    go = growth_order(lg.num_gpus, lg.tail, lg.head, lg.units)
    sizes = np.bincount(go.comp)
    assert sizes.size == 8 and (sizes == 64).all()
    assert go.comp[0] == go.comp[8]              # backup (rank 0) with rank 8 of host 1


@pytest.mark.parametrize("topo", [hpn(8, 8, 8), fail3(hpn(8, 8, 8)), fail2(hpn(2, 32, 8))],
                         ids=lambda t: t.name)
def test_links_stay_inside_their_class_part(topo):
    """The part counts skip a rank's scan once its part is in the tree: sound only if
    every link of a class joins two ranks of the same part of that class."""
    lg, _ = logical_graph(topo)
    n = lg.num_gpus
    go = growth_order(n, lg.tail, lg.head, lg.units)
    tail, head = lg.tail[go.perm], lg.head[go.perm]
    for c in range(3):
        links = np.arange(go.start[c, 0], go.start[c, n])
        col = go.part_col[:, go.class_part[c]]
        assert (col[tail[links]] == col[head[links]]).all()
    assert (np.bincount(go.part_col.ravel()) == go.part_size).all()


def test_fail3_packs_without_chains_and_merges_classes(fail3_512):
    """Fail3 at 512 GPUs (k = 3): every unit tree reaches the backup, whose ingress is
    exactly tight (the few-missing marks find its last free links); the packing is
    valid with no augmenting chain, and a root's classes are distinct trees whose
    multiplicities sum to k."""
    lg, k = fail3_512
    n = lg.num_gpus
    classes, info = repair_pack(n, lg.tail, lg.head, lg.units, k)
    assert classes is not None and info["repairs"] == 0
    assert_packing_arrays(n, lg.tail, lg.head, lg.units, k, classes)
    for r in range(n):
        rows = [c.parent_arc for c in classes if c.root == r]
        assert len({row.tobytes() for row in rows}) == len(rows)


@pytest.mark.parametrize("topo", [fail1(hpn(2, 32, 8)), hpn(1, 3, 8)], ids=lambda t: t.name)
def test_packing_with_and_without_index_agree_with_units(topo):
    """512-GPU Fail1 (rail-first, batched turns) and 1x3x8 (augmenting chains: the repair
    index is built on the first stuck tree) both pack k trees per root within every
    link's units."""
    lg, k = logical_graph(topo)
    classes, info = repair_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k)
    assert classes is not None
    assert_packing_arrays(lg.num_gpus, lg.tail, lg.head, lg.units, k, classes)
    if topo.name == "hpn-1x3x8":
        assert info["repairs"] > 0


def test_wide_links_are_the_hosts_on_a_fat_tree():
    """Fat-tree 2x2x1x8 at ``None`` (41 trees per root): the spread split cuts each NIC into
    many thin logical links and a few fat ones; only the NVLink-derived links are wide
    (their parts are the hosts), so a tree enters a host once and fans out inside it.  With
    the plain mean per link, 4 NIC links were wide (20 on 2x2x2x8, 156 on 4x2x2x8)."""
    topo = fat_tree(2, 2, 1, 8)
    lg, k = logical_graph(topo, None)
    n = lg.num_gpus
    assert k == 41
    go = growth_order(n, lg.tail, lg.head, lg.units, rail_first=True)
    host = np.arange(n) // 8
    wide = go.perm[go.start[0, 0]:go.start[0, n]]
    assert (host[lg.tail[wide]] == host[lg.head[wide]]).all()
    assert wide.size == n * 7                    # every NVLink-derived link
    assert (go.part_col[:, go.class_part[0]] == host).all()
