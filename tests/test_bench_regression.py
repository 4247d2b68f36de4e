"""``bench/bench_allgather_regression.py --compare``: what counts as a regression."""

from __future__ import annotations

from bench.bench_allgather_regression import compare

ROW = {"method": "general", "termination": "optimal", "rate_gbps": 52.006103, "chunks": 246,
       "trees": "abc", "cpu_s": 0.08, "route": "cold"}


def test_another_method_chunk_count_or_rate_is_a_regression(capsys):
    base = {"a:None:0": ROW, "b:None:1": ROW, "c:None:2": ROW, "d:None:0": ROW}
    now = {"a:None:0": {**ROW, "method": "forestcoll"}, "b:None:1": {**ROW, "chunks": 247},
           "c:None:2": {**ROW, "rate_gbps": ROW["rate_gbps"] * (1 - 1e-7)},
           "d:None:0": {**ROW, "trees": "other", "cpu_s": 0.5}}
    bad = compare(now, base)
    assert sorted(line.split(":")[0] for line in bad) == ["a", "b", "c"]
    assert "other trees" in capsys.readouterr().out     # noted, not judged


def test_the_same_answers_pass_at_any_cpu_time():
    base = {"a:10:0": ROW}
    assert compare({"a:10:0": {**ROW, "cpu_s": 9.0, "rate_gbps": ROW["rate_gbps"] * (1 + 1e-12)}},
                   base) == []
