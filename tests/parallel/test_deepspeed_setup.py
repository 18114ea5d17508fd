"""The DeepSpeed-specific parts of the trainer that run without a GPU: the config checks (on the shipped configs and
on broken copies), transformers' ZeRO-3 switch and the skipped-step count."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.parallel.accumulation import deepspeed_importable, exact_on_cpu, full_batch, run_one_cpu_rank
from zerotir.config import HFRollout, VLLMRollout
from zerotir.parallel.deepspeed_setup import (
    DeepSpeedConfigError,
    check_deepspeed_config,
    check_fit_setup,
    check_rollout_backend,
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


def test_transformers_engine_under_multi_rank_zero3_is_refused_naming_the_fix():
    # ranks decode different numbers of steps and every ZeRO-3 forward all-gathers: refused before any model loads
    with pytest.raises(ValueError, match=r"model.rollout=HFRollout with DeepSpeed ZeRO-3 on 2 ranks.*deadlock.*"
                                         r"Fix: set model.rollout.class_path: zerotir.config.VLLMRollout"):
        check_rollout_backend(zero3=True, world_size=2, backend=HFRollout())
    check_rollout_backend(zero3=True, world_size=1, backend=HFRollout())  # one rank: nobody to wait for
    check_rollout_backend(zero3=False, world_size=8, backend=HFRollout())  # ZeRO-2: full parameters on every rank
    check_rollout_backend(zero3=True, world_size=8, backend=VLLMRollout())


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


# ----- ZeRO-3 gradient accumulation inside one engine.forward (Lightning's call structure) -----

def _run_worker(out: Path) -> dict:
    """Both workers in one new process (``tests.gloo.spawned``) on DeepSpeed's CPU accelerator, gloo; what they
    return, through ``out``."""
    run_one_cpu_rank(_worker_process, (str(out),), timeout_s=560)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> dict:
    """Both checks below in one worker process (one DeepSpeed import for the two):
    ``{"accumulation": _accumulation_worker(), "critic": _critic_head_worker()}``."""
    return _run_worker(tmp_path_factory.mktemp("deepspeed_worker") / "results.json")


@pytest.mark.timeout(600)  # a hang guard: the first test runs the worker of both (fixture)
@pytest.mark.skipif(not deepspeed_importable(), reason="deepspeed is not installed")
def test_critic_value_head_is_initialised_under_zero3(worker):
    """Loaded inside ``deepspeed.zero.Init`` (as Lightning's ZeRO-3 strategy runs ``configure_model``), the critic's
    value head is partitioned as soon as it is built: its init must reach the gathered parameters (std 1 / (h + 1),
    bias 0), not leave ``nn.Linear``'s default (std about 1 / sqrt(3 h), a nonzero bias)."""
    head = worker["critic"]
    assert head["partitioned"]  # the test really ran on ZeRO-3 placeholders
    assert head["bias_max"] == 0.0
    assert 0.7 < head["std"] * (head["hidden_size"] + 1) < 1.3, head


@pytest.mark.timeout(600)
@pytest.mark.skipif(not deepspeed_importable(), reason="deepspeed is not installed")
def test_micro_batches_accumulate_inside_one_engine_forward(worker):
    """Lightning runs the whole training_step inside one ``DeepSpeedEngine.forward``: two micro-batch backward calls
    (through ``ZeroTIRModule._backward``, as ``ppo_update`` makes them) and the optimizer step happen in there. Both
    ZeRO-2 and ZeRO-3 must then move the weights exactly like one full-batch gradient step (SGD, lr 1). Without
    ``begin_micro_batch`` ZeRO-3 keeps only the last micro-batch's gradient (error ~0.5 here)."""
    errors = worker["accumulation"]
    assert set(errors) == {"zero2.json", "zero3.json"}
    for name, err in errors.items():
        assert err < 1e-6, (name, errors)


def _accumulation_worker() -> dict[str, float]:
    """One process, gloo, DeepSpeed's CPU accelerator: the error of each shipped ZeRO config against the full batch."""
    from types import SimpleNamespace

    import deepspeed
    import torch
    import torch.distributed as dist

    from zerotir.module import ZeroTIRModule

    class TrainingStepInForward(torch.nn.Module):
        """Stands in for the LightningModule that Lightning's ``_forward_redirection`` runs inside engine.forward."""

        def __init__(self, net: torch.nn.Module):
            super().__init__()
            self.net = net
            self.steps: list = []  # holds the step callable, set after deepspeed.initialize (not a submodule)

        def forward(self, x, y):
            backward, step = self.steps[0]
            for rows in (slice(0, 3), slice(3, 6)):  # two micro-batches of 3, each weighted by its share (1/2)
                backward(torch.nn.functional.mse_loss(self.net(x[rows]), y[rows]) * 0.5)
            step()
            return torch.zeros(())

    dist.init_process_group("gloo", rank=0, world_size=1)
    errors = {}
    for name in ("zero2.json", "zero3.json"):
        config = exact_on_cpu(ds_config(name))
        problem = full_batch()
        net = problem.net
        wrapper = TrainingStepInForward(net)
        opt = torch.optim.SGD(wrapper.parameters(), lr=1.0)
        engine, _, _, _ = deepspeed.initialize(model=wrapper, optimizer=opt, config=config,
                                               model_parameters=wrapper.parameters())
        # The module's own backward, with the trainer it reads under Lightning's DeepSpeedStrategy.
        module = SimpleNamespace(trainer=Trainer(DeepSpeedStrategy(config)), manual_backward=engine.backward)
        module.trainer.model = engine
        wrapper.steps.append((lambda loss: ZeroTIRModule._backward(module, loss), engine.step))
        engine(problem.x, problem.y)
        with deepspeed.zero.GatheredParameters(list(net.parameters()), modifier_rank=None):
            after = [p.detach().clone() for p in net.parameters()]
        errors[name] = problem.error(after)
        engine.destroy()
    dist.destroy_process_group()
    return errors


def _critic_head_worker(hidden_size: int = 256) -> dict:
    """One process, gloo, DeepSpeed's CPU accelerator: a tiny critic loaded as under ZeRO-3, its gathered value head."""
    import tempfile

    import deepspeed
    import torch.distributed as dist

    from zerotir import models
    from zerotir.toy.tiny_model import build_tiny_model
    from zerotir.toy.tokenizer import build_byte_tokenizer

    dist.init_process_group("gloo", rank=0, world_size=1)
    config = ds_config("zero3.json")
    config["bf16"] = {"enabled": False}
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_model(build_byte_tokenizer(), save_dir=tmp, hidden_size=hidden_size, num_layers=1, num_heads=2)
        held = hf_zero3_config(Trainer(DeepSpeedStrategy(config)))  # transformers' switch, as configure_model holds it
        with deepspeed.zero.Init(config_dict_or_path=config):
            critic = models.load_critic(tmp)
        head = critic.value_head
        partitioned = head.weight.numel() == 0 and head.weight.ds_numel == hidden_size
        with deepspeed.zero.GatheredParameters(list(head.parameters())):
            out = {"partitioned": partitioned, "hidden_size": hidden_size, "std": float(head.weight.std()),
                   "bias_max": float(head.bias.abs().max())}
        del held
    dist.destroy_process_group()
    return out


def _worker_process(rank: int, out: str) -> None:
    """The new process of ``_run_worker``: both workers, their results as JSON in ``out``."""
    from zerotir.parallel.cpu_deepspeed import without_shm_allreduce

    with without_shm_allreduce():  # DeepSpeed's CPU backend would JIT-build an op these workers never use (minutes)
        results = {"accumulation": _accumulation_worker(), "critic": _critic_head_worker()}
    Path(out).write_text(json.dumps(results))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_weights_train_only_with_deepspeeds_fp32_masters(dtype):
    # Plain AdamW on bf16 weights rounds RL-sized updates away: refused with both fixes named.
    plain = SimpleNamespace(strategy=object())
    with pytest.raises(ValueError, match=rf"model.base.dtype={dtype} without DeepSpeed.*model.base.dtype: float32 \(with "
                                         r"trainer.precision: bf16-mixed.*or train with a DeepSpeed strategy"):
        check_fit_setup(plain, dtype, 1.0, "adamw")
    check_fit_setup(plain, "float32", 1.0, "adamw")
    DeepSpeedStrategy = type("DeepSpeedStrategy", (), {"config": json.loads(Path("configs/deepspeed/zero2.json")
                                                                              .read_text())})
    check_fit_setup(SimpleNamespace(strategy=DeepSpeedStrategy()), dtype, 1.0, "adamw")  # fp32 masters
