"""The fleet model's measured inputs and its calibration (``benchmarks.fleet_measure``,
``benchmarks.fleet_calibration``, ``benchmarks.fleet_model --measured``): a run folder written here by hand
(TensorBoard scalars, rollout dumps) read back into the model's inputs, the decode-speed fit and the trainer's other
seconds against hand-worked numbers, and the committed measurement predicted within the model's target."""

import gzip
import json

import pytest

from benchmarks import fleet_calibration, fleet_measure, fleet_model
from zerotir import metric_names as mn

# three in-line steps whose generation is exactly 2 ms a decode step + 0.1 ms a trajectory more a step:
# (sampled tokens of each record, generation s): max 50, 30 more -> 0.1 + 0.003; max 100, 20 more -> 0.2 + 0.002;
# max 50, 50 more -> 0.1 + 0.005
STEPS = [([50, 30], 0.103), ([100, 20], 0.202), ([50, 50], 0.105)]


def write_run(run_dir, steps=STEPS, dump_steps=None):
    """A benchmarks.fleet in-line run folder: per step time/* scalars and a rollout dump (calls: one record in two)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir / "tensorboard"))
    for step, (tokens, generation) in enumerate(steps, start=1):
        scalars = {mn.TIME_STEP: 1.0 + step, mn.TIME_UPDATE: 0.5, mn.TIME_WEIGHT_SYNC: 0.0, mn.TIME_REWARD: 0.01,
                   mn.TIME_GENERATION: generation, mn.TIME_SANDBOX: 0.02}
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)
    writer.close()
    (run_dir / "rollouts").mkdir(parents=True)
    for step, (tokens, _) in enumerate(steps[:dump_steps], start=1):
        with gzip.open(run_dir / "rollouts" / f"step_{step}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"response_tokens": t + 40, "sampled_tokens": t, "calls": i % 2}) + "\n"
                         for i, t in enumerate(tokens))


def write_benchmark(out, arm="inline"):
    """A benchmarks.fleet output as older versions wrote it: fleet.json without model inputs, its run folder."""
    write_run(out / f"{arm}_s0")
    runs = [{"arm": arm, "seed": 0, "steps": 3, "steps_per_minute": 40.0}]
    (out / "fleet.json").write_text(json.dumps({"command": f"python -m benchmarks.fleet --out {out}", "runs": runs}))
    return out / "fleet.json"


def test_run_inputs_read_a_run_folder(tmp_path):
    write_run(tmp_path / "inline_s0")
    inputs = fleet_measure.run_inputs(tmp_path / "inline_s0")
    # time/step 2, 3, 4: mean 3; the other phases constant
    assert inputs["steps"] == 3 and inputs["seconds"]["step"] == pytest.approx(3.0)
    assert inputs["seconds"]["generation"] == pytest.approx((0.103 + 0.202 + 0.105) / 3)
    # the decoded (sampled) tokens, not the response's (which hold the tools' output the engine prefills)
    assert [(b["max_tokens"], b["tokens"], b["calls"]) for b in inputs["batches"]] == [(50, 80, 1), (100, 120, 1),
                                                                                        (50, 100, 1)]
    assert inputs["responses"] == [[20, 1, 1], [30, 1, 1], [50, 0, 2], [50, 1, 1], [100, 0, 1]]
    assert inputs["started"] > 1.7e9  # the event file's name: when the run began logging


def test_run_inputs_refuse_a_run_whose_dumps_miss_steps(tmp_path):
    write_run(tmp_path / "inline_s0", dump_steps=2)
    with pytest.raises(ValueError, match="3 steps logged but 2 steps dumped"):
        fleet_measure.run_inputs(tmp_path / "inline_s0")
    with pytest.raises(FileNotFoundError, match="no step_"):
        fleet_measure.distribution_from_dumps(tmp_path / "nothing")


def test_arms_read_the_inputs_a_fleet_json_stores(tmp_path):
    # benchmarks.fleet stores each run's inputs: no run folder needed beside its fleet.json
    write_run(tmp_path / "inline_s0")
    stored = {"arm": "inline", "seed": 0, "steps": 3, "steps_per_minute": 40.0,
              "model_inputs": fleet_measure.run_inputs(tmp_path / "inline_s0")}
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / "fleet.json").write_text(json.dumps({"command": "c", "runs": [stored]}))
    arm = fleet_measure.arms_from(tmp_path / "moved" / "fleet.json")["arms"]["inline"]
    assert arm["seconds"] == stored["model_inputs"]["seconds"] and arm["seeds"] == 1


def test_decode_fit_recovers_the_decode_step():
    batches = [dict(generation=g, max_tokens=max(t), tokens=sum(t)) for t, g in STEPS]
    batch1, saturated = fleet_calibration.decode_fit(batches)
    assert batch1 == pytest.approx(1 / 0.002) and saturated == pytest.approx(1 / 0.0001)
    # a batch's trajectories past its longest making it faster: 2 ms a step, -0.1 ms a trajectory more
    faster = [dict(b, generation=0.002 * b["max_tokens"] - 0.0001 * (b["tokens"] - b["max_tokens"])) for b in batches]
    with pytest.raises(ValueError, match="must be > 0"):
        fleet_calibration.decode_fit(faster)
    with pytest.raises(ValueError, match="3 steps or more"):
        fleet_calibration.decode_fit(batches[:2])


def test_a_decode_fit_on_a_given_curve_scales_it_alone():
    """Steps decoding twice as fast as the curve 2 ms a step + 0.1 ms a trajectory more: the curve halved, its
    shape kept, however little the steps vary."""
    batches = [dict(generation=(0.002 * max(t) + 0.0001 * (sum(t) - max(t))) / 2, max_tokens=max(t), tokens=sum(t))
               for t, _ in STEPS]
    batch1, saturated = fleet_calibration.decode_fit(batches, (1 / 0.002, 1 / 0.0001))
    assert batch1 == pytest.approx(2 / 0.002) and saturated == pytest.approx(2 / 0.0001)


def test_the_trainers_other_seconds_are_the_step_less_the_simulated_phases():
    seconds = dict(step=2.0, update=1.0, push=0.1, wait=0.6, reward=0.2, generation=0.5, sandbox=0.05)
    # asynchronous: 2.0 - 1.0 - 0.1 - 0.6 (the wait, simulated) + 0.2 (the scoring within the wait) = 0.5
    assert fleet_measure.other_s(seconds, asynchronous=True) == pytest.approx(0.5)
    # in line: 2.0 - 0.5 - 0.05 - 1.0 - 0.1 = 0.35
    assert fleet_measure.other_s(seconds, asynchronous=False) == pytest.approx(0.35)


def test_measured_file_written_from_a_benchmark_and_calibrated(tmp_path, capsys):
    fleet_json = write_benchmark(tmp_path / "bench")
    one_thread = write_benchmark(tmp_path / "bench_1t")
    saved = tmp_path / "measured.json"
    assert fleet_model.main(["--measured", str(fleet_json), str(one_thread), "--save", str(saved)]) == 0
    measured = json.loads(saved.read_text())
    assert measured["source"]["fleet"] == f"python -m benchmarks.fleet --out {tmp_path / 'bench'}"
    assert f"--save {saved}" in measured["source"]["written_by"]
    arm = measured["arms"]["inline"]
    # other: mean step 3.0 - generation 0.41 / 3 - sandbox 0.02 - update 0.5 - push 0
    assert arm["other_s"] == pytest.approx(3.0 - 0.41 / 3 - 0.02 - 0.5)
    assert arm["steps_per_min"] == 40.0
    fleet_model.main(["--calibrate", "--measured_file", str(saved)])
    out = capsys.readouterr().out
    assert "| inline | steps_per_min |" in out and "500 tokens/s at batch 1" in out


def test_calibration_counts_every_step_the_first_included():
    # batch shares, S = 1: 128 trajectories of 100 tokens decode in 100 x (0.01 + 127 x 0.001) = 13.7 s; the trainer's
    # step is other (21 - 20 - 0 - 0.5 + 0.5 = 1 s) + update 20 s: update-bound, so 3 steps take 13.7 (the first
    # waits for batch 0, nothing generated ahead) + 3 x 21 s, as the benchmark's steps / min counts them
    seconds = dict(step=21.0, update=20.0, push=0.0, wait=0.5, reward=0.5, sandbox=0.0)
    arm = dict(steps=3, seconds=seconds, other_s=fleet_measure.other_s(seconds, asynchronous=True),
               batches=[dict(tokens=12800, calls=0)], responses=[[100, 0, 128]])
    p = fleet_calibration.predict("fleet_s1", arm, (100.0, 1000.0))
    assert 60 * p.steps_per_s == pytest.approx(60 * 3 / (13.7 + 3 * 21))


def test_committed_measurement_is_predicted_within_the_target():
    rows = fleet_calibration.calibrate(fleet_model.load_measured(fleet_model.MEASURED_FILE))
    speeds = {r["arm"]: r["error"] for r in rows if r["metric"] == "steps_per_min"}
    assert set(speeds) == set(fleet_calibration.ARMS)
    assert all(abs(e) <= fleet_calibration.TARGET for e in speeds.values()), speeds


def test_measured_settings_that_cannot_apply_are_errors(tmp_path, capsys):
    for argv, field in ((["--save", "x.json"], "--save"),
                        (["--calibrate", "--measured", "a", "b", "--measured_file", "c"], "--measured_file")):
        with pytest.raises(SystemExit):
            fleet_model.parse_args(argv)
        assert field in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="--measured_file"):
        fleet_model.main(["--calibrate", "--measured_file", str(tmp_path / "none.json")])
    fleet_json = write_benchmark(tmp_path / "bench", arm="fleet_s1")
    with pytest.raises(ValueError, match="no in-line arm"):
        fleet_model.measure(fleet_json, fleet_json)


def test_the_models_arms_run_the_benchmarks_settings():
    from benchmarks import fleet

    assert set(fleet_calibration.ARMS) == set(fleet.ARMS)
    for name, flags in fleet.ARMS.items():
        setting = dict(zip(flags, flags[1:]))
        schedule = fleet_calibration.ARMS[name]
        assert schedule["max_staleness"] == int(setting.get("--model.hosts.max_staleness", 0)), name
        assert schedule["max_in_flight"] == int(setting.get("--model.hosts.max_in_flight", 0)), name
        assert (schedule["mode"] == "streaming") == ("--model.hosts.max_in_flight" in setting), name
