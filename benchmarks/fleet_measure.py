"""The fleet model's inputs measured from a fleet benchmark's runs (``benchmarks.fleet``): per run folder, the phase
costs its TensorBoard logs hold and the response distribution of its rollout dumps; per arm, their means over seeds.

``benchmarks.fleet`` stores ``run_inputs`` of every run in its ``fleet.json``; ``arms_from`` reads them back, or
measures a run folder beside an older ``fleet.json`` that lacks them. ``benchmarks.fleet_model`` turns them into
``PhaseCosts`` (``benchmarks.fleet_calibration``).

Per step, from the scalars the trainer logs (``zerotir.metric_names``): ``time/step`` (the training loop's wall
time), ``time/update``, ``time/weight_sync`` (the push), ``time/wait_for_rollout`` (asynchronous arms: the trainer
from asking for its batch to holding it scored), ``time/reward`` (the scoring within it), ``time/generation`` and
``time/sandbox`` (in line: the batch's decoding and its tool calls in the trainer's process). The trainer's
"other" seconds a step are the step less what the model simulates: in line, less generation, tool calls, update
and push; in the asynchronous arms, less update, push and the wait, plus the scoring the wait holds.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path

from zerotir import metric_names as mn

PER_STEP = {"step": mn.TIME_STEP, "update": mn.TIME_UPDATE, "push": mn.TIME_WEIGHT_SYNC,
            "wait": mn.TIME_WAIT_ROLLOUT, "reward": mn.TIME_REWARD, "generation": mn.TIME_GENERATION,
            "sandbox": mn.TIME_SANDBOX}
OCCUPANCY = {"busy": mn.FLEET_BUSY, "fill": mn.FLEET_FILL}


def step_records(folder: Path) -> dict[int, list[tuple[int, int]]]:
    """Step -> (sampled tokens, tool calls) of each of its training records, from a run's folder or its
    ``rollouts/``: the tokens an engine decodes one a step (the response less the tools' output it prefills)."""
    from zerotir.rollout_log.records import read_records, step_files

    for candidate in (folder / "rollouts", folder):
        steps = step_files(candidate, "train")
        if steps:
            return {step: [(int(r["sampled_tokens"]), int(r["calls"])) for path in files
                           for r in read_records(path)] for step, files in steps.items()}
    raise FileNotFoundError(f"{folder}: no step_*.jsonl.gz there or in its rollouts/; give a run's folder written "
                            "with rollout dumps on (model.rollout_log)")


def distribution_from_dumps(folder: Path) -> list[tuple[int, int]]:
    """(sampled tokens, tool calls) of every training record in a run's rollout dumps."""
    return [pair for records in step_records(folder).values() for pair in records]


def histogram(pairs: list[tuple[int, int]]) -> list[list[int]]:
    """``[tokens, calls, count]`` rows, sorted: a distribution written compactly."""
    return [[t, c, n] for (t, c), n in sorted(Counter(pairs).items())]


def expand(rows: list[list[int]]) -> list[tuple[int, int]]:
    """The pairs a ``histogram`` counts, each as often as counted."""
    return [(t, c) for t, c, n in rows for _ in range(n)]


def run_inputs(run_dir: Path) -> dict:
    """One run's model inputs: its per-step phase seconds (mean over its steps), the engine's occupancy at its
    last step, and per step its batch's size (for the decode-speed fit) and its response distribution."""
    from zerotir.scaling.runs import load_run

    series = load_run(run_dir.name, run_dir / "tensorboard").scalars
    if mn.TIME_STEP not in series:
        raise FileNotFoundError(f"{run_dir}/tensorboard: no {mn.TIME_STEP} scalars; give a run folder of "
                                "benchmarks.fleet (<out>/<arm>_s<seed>)")
    records = step_records(run_dir)
    steps = len(series[mn.TIME_STEP])
    if len(records) != steps:
        raise ValueError(f"{run_dir}: {steps} steps logged but {len(records)} steps dumped; the run's rollout dumps "
                         "must hold every training step (model.rollout_log every 1)")
    seconds = {k: [float(v) for v in series[tag]] for k, tag in PER_STEP.items() if tag in series}
    batches = [dict(generation=seconds["generation"][i] if "generation" in seconds else None,
                    max_tokens=max(t for t, _ in pairs), tokens=sum(t for t, _ in pairs),
                    calls=sum(c for _, c in pairs)) for i, pairs in enumerate(records.values())]
    return {"steps": steps, "started": started(run_dir),
            "seconds": {k: statistics.fmean(v) for k, v in seconds.items()},
            "occupancy": {k: float(series[tag].iloc[-1]) for k, tag in OCCUPANCY.items() if tag in series},
            "batches": batches, "responses": histogram([p for pairs in records.values() for p in pairs])}


def started(run_dir: Path) -> float:
    """When the run's logging began, Unix seconds: TensorBoard writes it into its event file's name
    (``events.out.tfevents.<seconds>.<host>...``)."""
    from zerotir.scaling.runs import EVENT_PREFIX

    names = sorted((run_dir / "tensorboard").glob(EVENT_PREFIX + "*"))
    if not names:
        raise FileNotFoundError(f"{run_dir}/tensorboard: no {EVENT_PREFIX}* file")
    return float(names[0].name[len(EVENT_PREFIX):].split(".")[0])


def other_s(seconds: dict[str, float], asynchronous: bool) -> float:
    """The trainer's seconds a step outside what the model simulates (collect, score, check, log)."""
    if asynchronous:
        return seconds["step"] - seconds["update"] - seconds["push"] - seconds["wait"] + seconds["reward"]
    return seconds["step"] - seconds["generation"] - seconds["sandbox"] - seconds["update"] - seconds["push"]


def arms_from(fleet_json: Path) -> dict:
    """Per arm of a ``benchmarks.fleet`` output: its measured steps/min and the means over its seeds of
    ``run_inputs`` (each run's stored one, or measured now from ``<dir of fleet_json>/<arm>_s<seed>``)."""
    data = json.loads(fleet_json.read_text())
    arms: dict[str, dict] = {}
    for run in data["runs"]:
        inputs = run.get("model_inputs") or run_inputs(fleet_json.parent / f"{run['arm']}_s{run['seed']}")
        arms.setdefault(run["arm"], {"runs": []})["runs"].append((run, inputs))
    out = {}
    for arm, found in arms.items():
        runs, inputs = [r for r, _ in found["runs"]], [i for _, i in found["runs"]]
        mean = {part: {k: statistics.fmean(i[part][k] for i in inputs) for k in inputs[0][part]}
                for part in ("seconds", "occupancy")}
        seconds = mean["seconds"]
        pairs = [p for i in inputs for p in expand(i["responses"])]
        out[arm] = {"seeds": len(runs), "steps": statistics.fmean(r["steps"] for r in runs),
                    "steps_per_min": statistics.fmean(r["steps_per_minute"] for r in runs), "seconds": seconds,
                    "other_s": other_s(seconds, asynchronous="wait" in seconds),
                    "occupancy": mean["occupancy"],
                    "batches": [b for i in inputs for b in i["batches"]], "responses": histogram(pairs)}
    times = [i["started"] for found in arms.values() for _, i in found["runs"]]
    span = [time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) for t in (min(times), max(times))]
    return {"command": data["command"], "runs_started": f"{span[0]} to {span[1]} UTC", "arms": out}
