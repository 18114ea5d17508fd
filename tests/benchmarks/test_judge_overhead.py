"""``benchmarks.judge_overhead`` at its ``--quick`` size: every way scores every trajectory of the step through the
scripted endpoint, one call each, and print the table side by side."""

from benchmarks import judge_overhead


def test_the_quick_run_scores_every_trajectory_both_ways_and_prints_the_table(capsys):
    results = judge_overhead.main(["--quick"])
    out = capsys.readouterr().out
    trajectories = judge_overhead.QUICK["trajectories"]
    assert list(results) == ["after, 2", "after, 16", "early, 16"]  # before, the concurrency alone, both
    for way, got in results.items():
        assert got["correct"] == got["calls"] == trajectories  # no cached verdict, no failure
        assert got["failures"] == 0 and got["idle"] <= got["step"]
        assert f"| {way.replace(', ', ' | ')} |" in out
    assert "endpoint bound (latency x calls / endpoint concurrency): 0.20 s" in out
