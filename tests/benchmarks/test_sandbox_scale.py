"""``benchmarks/sandbox_scale.py``: how the layouts share the workers, the summary's numbers, and a ``--quick`` run
against real servers that prints every layout, the fairness pair and the routing cost."""

import re

import pytest
from benchmarks import sandbox_scale as scale


def test_workers_are_shared_out_over_the_nodes():
    assert scale.split_workers(2, 2) == [1, 1]
    assert scale.split_workers(5, 2) == [3, 2]
    with pytest.raises(ValueError, match="at least one worker per node"):
        scale.split_workers(1, 2)


def test_summary_reads_rate_and_percentiles():
    waits = [0.010] * 99 + [1.0]  # 99 calls of 10 ms, one of 1 s
    s = scale.summary(waits, seconds=2.0)
    assert s["calls"] == 100 and s["per_s"] == 50.0
    assert s["p50_ms"] == pytest.approx(10.0) and 10.0 < s["p99_ms"] <= 1000.0


def test_each_engine_streams_trivial_and_sympy_snippets_in_turn():
    codes = scale.snippets(engine=1, count=4)
    assert codes[0] == codes[2] == "print(1+1)" and "sympy" in codes[1] and codes[1] != codes[3]


def test_quick_run_reports_every_layout_fairness_and_routing_cost():
    lines = scale.main(["--quick"])
    rows = [line for line in lines if line.startswith("| ")]
    names = [r.split("|")[1].strip() for r in rows]
    assert any(n.startswith("shared") for n in names) and any(n.startswith("per-node") for n in names)
    assert any(n.startswith("pool") for n in names) and "alone" in names
    assert any(n.startswith("beside a client looping run_many(4)") for n in names)
    for r in rows[1:4]:  # shared, per-node, pool: 8 calls each (2 engines x 4), a positive rate
        cells = [c.strip() for c in r.split("|")[2:-1]]
        assert cells[0] == "8" and float(cells[1]) > 0, r
    cost = re.search(r"routing .*: ([0-9.]+) us per call, ([0-9.]+)% of a call's p50", lines[-1])
    assert cost and float(cost.group(1)) > 0, lines[-1]
