"""The toy world, shortened: from a small toy base made here (cached), outcome-only RL makes tool use and reward rise.

The same pieces as ``configs/toy_cpu.yaml`` and ``benchmarks/toy_emergence.py`` (toy corpus, probe-stopped
pretraining, the real sandbox, REINFORCE++ with 16 prompts x 8 samples), with a smaller base and a few RL steps. The
full run's targets (>= 80% held-out accuracy and code use) are the benchmark's business; this test asserts the
direction with a margin: the base rarely calls the tool and is rarely right, and within the first steps both the
share of responses with code and the reward climb well above where they started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, read_scalars, run_cli
from zerotir import metric_names as mn
from zerotir.toy.pretrain import ensure_toy_base, read_info

# The toy base recipe with a smaller budget; pretraining ends when the copy probe passes (see zerotir.toy.train_loop).
BASE = dict(seed=0, threads=2, minutes=8.0, probe_threshold=0.3, decay_steps=100, eval_n=0)
RL_STEPS = 14


@pytest.fixture(scope="module")
def emergence_base(request, tmp_path_factory) -> Path:
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("zerotir_emergence_base") if cache is not None else tmp_path_factory.mktemp("emergence")
    return ensure_toy_base(Path(folder) / "base", show_progress=False, **BASE)


@pytest.mark.slow
def test_tool_use_and_reward_rise_under_outcome_reward(emergence_base, tmp_path):
    record = read_info(emergence_base)["record"]
    assert record["decay_reason"] == "probe", f"the base never learned to copy: {record['probe'][-3:]}"
    args = [
        "fit", "--config", str(REPO / "configs" / "toy_cpu.yaml"),
        "--model.model_path", str(emergence_base), "--toy_base", "null",
        "--model.sandbox.workers", "1",
        "--data.train_files", json.dumps([str(REPO / "data" / "toy" / "train.jsonl")]),
        "--trainer.max_steps", str(RL_STEPS), "--trainer.limit_val_batches", "0",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--checkpoint.every_n_train_steps", str(RL_STEPS),
    ]
    run_cli(args)
    scalars = read_scalars(tmp_path / "tensorboard")
    code = [v for _, v in scalars[mn.CODE_RATE]]
    reward = [v for _, v in scalars[mn.REWARD_MEAN]]
    assert len(code) == len(reward) == RL_STEPS

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    first, last = slice(0, 3), slice(-3, None)
    # The base rarely calls the tool and is rarely right; after a dozen steps code use has more than doubled and the
    # reward tripled. Measured at these steps (2 machines, 3 runs): code 0.05 -> 0.30, reward 0.02-0.03 -> 0.17; one
    # step's reward (128 samples) wobbles by about 0.035, so the margins below sit 3 standard errors under the
    # measured rise (the full run goes on to > 80%: benchmarks/toy_emergence.py).
    assert mean(code[first]) < 0.3, code
    assert mean(code[last]) > 2 * mean(code[first]) and mean(code[last]) > mean(code[first]) + 0.15, code
    assert mean(reward[last]) > 3 * mean(reward[first]) and mean(reward[last]) > mean(reward[first]) + 0.08, reward
