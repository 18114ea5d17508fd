"""The DeepSpeed-specific parts of the trainer that run without a GPU: the config checks (on the shipped configs and
on broken copies), transformers' ZeRO-3 switch and the skipped-step count."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import yaml

from zerotir.scale.deepspeed_setup import (
    DeepSpeedConfigError,
    check_deepspeed_config,
    count_skipped_step,
    hf_zero3_config,
    is_deepspeed,
    is_zero3,
)

REPO = Path(__file__).resolve().parents[2]
DEEPSPEED_RUNS = [p for p in sorted((REPO / "configs").glob("*.yaml")) if "DeepSpeedStrategy" in p.read_text()]


class DeepSpeedStrategy:
    """Stands in for Lightning's strategy (matched by class name): a config dict and the ZeRO-3 flag."""

    def __init__(self, config: dict):
        self.config = config
        self.zero_stage_3 = config.get("zero_optimization", {}).get("stage") == 3


class Trainer:
    def __init__(self, strategy):
        self.strategy = strategy


def ds_config(name: str) -> dict:
    return json.loads((REPO / "configs" / "deepspeed" / name).read_text())


@pytest.mark.parametrize("path", DEEPSPEED_RUNS, ids=lambda p: p.name)
def test_shipped_runs_pass_the_checks(path):
    run = yaml.safe_load(path.read_text())
    config = json.loads((REPO / run["trainer"]["strategy"]["init_args"]["config"]).read_text())
    check_deepspeed_config(config, run["model"]["optim"]["max_grad_norm"], run["model"]["optim"]["optimizer"])


def test_there_are_deepspeed_runs():
    assert len(DEEPSPEED_RUNS) >= 3


@pytest.mark.parametrize("change,optimizer,max_grad_norm,match", [
    ({"managed_gradient_accumulation": None}, "adamw", 1.0, r"managed_gradient_accumulation=None.*false"),
    ({"managed_gradient_accumulation": True}, "adamw", 1.0, r"managed_gradient_accumulation=True"),
    ({"gradient_clipping": 0.5}, "adamw", 1.0, r"gradient_clipping=0.5 but model.optim.max_grad_norm=1.0.*\"gradient_clipping\": 1.0"),
    ({"gradient_clipping": None}, "adamw", 1.0, r"gradient_clipping=None"),
    ({"optimizer": {"type": "AdamW"}}, "adamw", 1.0, r"optimizer: the DeepSpeed config defines its own optimizer"),
    ({"scheduler": {"type": "WarmupLR"}}, "adamw", 1.0, r"scheduler: the DeepSpeed config"),
    ({}, "deepspeed_cpu_adam", 1.0, r"deepspeed_cpu_adam' without zero_optimization.offload_optimizer"),
])
def test_each_mismatch_names_the_field_and_the_fix(change, optimizer, max_grad_norm, match):
    config = ds_config("zero3.json")
    for key, value in change.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    with pytest.raises(DeepSpeedConfigError, match=match) as err:
        check_deepspeed_config(config, max_grad_norm, optimizer)
    assert "trainer.strategy.init_args.config" in str(err.value) and "Fix:" in str(err.value)


def test_offload_needs_the_cpu_optimizer_and_clipping_off_matches_zero():
    with pytest.raises(DeepSpeedConfigError, match=r"offload_optimizer.device='cpu' with model.optim.optimizer='adamw'"):
        check_deepspeed_config(ds_config("zero3_offload_optimizer.json"), 1.0, "adamw")
    config = ds_config("zero2.json")
    config.pop("gradient_clipping")  # absent = DeepSpeed does not clip = max_grad_norm 0
    check_deepspeed_config(config, 0.0, "adamw")


def test_every_problem_is_reported_at_once():
    config = ds_config("zero2.json")
    config.pop("managed_gradient_accumulation")
    with pytest.raises(DeepSpeedConfigError) as err:
        check_deepspeed_config(config, 0.3, "adamw")
    assert "managed_gradient_accumulation" in str(err.value) and "gradient_clipping=1.0" in str(err.value)


def test_hf_zero3_switch_lives_as_long_as_its_holder(monkeypatch):
    pytest.importorskip("accelerate", reason="transformers' HfDeepSpeedConfig needs accelerate")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from transformers.integrations import is_deepspeed_zero3_enabled

    zero2, zero3 = Trainer(DeepSpeedStrategy(ds_config("zero2.json"))), Trainer(DeepSpeedStrategy(ds_config("zero3.json")))
    assert is_deepspeed(zero2) and not is_zero3(zero2) and hf_zero3_config(zero2) is None
    assert not is_deepspeed(Trainer(object()))
    held = hf_zero3_config(zero3)
    try:
        assert is_deepspeed_zero3_enabled()
    finally:
        del held
        gc.collect()
    assert not is_deepspeed_zero3_enabled()


def test_skipped_step_runs_only_lightnings_counting_hooks():
    calls = []

    class Optimizer:
        def _on_before_step(self):
            calls.append("before")

        def _on_after_step(self):
            calls.append("after")

        def step(self):  # must not be reached
            calls.append("step")

    count_skipped_step(Optimizer())
    assert calls == ["before", "after"]
