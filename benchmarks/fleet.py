"""The rollout fleet on 2 CPU cores, side by side in one run: the toy world in line, through the thread host
(S = 1), through the fleet in batch shares (S = 1) and through the fleet streaming (S = 1), on a workload with a
long tail of response lengths.

    python -m benchmarks.fleet                                  # every arm on RL seeds 0 1 2
    python -m benchmarks.fleet --model_dir data/toy_base --seeds 0 --arms inline stream_s1

Workload. ``configs/toy_cpu.yaml`` from one base (the shipped one unless ``--model_dir`` names another), with a
response budget of ``--max_response_tokens`` (256: twice the config's): most answers end in a few dozen tokens, the
ones that ramble or call code run far longer, so a batch's last trajectory ends long after most of it. Arms, in this
order for each RL seed (a change of the machine's load falls on every arm alike):

- ``inline``: ``model.hosts.max_staleness`` null: each step generates its batch in the trainer's process;
- ``thread_s1``: the engine host in a thread of the trainer's process, S = 1 (``off_policy_correction: tis``);
- ``fleet_s1``: one engine process (``configs/toy_cpu_fleet.yaml``: a Ray actor with one CPU), S = 1, the batch's
  share rolled out in one tool loop: the engine is busy until its slowest trajectory ends;
- ``stream_s1``: the same engine streaming (``model.hosts.max_in_flight`` = one batch's trajectories): every prompt
  group on its own, the next batch's groups admitted as the last ones of this batch run, pushes between engine steps,
  each step training the first groups to end, whatever their batch (a group over the bound generated again).

Measured per run from its TensorBoard logs: RL steps per minute of training (steps / the sum of ``time/step``),
minutes to the held-out target (``--target``, checked every ``--val_every`` steps), the profile (mean seconds per
step of generation, update, the trainer waiting for rollouts, the weights' push) and the fleet's occupancy at the
end: ``pipeline/fleet_busy`` (the share of wall time the engine had a rollout in flight) and ``pipeline/fleet_fill``
(streaming: the mean trajectories in flight over ``max_in_flight``) with ``pipeline/fleet_fill_waiting`` (the same
mean over only the time a prompt group waited to be admitted: how full the engine stayed while there was work);
streaming, the mean stream batches a step's
groups came from (``pipeline/fleet_spread``), the groups generated again (``pipeline/fleet_regenerated``) and, per
step, the groups a push left over the bound, aborted in the engine, and their wasted tokens
(``pipeline/fleet_aborted_groups``, ``pipeline/fleet_aborted_tokens``).
Written to ``<out>/fleet.{json,md,png}``; ``fleet.json`` holds, per run, the fleet model's inputs as well
(``benchmarks.fleet_measure.run_inputs``: phase seconds a step, each step's batch size, the response distribution),
which ``python -m benchmarks.fleet_model --calibrate --measured <out>/fleet.json <1-thread out>/fleet.json`` reads.

Targets: the fleet at S = 1 at least 1.5x the steps per minute of in line and no slower to 80%;
streaming engine fill at least 0.9 on this workload against the batch shares' figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from benchmarks import async_pipeline, fleet_measure
from zerotir import metric_names as mn

REPO = Path(__file__).resolve().parents[1]
TIS = ["--model.rl.off_policy_correction", "tis"]
FLEET = ["--model.hosts.max_staleness", "1", *TIS, "--model.hosts.engines", "1"]
ARMS = {"inline": [], "thread_s1": ["--model.hosts.max_staleness", "1", *TIS], "fleet_s1": FLEET,
        "stream_s1": [*FLEET, "--model.hosts.max_in_flight", "128"]}  # 16 prompts x 8 samples: one batch
PROFILE = {"generation": mn.TIME_GENERATION, "update": mn.TIME_UPDATE, "wait_for_rollout": mn.TIME_WAIT_ROLLOUT,
           "weight_sync": mn.TIME_WEIGHT_SYNC, "staleness": mn.STALENESS_MEAN}
OCCUPANCY = {"busy": mn.FLEET_BUSY, "fill": mn.FLEET_FILL, "fill_waiting": mn.FLEET_FILL_WAITING}
ABORTED = {"aborted_groups": mn.FLEET_ABORTED_GROUPS, "aborted_tokens": mn.FLEET_ABORTED_TOKENS}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--out", type=Path, default=REPO / "runs" / "fleet_bench")
    p.add_argument("--model_dir", type=Path, default=REPO / "data" / "toy_base", help="the toy base")
    p.add_argument("--target", type=float, default=0.8, help="held-out accuracy that ends a run")
    p.add_argument("--max_steps", type=int, default=30)
    p.add_argument("--val_every", type=int, default=5)
    p.add_argument("--max_response_tokens", type=int, default=256, help="the workload's response budget")
    return p.parse_args(argv)


def run(args: argparse.Namespace, arm: str, seed: int) -> dict:
    """One arm's run (``async_pipeline.run``) and the fleet's occupancy at its end."""
    extra = ("--model.sampling.max_response_tokens", str(args.max_response_tokens))
    out = async_pipeline.run(args, arm, seed, args.model_dir, ARMS, PROFILE, extra)
    from zerotir.scaling.runs import load_run

    run_dir = args.out / f"{arm}_s{seed}"
    series = load_run(run_dir.name, run_dir / "tensorboard").scalars
    out["occupancy"] = {k: float(series[tag].iloc[-1]) for k, tag in OCCUPANCY.items()
                        if tag in series and len(series[tag])}
    if mn.FLEET_SPREAD in series:  # streaming
        out["occupancy"]["spread"] = float(series[mn.FLEET_SPREAD].mean())
        out["occupancy"]["regenerated"] = float(series[mn.FLEET_REGENERATED].iloc[-1])
    for key, tag in ABORTED.items():  # per step: the groups a push left over the bound, and their wasted tokens
        if tag in series and len(series[tag]):
            out["occupancy"][key] = float(series[tag].mean())
    out["model_inputs"] = fleet_measure.run_inputs(run_dir)  # benchmarks.fleet_model --measured reads them
    return out


def markdown(runs: list[dict], rows: list[dict], target: float) -> str:
    def cell(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    lines = [f"| arm | seeds | RL steps / min | vs in line (range) | reached {target:.0%} | minutes to {target:.0%} | "
             "s/step generation | s/step update | trainer waits s/step | push s/step | engine busy | engine fill | "
             "fill while work waits | "
             "batches per step | groups regenerated | groups aborted / step | tokens aborted / step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p, rng = r["profile"], r["speedup_range"]
        occ = [x["occupancy"] for x in runs if x["arm"] == r["arm"]]
        mean = {k: statistics.fmean(o[k] for o in occ) for k in [*OCCUPANCY, "spread", "regenerated", *ABORTED]
                if occ and all(k in o for o in occ)}
        lines.append(f"| {r['arm']} | {r['seeds']} | {r['steps_per_minute']:.1f} | {cell(r['speedup'])}x "
                     f"({cell(rng and rng[0])}-{cell(rng and rng[1])}) | {r['reached']}/{r['seeds']} | "
                     f"{cell(r['minutes_to_target'])} | {cell(p.get('generation'))} | {cell(p.get('update'))} | "
                     f"{cell(p.get('wait_for_rollout'))} | {cell(p.get('weight_sync'))} | {cell(mean.get('busy'))} | "
                     f"{cell(mean.get('fill'))} | {cell(mean.get('fill_waiting'))} | {cell(mean.get('spread'))} | "
                     f"{cell(mean.get('regenerated'), '{:.1f}')} | "
                     f"{cell(mean.get('aborted_groups'))} | {cell(mean.get('aborted_tokens'), '{:.0f}')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [run(args, arm, seed) for seed in args.seeds for arm in args.arms]
    rows = async_pipeline.summary(runs, args.arms, PROFILE, baseline="inline")
    table = markdown(runs, rows, args.target)
    threads = os.environ.get("OMP_NUM_THREADS")  # the 1-thread in-line run is told apart by it
    command = (f"OMP_NUM_THREADS={threads} " if threads else "") + "python -m benchmarks.fleet " + " ".join(
        argv if argv is not None else sys.argv[1:])
    (args.out / "fleet.json").write_text(json.dumps({"command": command.strip(), "runs": runs, "summary": rows},
                                                    indent=1) + "\n")
    (args.out / "fleet.md").write_text(f"`{command.strip()}`\n\n{table}")
    async_pipeline.plot(runs, args.out / "fleet.png", args.arms)
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
