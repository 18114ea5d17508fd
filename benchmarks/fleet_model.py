"""A model of the rollout fleet: RL steps/s, engine fill, trainer wait and staleness predicted from phase costs for
in line, batch shares and streaming (``benchmarks.fleet_sim``), calibrated on this machine's measured arms and then
run on a 7B model's GPU costs to split a cluster between training and engines.

    python -m benchmarks.fleet_model --calibrate                 # predicted vs measured, docs/results.md's arms
    python -m benchmarks.fleet_model --gpus 8 64                 # the best split of 8 and of 64 GPUs per mode
    python -m benchmarks.fleet_model --dumps runs/my_run --gpus 8   # response lengths and calls from a run's dumps

Inputs. ``--calibrate`` takes the phase costs measured on 2 cores (``MEASURED``: docs/results.md, "The fleet: batch
shares and streaming", the 3-seed re-run of 2026-12-04 16:59-17:07 UTC): each arm's update and generation seconds
a step, the trainer's other seconds a step (collect, score, log: the in-line arm's step less its generation and
update) and the push; the engine's batch-size curve is not measured, so its shape is an assumption (``CURVE``) and
its scale is fitted to the batch-shares arm's generation. The GPU plan takes ``GPU_7B``: each figure with its
source, or labelled an assumption. The response lengths and tool calls come from ``--dumps`` (a run's folder or its
``rollouts/``: every training step's records) or a built-in distribution (labelled an assumption).

Limits. A model of the schedule, not of the machine: no contention between the trainer and engines on shared
devices (calibration feeds each arm's own measured costs), one engine per GPU (no tensor parallelism), no prefill
cost, no memory limit on ``max_in_flight``, the same response distribution at every step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from benchmarks.fleet_sim import Fleet, PhaseCosts, Prediction, simulate

# The toy workload at a 256-token budget: most answers end in a few dozen tokens, a tail rambles or calls code.
# An assumption shaped on the toy world's dumps (26-67 tokens, about 0.2 calls a row at the 128-token budget).
DEFAULT_DISTRIBUTION = [(27, 0)] * 6 + [(67, 0)] * 2 + [(120, 1), (256, 1)]
CURVE = 32.0  # assumption: a decode step of 33 trajectories costs twice one of 1 (saturated / batch-1 tokens/s)

SOURCE = "docs/results.md, 'The fleet: batch shares and streaming', 3-seed re-run 2026-12-04 16:59-17:07 UTC"
MEASURED = {  # per arm: steps/min and s/step as the table prints them; None where it prints "-"
    "in line": dict(mode="inline", steps_per_min=21.8, generation_s=1.31, update_s=1.12, wait_s=None, busy=None,
                    fill=None),
    "thread host, S = 1": dict(mode="shares", steps_per_min=27.2, generation_s=1.24, update_s=1.86, wait_s=0.35,
                               busy=0.78, fill=None),
    "batch shares, S = 1": dict(mode="shares", steps_per_min=25.0, generation_s=1.05, update_s=1.92, wait_s=0.48,
                                busy=0.61, fill=None),
    "streaming, S = 1": dict(mode="streaming", steps_per_min=21.4, generation_s=1.05, update_s=1.92, wait_s=0.87,
                             busy=0.75, fill=0.62),
}
# The same engine's seconds a step generating, streaming 1.59 against batch shares 0.90 (docs/results.md, "With the
# thread budget", 2026-12-04 07:56-08:06 UTC): 16 admissions (one a group) against 1 (the share) a step.
ADMISSION_S = (1.59 - 0.90) / 15
PUSH_S = 0.01  # docs/results.md, the 2026-12-03 table's "push s/step" (the toy model's 3.3 MB over gloo)
STEPS = dict(steps=10, warmup_steps=2)  # the measured runs' 10 steps
TOY = dict(prompts_per_step=16, samples_per_prompt=8, engines=1, train_devices=1, max_staleness=1, max_in_flight=128)

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
    p.add_argument("--calibrate", action="store_true", help="predicted vs measured for docs/results.md's arms")
    p.add_argument("--gpus", type=int, nargs="*", default=[], help="cluster sizes to split (e.g. 8 64)")
    p.add_argument("--dumps", type=Path, help="a run's folder (or its rollouts/): the response distribution")
    p.add_argument("--max_staleness", type=int, default=1, help="S of the GPU plan's asynchronous modes")
    p.add_argument("--steps", type=int, default=6, help="simulated RL steps (the first 2 are warm-up)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if not args.calibrate and not args.gpus:
        p.error("nothing to do: give --calibrate, --gpus 8 64, or both")
    if args.steps < 3:
        p.error(f"--steps {args.steps}: at least 3 (2 of warm-up, then the steps measured)")
    if args.max_staleness < 0:
        p.error(f"--max_staleness {args.max_staleness}: must be >= 0 (0: batch j generated with its own weights)")
    if any(g < 2 for g in args.gpus):
        p.error(f"--gpus {args.gpus}: a split needs at least 2 GPUs")
    return args


def distribution_from_dumps(folder: Path) -> list[tuple[int, int]]:
    """(response tokens, tool calls) of every training record in a run's rollout dumps."""
    from zerotir.rollout_log.records import read_records, step_files

    for candidate in (folder / "rollouts", folder):
        steps = step_files(candidate, "train")
        if steps:
            return [(int(r["response_tokens"]), int(r["calls"])) for files in steps.values() for path in files
                    for r in read_records(path)]
    raise FileNotFoundError(f"--dumps {folder}: no step_*.jsonl.gz there or in its rollouts/; give a run's folder "
                            "written with rollout dumps on, or leave --dumps out for the built-in distribution")


