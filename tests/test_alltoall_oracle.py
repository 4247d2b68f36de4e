"""The AllToAll oracle fuzz (bench/fuzz_alltoall.py) on a few fabrics (irregular, an HPN
event chain, node order shuffled): cold and warm LP
optima equal to the compact LP's, every schedule valid.  The full run (24 fabrics x 5
states) is ``python bench/fuzz_alltoall.py``."""

from __future__ import annotations

from bench.fuzz_alltoall import main


def test_cold_and_warm_optima_equal_the_compact_lp_on_seeded_irregular_fabrics(capsys):
    assert main(["--fabrics", "2", "--steps", "3", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "failures: 0" in out and "warm-chain K=10" in out


def test_family_chains_shuffled_meet_the_compact_lp_and_every_bound_is_above_it(capsys):
    assert main(["--fabrics", "0", "--steps", "2", "--seed", "1", "--shuffle",
                 "--families", "hpn", "--family-max-gpus", "16"]) == 0
    out = capsys.readouterr().out
    assert "failures: 0" in out and "shuffled K=None" in out
    assert "bounds checked against the compact LP (never below it)" in out
