"""The paper's findings, measured in the second toy world (``mixed``): the sweeps, then docs/findings.md.

    python -m benchmarks.toy_findings                                  # the whole sweep, then the report
    python -m benchmarks.toy_findings --out /tmp/f17 --report-only     # the report from the runs already there

Method (issue #17). Three bases of the ``mixed`` world (``configs/toy_mixed.yaml``'s ``toy_base``), seed 0, sizes
about 0.2M, 0.85M and 3M parameters, each pretrained until its copy probe passes (a quality criterion: a wall-time
budget would make the base depend on the machine's load). Then RL runs of ``--steps`` steps from these bases with
``configs/toy_mixed.yaml``, varying one thing at a time:

- ``tir_rpp_s{0,1,2}``: ZeroTIR, REINFORCE++, budget 4 calls, the 0.85M base, RL seeds 0-2 (the reference runs);
- ``norl_s{0,1,2}``: the same without tools (``max_tool_calls 0``: ZeroRL);
- ``tir_ppo_s{0,1,2}`` (and ``tir_rbl_s{0,1,2}`` with ``reinforce_baseline`` where the algorithm exists);
- ``budget{1,2}_s0``: call budgets 1 and 2;
- ``size_small_s0`` / ``size_large_s0``: the 0.2M and 3M bases.

Seeds are RL seeds (sampling, data order) on one shared base per size, so the three seeds share their step-0 model.
Validation: all 128 easy and 128 hard held-out questions, greedy, every ``--val_every`` steps and at the last step.
Jobs run ``--jobs`` at a time with one torch thread each (``OMP_NUM_THREADS=1``). Each job's log lies next to its
run folder. The report (``toy_findings_report.py``) reads the TensorBoard logs and writes ``<docs>/findings.md`` with
PNG figures; a finding whose runs are missing is reported as not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import typing
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from zerotir.config import Algorithm

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "toy_mixed.yaml"
# name -> tiny-Llama shape (parameters with the byte vocabulary: ~0.23M, ~0.85M, ~3.3M). Every size keeps heads of
# 16 dimensions. The large base with 8 heads of 32 never passed its copy probe: 0 code copies after 3000 steps at
# lr 4e-3 and after 3100 steps at lr 2e-3, which had the lower loss. It therefore gets both changes.
SIZES = {
    "small": {"hidden_size": 64, "num_layers": 3, "num_heads": 4, "intermediate_size": 256},
    "medium": {"hidden_size": 128, "num_layers": 3, "num_heads": 8, "intermediate_size": 512},
    "large": {"hidden_size": 256, "num_layers": 3, "num_heads": 16, "intermediate_size": 1024, "lr": 2.0e-3},
}
PPO_ARGS = ["--model.optim.critic_lr", "2.0e-4", "--model.rl.gamma", "1.0", "--model.rl.gae_lambda", "0.95",
            "--model.rl.vf_coef", "0.5", "--model.rl.value_clip", "0.2"]


@dataclass(frozen=True)
class Job:
    """One RL run: its name (= folder), base size, algorithm, seed and call budget."""

    name: str
    size: str = "medium"
    algorithm: str = "reinforce_pp"
    seed: int = 0
    budget: int = 4
    extra: tuple[str, ...] = ()  # further command-line settings of the run (another benchmark's arms)


def jobs(seeds: list[int]) -> list[Job]:
    """The RL runs of the sweep, in the order they start (the headline and the reference runs first)."""
    out: list[Job] = []
    algorithms = [("ppo", "tir_ppo")]
    if "reinforce_baseline" in typing.get_args(Algorithm):
        algorithms.append(("reinforce_baseline", "tir_rbl"))
    for seed in seeds:
        out += [Job(f"tir_rpp_s{seed}", seed=seed), Job(f"norl_s{seed}", seed=seed, budget=0)]
        out += [Job(f"{prefix}_s{seed}", algorithm=algo, seed=seed) for algo, prefix in algorithms]
    out += [Job("budget1_s0", budget=1), Job("budget2_s0", budget=2)]
    out += [Job("size_small_s0", size="small"), Job("size_large_s0", size="large")]
    return out


@dataclass
class Sweep:
    """Runs the jobs: bases first (each once), RL runs when their base is ready, ``jobs`` at a time."""

    args: argparse.Namespace
    bases: dict[str, Future] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    record: dict = field(default_factory=dict)

    def _run(self, argv: list[str], log: Path) -> float:
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        start = time.time()
        with log.open("w") as f:
            done = subprocess.run([sys.executable, "-m", "zerotir", *argv], cwd=REPO, env=env, stdout=f,
                                  stderr=subprocess.STDOUT)
        if done.returncode:
            raise RuntimeError(f"python -m zerotir {' '.join(argv[:2])} failed ({done.returncode}); see {log}")
        return time.time() - start

    def base(self, size: str) -> Path:
        settings = {**yaml.safe_load(CONFIG.read_text())["toy_base"], **SIZES[size], "threads": 1,
                    "minutes": self.args.base_minutes}
        out = self.args.out / f"base_{size}"
        flags = [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        seconds = self._run(["toy-base", "--out", str(out), "--no-progress", *flags], self.args.out / f"base_{size}.log")
        self._log(f"base {size} ready in {seconds / 60:.1f} min")
        return out

    def rl(self, job: Job) -> None:
        base = self.bases[job.size].result()
        run_dir = self.args.out / job.name
        if (run_dir / "done.json").is_file():
            self._log(f"{job.name}: done before, kept")
            return
        argv = ["fit", "--config", str(CONFIG), "--toy_base", "null", "--model.model_path", str(base),
                "--trainer.default_root_dir", str(run_dir), "--trainer.enable_progress_bar", "false",
                "--trainer.max_steps", str(self.args.steps), "--trainer.val_check_interval", str(self.args.val_every),
                "--trainer.enable_checkpointing", "false", "--data.limit_val_rows", "128",
                "--seed_everything", str(job.seed), "--model.seed", str(job.seed), "--data.seed", str(job.seed),
                "--model.rl.algorithm", job.algorithm, "--model.tool.max_tool_calls", str(job.budget),
                *(PPO_ARGS if job.algorithm == "ppo" else []), *job.extra]
        self._log(f"{job.name}: start")
        seconds = self._run(argv, self.args.out / f"{job.name}.log")
        (run_dir / "done.json").write_text(json.dumps({"job": job.__dict__, "seconds": seconds}) + "\n")
        self._log(f"{job.name}: done in {seconds / 60:.1f} min")

    def _log(self, text: str) -> None:
        with self.lock:
            load = os.getloadavg()[0]
            print(f"[{time.strftime('%H:%M:%S')} load {load:.1f}] {text}", flush=True)

    def run(self, todo: list[Job], sizes: list[str] | None = None) -> None:
        if sizes is None:
            sizes = ["medium"] + sorted({j.size for j in todo} - {"medium"}, key=list(SIZES).index)
        with ThreadPoolExecutor(self.args.jobs) as pool:
            # A base is submitted before every job that waits for it, so a waiting slot never blocks its own base:
            # the medium base and the slowest (large) first, the runs on the medium base, then the other bases.
            early = [s for s in sizes if s in ("medium", "large")]
            self.bases = {size: pool.submit(self.base, size) for size in early}
            futures = [pool.submit(self.rl, job) for job in todo if job.size == "medium"]
            self.bases.update({size: pool.submit(self.base, size) for size in sizes if size not in early})
            futures += [pool.submit(self.rl, job) for job in todo if job.size != "medium"]
            for f in futures:
                try:
                    f.result()
                except RuntimeError as err:
                    self._log(f"FAILED: {err}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "runs" / "findings", help="runs and bases")
    p.add_argument("--docs", type=Path, default=REPO / "docs", help="where findings.md and its figures go")
    p.add_argument("--steps", type=int, default=40, help="RL steps per run")
    p.add_argument("--val_every", type=int, default=10, help="RL steps between validations")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=3,
                   help="jobs at a time (one torch thread each; the large base holds one slot for most of the sweep)")
    p.add_argument("--base_minutes", type=float, default=120.0,
                   help="safety cap of each base's pretraining; the copy probe ends it first")
    p.add_argument("--only", nargs="*", default=None, help="run only these job names")
    p.add_argument("--report-only", action="store_true", help="only write the report from existing runs")
    p.add_argument("--bases", nargs="+", choices=list(SIZES), default=None,
                   help="only build these bases (the sweep reuses them: same settings)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.toy_findings " + " ".join(argv if argv is not None else sys.argv[1:])
    start = time.time()
    if args.bases:
        Sweep(args).run([], sizes=args.bases)
        return
    if not args.report_only:
        todo = [j for j in jobs(args.seeds) if args.only is None or j.name in args.only]
        Sweep(args).run(todo)
    from benchmarks.toy_findings_report import write_report

    write_report(args.out, args.docs, command.strip(), sweep_minutes=(time.time() - start) / 60,
                 steps=args.steps, seeds=args.seeds)
    print(f"wrote {args.docs / 'findings.md'}", flush=True)


if __name__ == "__main__":
    main()