def fitted_costs(arm: dict, distribution: list[tuple[int, int]], other_s: float) -> PhaseCosts:
    """The arm's measured costs: the decode curve's scale fitted to its generation seconds a batch (the time scales
    as 1 / tokens_per_s_batch1 with the curve's shape fixed), the update per token from its update seconds."""
    probe = PhaseCosts(1.0, CURVE, 0.0)
    one_batch = Fleet("inline", 1, 1, TOY["prompts_per_step"], TOY["samples_per_prompt"], **STEPS)
    generation = 1.0 / simulate(probe, one_batch, distribution).steps_per_s
    admission = 0.0 if arm["mode"] == "inline" else ADMISSION_S
    batch1 = generation / (arm["generation_s"] - admission)
    tokens = sum(t for t, _ in distribution) / len(distribution) * TOY["prompts_per_step"] * TOY["samples_per_prompt"]
    push = 0.0 if arm["mode"] == "inline" else PUSH_S
    return PhaseCosts(batch1, batch1 * CURVE, arm["update_s"] / tokens, push_s_per_gb=push, weights_gb=1.0,
                      trainer_other_s=other_s, admission_s=admission)


def calibrate(distribution: list[tuple[int, int]]) -> list[dict]:
    """Each arm predicted from its own phase costs, beside what it measured."""
    inline = MEASURED["in line"]
    other_s = 60.0 / inline["steps_per_min"] - inline["generation_s"] - inline["update_s"]
    rows = []
    for name, arm in MEASURED.items():
        fleet = Fleet(arm["mode"], **STEPS, **TOY)
        p = simulate(fitted_costs(arm, distribution, other_s), fleet, distribution)
        predicted = dict(steps_per_min=60 * p.steps_per_s, wait_s=p.trainer_wait_s, busy=p.engine_busy,
                         fill=p.engine_fill)
        for metric, value in predicted.items():
            if arm[metric] is not None:
                rows.append(dict(arm=name, metric=metric, predicted=value, measured=arm[metric],
                                 error=value / arm[metric] - 1))
    return rows


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


def calibration_table(rows: list[dict]) -> str:
    lines = [f"Calibration on 2 cores ({SOURCE}):", "", "| arm | metric | predicted | measured | error |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| {r['arm']} | {r['metric']} | {r['predicted']:.2f} | {r['measured']:.2f} | {r['error']:+.0%} |"
              for r in rows]
    return "\n".join(lines)


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
    dumps = distribution_from_dumps(args.dumps) if args.dumps else None
    out: dict = {}
    if args.calibrate:
        out["calibration"] = calibrate(dumps or DEFAULT_DISTRIBUTION)
        label = f"--dumps {args.dumps}" if dumps else "the built-in toy distribution (assumption)"
        print(calibration_table(out["calibration"]) + f"\n\nResponses: {label}.\n", flush=True)
    if args.gpus:
        out["plan"] = [row for g in args.gpus for row in plan(g, dumps or GPU_DISTRIBUTION, args.max_staleness,
                                                               args.steps)]
        print(plan_table(out["plan"], args.max_staleness), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
