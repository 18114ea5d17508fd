"""Tests of the scaling report: the law and its fit on synthetic curves with known parameters, R^2, the correlation
table and the call shares on hand-worked numbers, and the whole `scaling` command on event files written by
TensorBoard's writer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from zerotir import metric_names as mn
from zerotir.scaling import report as scaling
from zerotir.scaling import runs
from zerotir.scaling import fit as sf

# ---------------------------------------------------------------- the law and R^2, by hand


def test_law_hand_worked_values():
    # s + 1 = m: half-way between lo and hi, whatever k.
    assert sf.law(np.array([3.0]), 0.1, 0.9, 4.0, 2.0)[0] == pytest.approx(0.5)
    # lo=0, hi=1, m=4, k=1 at s=7: 1 / (1 + 4/8) = 2/3.
    assert sf.law(np.array([7.0]), 0.0, 1.0, 4.0, 1.0)[0] == pytest.approx(2 / 3)
    # Far before m the curve sits at lo (no overflow warning turned into an error); far after, at hi.
    assert sf.law(np.array([0.0, 1e9]), 0.2, 0.7, 1e6, 20.0) == pytest.approx([0.2, 0.7])


def test_r_squared_hand_worked():
    # y = [1, 2, 3], mean 2: SS_tot = 1 + 0 + 1 = 2; y_hat = [1, 2, 4]: SS_res = 1; R^2 = 1 - 1/2.
    assert sf.r_squared([1, 2, 3], [1, 2, 4]) == pytest.approx(0.5)
    assert sf.r_squared([1, 2, 3], [1, 2, 3]) == 1.0
    # Predicting the mean everywhere gives 0; worse than the mean gives a negative value: y_hat = [3, 2, 1], SS_res = 8.
    assert sf.r_squared([1, 2, 3], [2, 2, 2]) == 0.0
    assert sf.r_squared([1, 2, 3], [3, 2, 1]) == pytest.approx(-3.0)
    with pytest.raises(ValueError, match="constant"):
        sf.r_squared([1, 1, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="shape"):
        sf.r_squared([1, 2], [1, 2, 3])


# ---------------------------------------------------------------- the fit recovers known parameters


def _synthetic(lo, hi, m, k, steps=101, noise=0.01, seed=0):
    s = np.arange(steps, dtype=float)
    y = sf.law(s, lo, hi, m, k) + np.random.default_rng(seed).normal(0.0, noise, steps)
    return s, y


@pytest.mark.parametrize("lo,hi,m,k", [
    (0.05, 0.85, 20.0, 3.0),  # S-shaped rise, as tool use takes hold
    (0.0, 0.8, 25.0, 6.0),  # steep switch
    (0.6, 0.1, 10.0, 2.0),  # a falling curve (hi < lo)
])
def test_fit_recovers_known_parameters(lo, hi, m, k):
    s, y = _synthetic(lo, hi, m, k)
    fit = sf.fit_law(s, y)
    assert fit.lo == pytest.approx(lo, abs=0.03)
    assert fit.hi == pytest.approx(hi, abs=0.03)
    assert fit.m == pytest.approx(m, rel=0.08)
    assert fit.k == pytest.approx(k, rel=0.12)
    assert fit.r2 > 0.99 and fit.points == len(s)
    # The reported standard errors are consistent with the actual errors.
    for name, true in (("lo", lo), ("hi", hi), ("m", m), ("k", k)):
        assert abs(getattr(fit, name) - true) < 4 * fit.stderr[name], name


def test_fit_concave_curve_matches_the_curve():
    # With k < 1 the curve is concave from step 0, where lo and m trade off against each other: check the curve, not lo.
    s, y = _synthetic(0.1, 0.9, 8.0, 0.8)
    fit = sf.fit_law(s, y)
    assert np.max(np.abs(fit.predict(s) - sf.law(s, 0.1, 0.9, 8.0, 0.8))) < 0.02
    assert fit.hi == pytest.approx(0.9, abs=0.04) and fit.k == pytest.approx(0.8, rel=0.2)
    assert fit.r2 > 0.98


def test_fit_short_noisy_run_stays_in_bounds():
    s, y = _synthetic(0.1, 0.8, 4.0, 2.0, steps=8, noise=0.05, seed=1)
    fit = sf.fit_law(s, y)
    assert 0.0 <= fit.lo <= 1.0 and 0.0 <= fit.hi <= 1.0 and sf.K_BOUNDS[0] <= fit.k <= sf.K_BOUNDS[1]
    assert fit.r2 == pytest.approx(sf.r_squared(y, fit.predict(s)))


def test_fit_rejects_too_few_points_and_constant_series():
    with pytest.raises(ValueError, match=f"at least {sf.MIN_FIT_POINTS}"):
        sf.fit_law(np.arange(5), np.linspace(0, 1, 5))
    with pytest.raises(ValueError, match="constant"):
        sf.fit_law(np.arange(20), np.zeros(20))
    with pytest.raises(ValueError, match="steps must be >= 0"):
        sf.fit_law(np.arange(-1, 19), np.linspace(0, 1, 20))


# ---------------------------------------------------------------- correlation and call shares, by hand


def test_correlation_table_hand_worked():
    steps = [0, 1, 2, 3]
    up = pd.Series([1.0, 3.0, 5.0, 7.0], index=steps)
    down = pd.Series([4.0, 3.0, 2.0, 1.0], index=steps)
    # Centred steps [-1.5, -.5, .5, 1.5], centred zigzag [.5, -.5, .5, -.5]: covariance sum -1, variances 5 and 1.
    zigzag = pd.Series([1.0, 0.0, 1.0, 0.0, 9.0], index=steps + [4])  # step 4 is missing elsewhere: dropped
    table = sf.correlation_table({"up": up, "down": down, "zigzag": zigzag})
    assert list(table.columns) == ["steps", "up", "down", "zigzag"]
    assert table.loc["steps", "up"] == pytest.approx(1.0)
    assert table.loc["up", "down"] == pytest.approx(-1.0)
    assert table.loc["steps", "zigzag"] == pytest.approx(-1 / math.sqrt(5))
    assert np.allclose(table.to_numpy(), table.to_numpy().T) and np.allclose(np.diag(table), 1.0)
    with pytest.raises(ValueError, match="at least 3 steps"):
        sf.correlation_table({"up": up.iloc[:2]})


def test_call_shares_hand_worked():
    counts = {"0": pd.Series([1, 0, 1], index=[0, 1, 2]), "1": pd.Series([5, 6, 7], index=[0, 1, 2]),
              "2": pd.Series([2], index=[1])}  # "3plus" never logged: counts as 0
    # All steps: 0 calls 2, 1 call 18, 2 calls 2, 3+ 0; total 22.
    whole = sf.call_shares(counts)
    assert whole["counts"] == {"0": 2, "1": 18, "2": 2, "3plus": 0} and whole["total"] == 22
    assert whole["shares"]["1"] == pytest.approx(18 / 22) and sum(whole["shares"].values()) == pytest.approx(1.0)
    assert whole["steps"] == [0, 2]
    # Last step only: 1 + 7 + 0 = 8.
    last = sf.call_shares(counts, last_n=1)
    assert last["counts"] == {"0": 1, "1": 7, "2": 0, "3plus": 0} and last["steps"] == [2, 2]
    assert sf.call_shares({"0": pd.Series([0, 0], index=[0, 1])})["shares"]["0"] is None
    with pytest.raises(ValueError, match="last_n"):
        sf.call_shares(counts, last_n=0)


def test_duplicate_steps_keep_the_last_value():
    # A resumed run logs steps 2 and 3 again; the values it continued from are the later ones.
    series = runs._series([0, 1, 2, 3, 2, 3, 4], [0.0, 0.1, 0.2, 0.3, 0.25, 0.35, 0.4])
    assert series.index.tolist() == [0, 1, 2, 3, 4] and series.tolist() == [0.0, 0.1, 0.25, 0.35, 0.4]


def test_smoothing_is_tensorboards_debiased_ema():
    # w = 0.5 on [0, 2]: ema1 = 0.5*0 + 0.5*0 -> 0/(1-0.5) = 0; ema2 = 0.5*0 + 0.5*2 = 1, debias 1 - 0.25 -> 4/3.
    assert scaling.smooth(pd.Series([0.0, 2.0]), 0.5).tolist() == pytest.approx([0.0, 4 / 3])
    assert scaling.smooth(pd.Series([0.0, 2.0]), 0.0).tolist() == [0.0, 2.0]


# ---------------------------------------------------------------- the command on real event files


def _write_run(log_dir: Path, steps: int, m: float, tags: set[str] | None = None, seed: int = 0) -> None:
    """Writes a synthetic run: code proportion and accuracy follow the law; other metrics follow them."""
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(seed)
    writer = SummaryWriter(str(log_dir))
    for s in range(steps):
        code = float(sf.law(s, 0.08, 0.95, m, 3.0) + rng.normal(0, 0.01))
        acc = float(sf.law(s, 0.02, 0.8, 1.2 * m, 2.5) + rng.normal(0, 0.01))
        correct = int(acc * 128)
        values = {mn.TOOL_CALL_RATE: code, mn.ACCURACY: acc, mn.REWARD_MEAN: acc,
                  mn.TOOL_IN_CORRECT: min(1.0, code + 0.05),
                  mn.RESPONSE_LENGTH: 40 + 30 * code + rng.normal(0, 1), mn.CALLS_PER_RESPONSE: 1.05 * code,
                  mn.REPEAT_SCORE: 0.1 + rng.normal(0, 0.01), mn.CORRECT_BY_CALLS[0]: correct // 10,
                  mn.CORRECT_BY_CALLS[1]: correct - correct // 10 - correct // 20 - s % 2,
                  mn.CORRECT_BY_CALLS[2]: correct // 20, mn.CORRECT_BY_CALLS[3]: s % 2}
        for tag, value in values.items():
            if tags is None or tag in tags:
                writer.add_scalar(tag, value, s)
    writer.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    """Lightning's layout: two algorithms, version_0 each; the PPO run logged no repeat score and no 3+ calls."""
    root = tmp_path_factory.mktemp("logs")
    _write_run(root / "reinforce_pp" / "version_0", steps=40, m=12.0, seed=0)
    every = {mn.TOOL_CALL_RATE, mn.ACCURACY, mn.REWARD_MEAN, mn.TOOL_IN_CORRECT, mn.RESPONSE_LENGTH,
             mn.CALLS_PER_RESPONSE, *mn.CORRECT_BY_CALLS[:3]}
    _write_run(root / "ppo" / "version_0", steps=40, m=22.0, tags=every, seed=1)
    return root


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_report_of_two_runs(logs, tmp_path, capsys):
    out = tmp_path / "report"
    assert scaling.main(["--logdir", str(logs), "--out", str(out), "--last-n", "5"]) == 0
    assert str(out) in capsys.readouterr().out
    for name in ("figure4.png", "fits.png"):
        width, height = _png_size(out / name)
        assert width > 600 and height > 300
    report = json.loads((out / "scaling.json").read_text())
    assert {"law", "smooth", "last_n", "figures", "runs"} <= report.keys()
    assert report["law"]["formula"] == sf.LAW_FORMULA
    assert sorted(report["runs"]) == ["ppo/version_0", "reinforce_pp/version_0"]
    for name, run in report["runs"].items():
        assert run["steps"] == [0, 39] and run["num_steps"] == 40
        for key in ("accuracy", "tool_call_rate"):
            assert run["fits"][key]["r2"] > 0.97, (name, key)
        table = run["correlation"]
        cols = ["steps", "tool_call_rate", "response_length", "accuracy"]
        assert list(table) == cols
        matrix = np.array([[table[r][c] for c in cols] for r in cols])
        assert np.allclose(matrix, matrix.T) and np.allclose(np.diag(matrix), 1.0)
        for window in ("all_steps", "last_5_steps"):
            block = run["correct_by_calls"][window]
            assert sum(block["shares"].values()) == pytest.approx(1.0) and block["total"] > 0
            assert block["shares"]["1"] > 0.8  # most correct answers made exactly one call, as written
        assert run["correct_by_calls"]["last_5_steps"]["steps"] == [35, 39]
    # The faster run's code proportion reaches half-way sooner.
    fits = {name: run["fits"]["tool_call_rate"] for name, run in report["runs"].items()}
    assert fits["reinforce_pp/version_0"]["m"] == pytest.approx(13.0, rel=0.15)
    assert fits["ppo/version_0"]["m"] == pytest.approx(23.0, rel=0.15)
    ppo = report["runs"]["ppo/version_0"]
    assert "repeat_score" not in ppo["panels"] and any(mn.REPEAT_SCORE in note for note in ppo["notes"])
    assert any(mn.CORRECT_BY_CALLS[3] in note for note in ppo["notes"])
    assert report["runs"]["reinforce_pp/version_0"]["notes"] == []
    markdown = (out / "scaling.md").read_text()
    for text in ("ppo/version_0", "reinforce_pp/version_0", "figure4.png", "fits.png", sf.LAW_FORMULA, "R^2",
                 "last 5 steps", mn.REPEAT_SCORE):
        assert text in markdown
    # The calls table says what its cells are: shares, with the counts they come from.
    [row] = [line for line in markdown.splitlines() if line.startswith("| reinforce_pp/version_0 | all steps |")]
    block = report["runs"]["reinforce_pp/version_0"]["correct_by_calls"]["all_steps"]
    assert "share with 1 calls (count)" in markdown
    assert f"{block['shares']['1']:.3g} ({block['counts']['1']})" in row


