"""Other tools' formats, one module per format (docs/interop.md).

Importers build a :class:`mccl_opt.Topology`; exporters write a
:class:`mccl_opt.Schedule` in a peer's format.  Every reader raises
:class:`mccl_opt.TopologyError` or :class:`mccl_opt.ScheduleError` naming the bad entry.

* :mod:`.nccl_xml` -- NCCL's topology XML (``NCCL_TOPO_DUMP_FILE``), one file per host;
* :mod:`.nvidia_smi` -- the matrix ``nvidia-smi topo -m`` prints;
* :mod:`.cluster` -- how hosts' NICs meet the network (rail-optimised, one switch);
* :mod:`.networkx_graph` -- ``networkx`` digraphs (``Topology.from_networkx``);
* :mod:`.capacity_matrix` -- TE-CCL capacity / TACCL link and inverse-bandwidth matrices;
* :mod:`.forestcoll` -- ForestColl's spanning-tree XML for AllGather schedules;
* :mod:`.teccl_flows` -- TE-CCL's AllGather output (its ``7-Flows`` lines);
* :mod:`.teccl_alltoall` -- TE-CCL's AllToAll output (its ``Chunk paths`` with volumes);
* :mod:`.msccl_xml` -- MSCCL XML algorithms (TACCL's, MSCCLang's) read back as schedules.

Nothing here is imported by ``import mccl_opt``.
"""
