"""The paper's findings, measured in the mixed toy world with multi-step questions: the sweeps, then docs/findings.md.

    python -m benchmarks.toy_findings                                  # the whole sweep, then the report
    python -m benchmarks.toy_findings --out /tmp/f30 --report-only     # the report from the runs already there

Method. ``configs/toy_multi.yaml``: easy questions a tiny base answers in text, hard ones it
cannot, and multi-step ones (``digitsum(a * b)``) whose reliable answer takes two calls, so the call budget can buy
something and "one call" is measured rather than given by the corpus. Bases of three sizes (about 0.23M, 0.85M and
1.9M parameters), each pretrained with two seeds (``--pseeds``) until its copy probe passes (a quality criterion: a
wall-time budget would make the base depend on the machine's load) or ``--base_steps`` steps. Then RL runs of
``--steps`` steps, varying one thing at a time:

- ``tir_{size}_p{p}_s{s}``: ZeroTIR, REINFORCE++, budget 4, every size and pretraining seed, RL seeds ``--seeds``
  (the medium ones are the reference runs of the findings about one run's dynamics);
- ``norl_s{s}``: the same without tools (``max_tool_calls 0``: ZeroRL) on the medium base of pretraining seed 0;
- ``ppo_s{s}``: PPO on that base;
- ``budget{1,2}_s{s}``: call budgets 1 and 2 on that base.

Validation: 128 questions of each held-out split (easy, hard, multi-step, long), greedy, every ``--val_every`` steps
and at the last step (every verdict reads the last one). Jobs run ``--jobs`` at a time with one torch thread each
(``OMP_NUM_THREADS=1``), the bases first, the slowest first. Each job's log lies next to its run folder. The report
(``toy_findings_report.py``) reads the TensorBoard logs and writes ``<docs>/findings.md`` with PNG figures, every
number a verdict rests on with its spread over seeds; a finding whose runs are missing is reported as not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml


REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "toy_multi.yaml"
SWEEP_FILE = "sweep.json"  # the sweep's command and wall time, for a report written later with --report-only
# name -> tiny-Llama shape (parameters with the byte vocabulary: ~0.23M, ~0.85M, ~1.9M). Every size keeps heads of
# 16 dimensions. A large base of hidden size 256 (3.3M) took 31 min to pass its copy probe, at lr 2e-3 (at 4e-3, and
# with 8 heads of 32, it never passed): two of them would take 70% of the sweep's 90 minutes, so the large size is
# 192 wide, at the lower lr.
SIZES = {
    "small": {"hidden_size": 64, "num_layers": 3, "num_heads": 4, "intermediate_size": 256},
    "medium": {"hidden_size": 128, "num_layers": 3, "num_heads": 8, "intermediate_size": 512},
    "large": {"hidden_size": 192, "num_layers": 3, "num_heads": 12, "intermediate_size": 768, "lr": 2.0e-3},
}
PPO_ARGS = ["--model.optim.critic_lr", "2.0e-4", "--model.rl.gamma", "1.0", "--model.rl.gae_lambda", "0.95",
            "--model.rl.vf_coef", "0.5", "--model.rl.value_clip", "0.2"]


@dataclass(frozen=True)
class Job:
    """One RL run: its name (= folder), base size and pretraining seed, algorithm, RL seed and call budget."""

    name: str
    size: str = "medium"
    algorithm: str = "reinforce_pp"
    seed: int = 0
    budget: int = 4
    extra: tuple[str, ...] = ()  # further command-line settings of the run (another benchmark's arms)
    pseed: int = 0  # the base's pretraining seed

    @property
    def base(self) -> tuple[str, int]:
        return self.size, self.pseed


def tir_name(size: str, pseed: int, seed: int) -> str:
    """The name of the ZeroTIR run on the base of ``size`` pretrained with seed ``pseed``, RL seed ``seed``."""
    return f"tir_{size}_p{pseed}_s{seed}"


def jobs(seeds: list[int], pseeds: list[int]) -> list[Job]:
    """The RL runs of the sweep, in the order they start (the reference runs and the headline first)."""
    out = [Job(tir_name("medium", p, s), seed=s, pseed=p) for p in pseeds for s in seeds]
    for seed in seeds:
        out += [Job(f"norl_s{seed}", seed=seed, budget=0), Job(f"ppo_s{seed}", algorithm="ppo", seed=seed)]
        out += [Job(f"budget{b}_s{seed}", seed=seed, budget=b) for b in (1, 2)]
    out += [Job(tir_name(size, p, s), size=size, seed=s, pseed=p) for size in ("large", "small") for p in pseeds
            for s in seeds]
    return out


def base_name(size: str, pseed: int) -> str:
    """The folder of the base of ``size`` pretrained with seed ``pseed``."""
    return f"base_{size}_p{pseed}"


@dataclass
class Sweep:
    """Runs the jobs: bases first (each once), RL runs when their base is ready, ``jobs`` at a time."""

    args: argparse.Namespace
    config: Path = CONFIG
    bases: dict[tuple[str, int], Future] = field(default_factory=dict)
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

    def base(self, size: str, pseed: int = 0) -> Path:
        settings = {**yaml.safe_load(self.config.read_text())["toy_base"], **SIZES[size], "threads": 1,
                    "minutes": self.args.base_minutes, "steps": self.args.base_steps, "seed": pseed}
        out = self.args.out / base_name(size, pseed)
        flags = [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        seconds = self._run(["toy-base", "--out", str(out), "--no-progress", *flags], out.with_suffix(".log"))
        self._log(f"base {size} p{pseed} ready in {seconds / 60:.1f} min")
        return out

    def rl(self, job: Job) -> None:
        base = self.bases[job.base].result()
        run_dir = self.args.out / job.name
        if (run_dir / "done.json").is_file():
            self._log(f"{job.name}: done before, kept")
            return
        argv = ["fit", "--config", str(self.config), "--toy_base", "null", "--model.base.path", str(base),
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

    def run(self, todo: list[Job], bases: list[tuple[str, int]] | None = None) -> None:
        if bases is None:
            bases = sorted({j.base for j in todo}, key=lambda b: (-list(SIZES).index(b[0]), b[1]))  # largest first
        with ThreadPoolExecutor(self.args.jobs) as pool:
            # Every base is submitted before every job that waits for one, so a waiting slot never blocks its own
            # base; the slowest bases first, as the critical path runs through them and their runs.
            self.bases = {base: pool.submit(self.base, *base) for base in bases}
            futures = [pool.submit(self.rl, job) for job in todo]
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
    p.add_argument("--val_every", type=int, default=20,
                   help="RL steps between validations (each takes about 3 training steps' time: 512 greedy answers)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds")
    p.add_argument("--pseeds", type=int, nargs="+", default=[0, 1], help="pretraining seeds of every size's bases")
    p.add_argument("--jobs", type=int, default=3,
                   help="jobs at a time (one torch thread each; the large base holds one slot for most of the sweep)")
    p.add_argument("--base_minutes", type=float, default=120.0,
                   help="safety cap of each base's pretraining; the copy probe ends it first")
    p.add_argument("--base_steps", type=int, default=3000,
                   help="the most pretraining steps of a base (its decay starts 300 before): in the first full sweep "
                        "every base that passed its copy probe did so by step 2200, and none that had not passed by "
                        "2700 passed by 3700")
    p.add_argument("--only", nargs="*", default=None, help="run only these job names")
    p.add_argument("--report-only", action="store_true", help="only write the report from existing runs")
    p.add_argument("--bases", nargs="+", choices=list(SIZES), default=None,
                   help="only build these sizes' bases, one per pretraining seed (the sweep reuses them)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    if __package__ in (None, ""):  # `python benchmarks/toy_findings.py`: become the module (it imports its report)
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.toy_findings", *sys.argv[1:]],
                  dict(os.environ, PYTHONPATH=path))
    # Imported before the sweep, not after it: a broken import must fail in a second, not after 90 minutes of runs.
    from benchmarks.toy_findings_report import write_report

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = ("python -m benchmarks.toy_findings " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    start = time.time()
    if args.bases:
        Sweep(args).run([], bases=[(size, p) for size in args.bases for p in args.pseeds])
        return
    record_file = args.out / SWEEP_FILE
    if args.report_only:
        swept = json.loads(record_file.read_text()) if record_file.is_file() else None
    else:
        todo = [j for j in jobs(args.seeds, args.pseeds) if args.only is None or j.name in args.only]
        Sweep(args).run(todo)
        swept = {"command": command, "minutes": round((time.time() - start) / 60, 1),
                 "ended": time.strftime("%Y-%m-%d %H:%M")}
        record_file.write_text(json.dumps(swept) + "\n")
    write_report(args.out, args.docs, command, swept=swept, steps=args.steps, seeds=args.seeds, pseeds=args.pseeds)
    print(f"wrote {args.docs / 'findings.md'}", flush=True)


if __name__ == "__main__":
    main()