def test_reads_scalars_stored_as_tensors(tmp_path):
    # tensorboard's own writer (like tf.summary v2) stores scalars as rank-0 tensors of the scalars plugin.
    from tensorboard.summary import Writer

    writer = Writer(str(tmp_path))
    for step, value in ((0, 0.25), (1, 0.5), (3, 0.75)):
        writer.add_scalar(mn.ACCURACY, value, step)
    writer.close()
    run = scaling.load_run("v2", tmp_path)
    assert run.get(mn.ACCURACY).to_dict() == {0: 0.25, 1: 0.5, 3: 0.75}


def test_labels_and_default_out(logs):
    # LABEL=PATH names the legend entry; the default output folder is <first logdir>/scaling.
    run_dir = logs / "ppo" / "version_0"
    assert scaling.discover_runs(run_dir) == [("ppo/version_0", run_dir)]
    assert scaling.discover_runs(f"PPO={run_dir}") == [("PPO", run_dir)]
    assert scaling.default_out([f"PPO={run_dir}"]) == run_dir / "scaling"
    with pytest.raises(scaling.ScalingInputError, match="label names one run"):
        scaling.discover_runs(f"all={logs}")
    # The same run given twice: the names collide and get their logdir in front.
    names = [run.name for run in scaling.load_runs([str(run_dir), str(run_dir)])]
    assert names == ["version_0:ppo/version_0"] * 2


