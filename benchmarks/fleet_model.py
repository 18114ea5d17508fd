"""A model of the rollout fleet: RL steps/s, engine fill, trainer wait and staleness predicted from phase costs for
in line, batch shares and streaming (``benchmarks.fleet_sim``), calibrated on a fleet benchmark's measured arms
(``benchmarks.fleet_calibration``) and then run on a 7B model's GPU costs to split a cluster between training and
engines.

    python -m benchmarks.fleet_model --calibrate                 # predicted vs measured (docs/data/fleet_measured.json)
    python -m benchmarks.fleet_model --gpus 8 64                 # the best split of 8 and of 64 GPUs per mode
    python -m benchmarks.fleet_model --calibrate --measured runs/fleet_bench/fleet.json \
        runs/fleet_bench_inline_1t/fleet.json --save docs/data/fleet_measured.json   # recalibrate on a new run
    python -m benchmarks.fleet_model --dumps runs/my_run --gpus 8   # response lengths and calls from a run's dumps

Inputs. ``--calibrate`` reads the measured file (``--measured_file``, docs/data/fleet_measured.json by default: the
inputs of ``benchmarks.fleet``'s runs, with the commands that measured them and when), or measures them now from
``--measured``: a ``benchmarks.fleet`` output's ``fleet.json`` and the 1-thread in-line arm's (``OMP_NUM_THREADS=1
python -m benchmarks.fleet --arms inline``), their run folders beside them; ``--save`` writes what it measured as a
measured file. What each input is and where it comes from: ``benchmarks.fleet_calibration``. The GPU plan takes
``GPU_7B``: each figure with its source, or labelled an assumption; its responses come from ``--dumps`` (a run's
folder or its ``rollouts/``) or a built-in distribution (labelled an assumption).

Limits. A model of the schedule, not of the machine: no contention between the trainer and engines on shared
devices (calibration feeds each arm's own measured update; the engine decodes at the 1-thread in-line speed), one
engine per GPU (no tensor parallelism), no prefill cost, no memory limit on ``max_in_flight``, the same response
distribution at every step, no held-out checks between steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from benchmarks import fleet_calibration, fleet_measure
from benchmarks.fleet_sim import Fleet, PhaseCosts, Prediction, simulate

REPO = Path(__file__).resolve().parents[1]
MEASURED_FILE = REPO / "docs" / "data" / "fleet_measured.json"
# A 7B policy (Qwen2.5-7B: 7.6B parameters, 28 layers, 4 KV heads of 128) on H100 SXM GPUs, one engine per GPU.
GPU_7B = {
    "weights_gb": (15.2, "7.6B parameters x 2 bytes (bf16), Qwen2.5-7B's model card"),
    "tokens_per_s_batch1": (150.0, "assumption: the weights read once a step at 70% of the H100 SXM datasheet's "
                                   "3.35 TB/s"),
    "tokens_per_s_saturated": (7000.0, "assumption: per extra trajectory, its KV cache (2k tokens x 57 KB) and "
                                       "15 GFLOP at 50% of the datasheet's 3.35 TB/s and 989 TFLOPS bf16"),
    "update_s_per_token": (1.9e-4, "assumption: 76 GFLOP a token (forward + backward 6N, old and reference "
                                   "log-probs 4N) at 40% MFU of the datasheet's 989 TFLOPS bf16"),
    "update_fixed_s": (1.0, "assumption: optimizer step and ZeRO gathers a step"),
    "push_s_per_gb": (0.04, "assumption: 25 GB/s effective broadcast (the ConnectX-7 NIC's 400 Gb/s = 50 GB/s)"),
    "tool_call_latency_s": (1.0, "assumption: one sandboxed Python call"),
    "trainer_other_s": (2.0, "assumption: collect, score and check a batch"),
}
GPU_DISTRIBUTION = ([(600, 1)] * 8 + [(1200, 1)] * 6 + [(2500, 2)] * 4 + [(6000, 3)] + [(8192, 4)])  # assumption
GPU_BATCH = dict(prompts_per_step=128, samples_per_prompt=8)  # assumption: the run's settings
PEERS = [("verl fully async policy trainer", "2.35-2.67x over its synchronous trainer (as the issue quotes it)"),
         ("AReaL (arXiv 2505.24298)", "up to 2.77x over synchronous systems"),
         ("NeMo-RL", "tokens/s/GPU: no figure quoted here (not one we know for sure)")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calibrate", action="store_true", help="predicted vs measured for a fleet benchmark's arms")
    p.add_argument("--measured_file", type=Path, help=f"the measured inputs to calibrate on (default {MEASURED_FILE})")
    p.add_argument("--measured", type=Path, nargs=2, metavar=("FLEET_JSON", "INLINE_1T_JSON"),
                   help="measure the inputs now from a benchmarks.fleet fleet.json and the 1-thread in-line arm's")
    p.add_argument("--save", type=Path, help="write the inputs --measured read as a measured file here")
    p.add_argument("--gpus", type=int, nargs="*", default=[], help="cluster sizes to split (e.g. 8 64)")
    p.add_argument("--dumps", type=Path, help="a run's folder (or its rollouts/): the GPU plan's response distribution")
    p.add_argument("--max_staleness", type=int, default=1, help="S of the GPU plan's asynchronous modes")
    p.add_argument("--steps", type=int, default=6, help="simulated RL steps of the GPU plan (the first 2 are warm-up)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if not args.calibrate and not args.gpus and not args.save:
        p.error("nothing to do: give --calibrate, --gpus 8 64, --measured ... --save PATH, or several")
    if args.measured and args.measured_file:
        p.error("--measured and --measured_file: give one (the benchmark outputs to measure, or a measured file)")
    if args.save and not args.measured:
        p.error("--save: give --measured FLEET_JSON INLINE_1T_JSON, the benchmark outputs to measure")
    if args.steps < 3:
        p.error(f"--steps {args.steps}: at least 3 (2 of warm-up, then the steps measured)")
    if args.max_staleness < 0:
        p.error(f"--max_staleness {args.max_staleness}: must be >= 0 (0: batch j generated with its own weights)")
    if any(g < 2 for g in args.gpus):
        p.error(f"--gpus {args.gpus}: a split needs at least 2 GPUs")
    return args


def measure(fleet_json: Path, inline_1t_json: Path, save: Path | None = None) -> dict:
    """The calibration's inputs measured from two ``benchmarks.fleet`` outputs (their run folders beside them): the
    arms of ``fleet_json`` and the in-line arm of ``inline_1t_json`` (run with ``OMP_NUM_THREADS=1``)."""
    fleet, one_thread = fleet_measure.arms_from(fleet_json), fleet_measure.arms_from(inline_1t_json)
    if "inline" not in one_thread["arms"]:
        raise ValueError(f"--measured {inline_1t_json}: no in-line arm; give the output of OMP_NUM_THREADS=1 "
                         "python -m benchmarks.fleet --arms inline")
    written = f"python -m benchmarks.fleet_model --measured {fleet_json} {inline_1t_json}" + (f" --save {save}"
                                                                                             if save else "")
    return {"source": {"fleet": fleet["command"], "inline_1t": one_thread["command"],
                       "runs_started": f"{fleet['runs_started']}; 1 thread {one_thread['runs_started']}",
                       "written_by": written, "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
            "arms": fleet["arms"], "inline_1t": one_thread["arms"]["inline"]}


def shown(path: Path) -> Path:
    """``path`` relative to the working folder where it is under it (as a reader would type it)."""
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


def load_measured(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"--measured_file {path}: no such file; write one with --measured FLEET_JSON "
                                "INLINE_1T_JSON --save PATH")
    return json.loads(path.read_text())


def gpu_costs() -> PhaseCosts:
    return PhaseCosts(**{k: v for k, (v, _) in GPU_7B.items()})


def plan(gpus: int, distribution: list[tuple[int, int]], S: int, steps: int) -> list[dict]:
    """Per mode, the split of ``gpus`` between training devices and engines with the most RL steps/s."""
    costs, rows = gpu_costs(), []
    splits = range(1, gpus) if gpus <= 16 else range(gpus // 16, gpus, gpus // 16)
    for mode in ("inline", "shares", "streaming"):
        tries = [(gpus, gpus)] if mode == "inline" else [(n, gpus - n) for n in splits]
        best: tuple[int, int, Prediction] | None = None
        for n, k in tries:
            share = -(-GPU_BATCH["prompts_per_step"] // k) * GPU_BATCH["samples_per_prompt"]  # whole groups
            fleet = Fleet(mode, engines=k, train_devices=n, max_staleness=S, steps=steps, warmup_steps=2,
                          max_in_flight=2 * share, **GPU_BATCH)  # streaming: room for the next batch's groups
            p = simulate(costs, fleet, distribution)
            if best is None or p.steps_per_s > best[2].steps_per_s:
                best = (n, k, p)
        n, k, p = best
        rows.append(dict(gpus=gpus, mode=mode, train_devices=n, engines=0 if mode == "inline" else k,
                         **dataclasses.asdict(p)))
    for row in rows:
        row["vs_inline"] = row["steps_per_s"] / rows[0]["steps_per_s"]
    return rows


def plan_table(rows: list[dict], S: int) -> str:
    lines = [f"The best split per mode (7B on H100, S = {S} where asynchronous; the inputs below):", "",
             "| GPUs | mode | training GPUs | engines | RL steps / min | vs in line | engine fill | trainer wait s | "
             "staleness mean / max |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['gpus']} | {r['mode']} | {r['train_devices']} | {r['engines'] or '-'} | "
                     f"{60 * r['steps_per_s']:.2f} | {r['vs_inline']:.2f}x | {r['engine_fill']:.2f} | "
                     f"{r['trainer_wait_s']:.1f} | {r['staleness_mean']:.2f} / {r['staleness_max']} |")
    lines += ["", "Inputs:"] + [f"- {k} = {v:g}: {why}" for k, (v, why) in GPU_7B.items()]
    lines += [f"- batch {GPU_BATCH}, streaming max_in_flight twice an engine's share, response (tokens, calls) {sorted(set(GPU_DISTRIBUTION))}: assumption",
              "", "Peers' published speed-ups (their clusters and models, not this model's):"]
    lines += [f"- {name}: {figure}" for name, figure in PEERS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: dict = {}
    measured = measure(*args.measured, args.save) if args.measured else None
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(measured, indent=None, separators=(",", ":")) + "\n")
        print(f"Wrote {args.save}.", flush=True)
    if args.calibrate:
        path = args.measured_file or shown(MEASURED_FILE)
        read = f"measured now from --measured {' '.join(map(str, args.measured))}" if measured else f"read from {path}"
        measured = measured or load_measured(path)
        out["calibration"] = fleet_calibration.calibrate(measured)
        print(fleet_calibration.calibration_table(out["calibration"], measured) + f"\n\nInputs {read}.\n",
              flush=True)
    if args.gpus:
        dumps = fleet_measure.distribution_from_dumps(args.dumps) if args.dumps else None
        out["plan"] = [row for g in args.gpus for row in plan(g, dumps or GPU_DISTRIBUTION, args.max_staleness,
                                                               args.steps)]
        label = f"--dumps {args.dumps}" if dumps else "the built-in distribution (assumption)"
        print(plan_table(out["plan"], args.max_staleness) + f"\n\nResponses: {label}.", flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
