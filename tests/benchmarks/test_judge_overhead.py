"""``benchmarks.judge_overhead`` at its ``--quick`` size: both ways score every trajectory of the step through the
scripted endpoint, one call each, and print the table side by side."""

from benchmarks import judge_overhead


def test_the_quick_run_scores_every_trajectory_both_ways_and_prints_the_table(capsys):
    results = judge_overhead.main(["--quick"])
    out = capsys.readouterr().out
    trajectories = judge_overhead.QUICK["trajectories"]
    for way in ("after", "early"):
        assert results[way]["correct"] == results[way]["calls"] == trajectories  # no cached verdict, no failure
        assert results[way]["failures"] == 0 and results[way]["idle"] <= results[way]["step"]
        assert f"| {way} |" in out
    assert "endpoint bound (latency x calls / endpoint concurrency): 0.20 s" in out
