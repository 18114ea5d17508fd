"""The DeepSpeed configs under configs/deepspeed/ accumulate gradients the way the trainer uses them.

The module runs several ``manual_backward`` calls (micro-batches, each loss weighted by its share of the tokens) and
then one ``optimizer.step()``. Under ZeRO-2 DeepSpeed's default *managed* accumulation with
``gradient_accumulation_steps = 1`` treats every backward as a boundary and keeps only the last micro-batch's
gradient; ``"managed_gradient_accumulation": false`` makes ``step()`` the boundary. This test runs each shipped config
(bf16 off so the comparison is exact, clipping off) on a small MLP on CPU with gloo, and checks that two half-batch
backward calls and one SGD step move the weights exactly like one full-batch gradient step, and that the same run with
the flag removed does not (so the check can fail). The checks run in one new process (``tests.parallel.accumulation``:
DeepSpeed must see DS_ACCELERATOR before it is imported), one process group for all of them and a new model, optimizer
and engine for each, as ``tests/parallel/test_deepspeed_setup.py`` runs both ZeRO stages in one process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.parallel.accumulation import deepspeed_importable, exact_on_cpu, full_batch, run_one_cpu_rank

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "deepspeed").glob("*.json"))


# (config, drop the flag): each shipped ZeRO config as shipped, and ZeRO-2 without the flag (the check can fail).
CHECKS = [("zero2.json", False), ("zero2.json", True), ("zero3.json", False)]


def run_checks(checks: list[tuple[str, bool]], out: Path) -> dict[tuple[str, bool], dict]:
    """Every check in one new process, its results written to ``out``: ``{(config name, drop_flag): {"config",
    "drop_flag", "max_err"}}``."""
    run_one_cpu_rank(_checks_process, (checks, str(out)), timeout_s=480)
    return {(r["config"], r["drop_flag"]): r for r in json.loads(out.read_text())}


@pytest.fixture(scope="module")
def accumulation_errors(tmp_path_factory) -> dict[tuple[str, bool], dict]:
    return run_checks(CHECKS, tmp_path_factory.mktemp("accumulation") / "results.json")


def test_every_config_sets_the_flag() -> None:
    assert {p.name for p in CONFIGS} >= {"zero2.json", "zero3.json", "zero3_offload_optimizer.json"}
    for path in CONFIGS:
        config = json.loads(path.read_text())
        assert config.get("managed_gradient_accumulation") is False, f"{path.name}: set it to false (see docstring)"
        assert config["bf16"] == {"enabled": True}
        assert config["gradient_clipping"] > 0  # the module's max_grad_norm lives here under DeepSpeed


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not deepspeed_importable(), reason="deepspeed is not installed")
@pytest.mark.parametrize("name", ["zero2.json", "zero3.json"])
def test_micro_batches_accumulate_like_one_batch(name: str, accumulation_errors) -> None:
    result = accumulation_errors[(name, False)]
    assert result["max_err"] < 1e-6, result
    if name == "zero2.json":  # without the flag ZeRO-2 keeps only the last micro-batch's gradient
        assert accumulation_errors[(name, True)]["max_err"] > 1e-3


def _worker(config_path: Path, drop_flag: bool) -> dict:
    """One check, inside the process group the caller set up."""
    import deepspeed
    import torch

    config = exact_on_cpu(json.loads(config_path.read_text()))
    if drop_flag:
        config.pop("managed_gradient_accumulation")
    problem = full_batch()
    x, y = problem.x, problem.y
    opt = torch.optim.SGD(problem.net.parameters(), lr=1.0)
    engine, _, _, _ = deepspeed.initialize(model=problem.net, optimizer=opt, config=config,
                                           model_parameters=problem.net.parameters())
    for rows in (slice(0, 3), slice(3, 6)):  # two micro-batches of 3, each weighted by its share (1/2)
        engine.backward(torch.nn.functional.mse_loss(engine(x[rows]), y[rows]) * 0.5)
    engine.step()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        after = [p.detach().clone() for p in engine.module.parameters()]
    return {"config": config_path.name, "drop_flag": drop_flag, "max_err": problem.error(after)}


def _checks_process(rank: int, checks: list[tuple[str, bool]], out: str) -> None:
    """The new process of ``run_checks``: one process group for every check, their results as one JSON list."""
    import torch.distributed as dist

    from zerotir.parallel.cpu_deepspeed import without_shm_allreduce

    dist.init_process_group("gloo", rank=rank, world_size=1)
    with without_shm_allreduce():  # DeepSpeed's CPU backend would JIT-build an op these checks never use (minutes)
        results = [_worker(REPO / "configs" / "deepspeed" / name, drop) for name, drop in checks]
    dist.destroy_process_group()
    Path(out).write_text(json.dumps(results))