def test_a_run_is_named_after_its_folder_not_its_tensorboard_folder(tmp_path):
    # zerotir's CLI writes <default_root_dir>/tensorboard: the run is the folder above it, however it is given.
    tb = tmp_path / "runs" / "toy_cpu" / "tensorboard"
    _write_run(tb, steps=3, m=5.0, tags={mn.ACCURACY})
    assert scaling.discover_runs(tmp_path / "runs" / "toy_cpu") == [("toy_cpu", tb)]
    assert scaling.discover_runs(tb) == [("toy_cpu", tb)]
    assert scaling.discover_runs(tmp_path / "runs") == [("toy_cpu", tb)]


def test_short_run_is_reported_with_notes(tmp_path):
    # Three steps, accuracy and code proportion only: no fit (too short), no correlation (length missing), no shares.
    run_dir = tmp_path / "short"
    _write_run(run_dir, steps=3, m=5.0, tags={mn.ACCURACY, mn.TOOL_CALL_RATE})
    assert scaling.main(["--logdir", str(run_dir)]) == 0
    report = json.loads((run_dir / "scaling" / "scaling.json").read_text())
    run = report["runs"]["short"]
    assert set(run["panels"]) == {"tool_call_rate"}
    assert f"at least {sf.MIN_FIT_POINTS}" in run["fits"]["accuracy"]["skipped"]
    assert run["correlation"] is None and run["correct_by_calls"] is None
    notes = " ".join(run["notes"])
    for text in (mn.REPEAT_SCORE, mn.RESPONSE_LENGTH, "fit accuracy", "correlation", "correct_by_calls"):
        assert text in notes
    assert (run_dir / "scaling" / "figure4.png").exists() and (run_dir / "scaling" / "scaling.md").exists()


def test_logdir_without_events_is_a_clear_error(tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    assert scaling.main(["--logdir", str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "no TensorBoard event file" in err
    assert scaling.main(["--logdir", str(tmp_path / "missing")]) == 2
    assert f"{tmp_path / 'missing'}: no such directory" in capsys.readouterr().err
    assert not (empty / "scaling").exists()


def test_bad_options_name_the_option(tmp_path, capsys):
    cases = ((["--smooth", "1.0"], "--smooth must be in [0, 1)"), (["--last-n", "0"], "--last-n must be >= 1"))
    for argv, text in cases:
        with pytest.raises(SystemExit):
            scaling.main(["--logdir", str(tmp_path), *argv])
        assert text in capsys.readouterr().err
