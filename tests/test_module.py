"""The module's Lightning plumbing with a scripted rollout (no sandbox, no generation): step counting, the update of
every trainable parameter, the frozen reference, skipped updates, checkpoint contents and in-process resume."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from callbacks import PassRateFilter, ScalingMetrics
from tests.scripted_source import FixedStream, IdleEngine, Recorder, ScriptedSource, recorded
from zerotir.data.datamodule import PromptDataModule
from zerotir.config import (
    BaseModelConfig, EvalConfig, FilterConfig, HFRollout, OptimConfig, RLConfig, SamplingConfig, SandboxConfig, ToolConfig,
    VLLMRollout)
from zerotir.module import ZeroTIRModule
from zerotir.rewards import MathReward
from zerotir.rollout.tp_group import TensorParallelGroup
from zerotir.toy.tokenizer import build_byte_tokenizer



def small_module(tiny_dir, eval_n=1, **rl) -> ZeroTIRModule:
    return ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(**{"micro_batch_size": 2, **rl}),
                         optim=OptimConfig(lr=1e-2), sampling=SamplingConfig(n=2, max_response_tokens=16),
                         eval=EvalConfig(SamplingConfig(n=eval_n, temperature=0.0, max_response_tokens=16)),
                         filters=FilterConfig(pass_rate=True, pass_rate_low=0.2, pass_rate_high=0.8), seed=3)


def make_run(tiny_dir, train_file, root, all_wrong=False, max_steps=2, eval_n=1, **rl):
    pl.seed_everything(0)  # the critic's value head is initialised from the global RNG
    module = small_module(tiny_dir, eval_n, **rl)
    source = module.source = ScriptedSource(module, all_wrong)
    data = PromptDataModule(train_files=[str(train_file)], template="plain", tokenizer=str(tiny_dir),
                            prompts_per_step=2, test_files=[])
    ckpt = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=1, save_last=True, save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root,
                         callbacks=[PassRateFilter(), ScalingMetrics(), ckpt, Recorder()])
    return module, data, trainer, source




def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("algorithm,kl_coef,steps_per_rl_step", [("ppo", 0.05, 1), ("grpo", 0.0, 2),
                                                                  ("rloo", 0.05, 1), ("reinforce_baseline", 0.0, 1)])
def test_every_trainable_parameter_changes_and_the_reference_does_not(
        tiny_dir, train_file, tmp_path, algorithm, kl_coef, steps_per_rl_step):
    # max_steps counts optimizer steps: ppo_epochs of them per RL step.
    module, data, trainer, _ = make_run(tiny_dir, train_file, tmp_path, algorithm=algorithm, kl_coef=kl_coef,
                                        ppo_epochs=steps_per_rl_step, max_steps=2 * steps_per_rl_step)
    module.configure_model()
    before = _snapshot(module)
    trainer.fit(module, datamodule=data)
    assert module.rl_steps_done == 2 and trainer.global_step == 2 * steps_per_rl_step
    after = _snapshot(module)
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all(not torch.equal(before[n], after[n]) for n in trainable)
    if kl_coef:
        frozen = [n for n in before if n.startswith("ref_model.")]
        assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)
        assert "kl" in recorded(trainer)[-1].stats
    groups = trainer.optimizers[0].param_groups
    assert [g["name"] for g in groups] == (["actor", "critic"] if algorithm == "ppo" else ["actor"])
    n_opt = sum(p.numel() for g in groups for p in g["params"])
    assert n_opt == sum(p.numel() for n, p in module.named_parameters() if not n.startswith("ref_model."))
    assert data.consumed == 2


def test_skipped_update_keeps_step_count_and_weights(tiny_dir, train_file, tmp_path):
    module, data, trainer, _ = make_run(tiny_dir, train_file, tmp_path, all_wrong=True, algorithm="grpo")
    module.configure_model()
    before = _snapshot(module)
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 2 and module.rl_steps_done == 2 and data.consumed == 2
    assert all(torch.equal(before[n], p) for n, p in module.named_parameters())
    results = recorded(trainer)
    assert [r.rl_step for r in results] == [1, 2] and all(r.skipped and r.stats == {} for r in results)
    assert all(len(r.rollout) == 4 and not r.kept.any() for r in results)


class CopyingEngine(IdleEngine):
    """A separate engine, as vLLM is: its weights arrive through the real bucketed sync (``zerotir.parallel.weight_sync``)
    and ``update_weights`` copies every tensor it is sent."""

    def __init__(self):
        self.weights: dict[str, torch.Tensor] = {}

    def load_weights_from(self, actor) -> None:
        from zerotir.parallel.weight_sync import sync_weights

        sync_weights(actor, self, 1 << 20)

    def update_weights(self, bucket) -> None:
        self.weights.update({name: tensor.detach().clone() for name, tensor in bucket})


class EngineMatchesActor(pl.Callback):
    """After each training step: does the engine hold exactly the actor's current weights?"""

    def __init__(self, engine: CopyingEngine):
        self.engine = engine
        self.matches: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        actor = dict(pl_module.actor.named_parameters())
        self.matches.append(set(self.engine.weights) == set(actor)
                            and all(torch.equal(self.engine.weights[n], p) for n, p in actor.items()))


def test_the_engine_generates_with_the_weights_of_the_last_update(tiny_dir, train_file, tmp_path):
    # The weight push must follow the update: an engine one step behind would pass every other test.
    module, data, trainer, _ = make_run(tiny_dir, train_file, tmp_path, algorithm="grpo", max_steps=3)
    engine = CopyingEngine()
    module.source = ScriptedSource(module, engine=engine)
    check = EngineMatchesActor(engine)
    trainer.callbacks.append(check)
    module.configure_model()
    before = _snapshot(module)
    trainer.fit(module, datamodule=data)
    assert check.matches == [True, True, True]
    assert all(not torch.equal(before[n], p) for n, p in module.named_parameters())  # every step really updated


def test_checkpoint_resume_continues_step_data_and_optimizer(tiny_dir, train_file, tmp_path):
    module, data, trainer, source = make_run(tiny_dir, train_file, tmp_path, algorithm="ppo", kl_coef=0.05)
    trainer.fit(module, datamodule=data)
    ckpt = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert not any(k.startswith("ref_model.") for k in ckpt["state_dict"])
    assert ckpt["zerotir"]["rl_steps_done"] == 2 and ckpt["global_step"] == 2
    assert ckpt["PromptDataModule"]["consumed"] == 2
    # Straight run of 3 steps vs. 2 + resume 1: same prompts in step 3, same step counters.
    straight, sdata, strainer, ssource = make_run(tiny_dir, train_file, tmp_path / "s", max_steps=3,
                                                   algorithm="ppo", kl_coef=0.05)
    strainer.fit(straight, datamodule=sdata)
    resumed, rdata, rtrainer, rsource = make_run(tiny_dir, train_file, tmp_path / "r", max_steps=3,
                                                  algorithm="ppo", kl_coef=0.05)
    rtrainer.fit(resumed, datamodule=rdata, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert rsource.seen == [ssource.seen[2]] and source.seen == ssource.seen[:2]
    assert resumed.rl_steps_done == 3 and rtrainer.global_step == 3
    opt_state = rtrainer.optimizers[0].state_dict()["state"]
    assert all(int(s["step"]) == 3 for s in opt_state.values())
    for name, p in straight.named_parameters():
        assert torch.allclose(p, dict(resumed.named_parameters())[name], atol=1e-6), name


def test_train_mode_keeps_reference_frozen(tiny_dir):
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(kl_coef=0.1))
    module.configure_model()
    module.train()
    assert module.actor.training and not module.ref_model.training
    assert not any(p.requires_grad for p in module.ref_model.parameters())


def test_no_reference_without_kl_and_no_critic_without_ppo(tiny_dir):
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(algorithm="grpo", kl_coef=0.0))
    module.configure_model()
    assert module.ref_model is None and module.critic is None


def test_bad_arguments_name_the_field(tiny_dir):
    with pytest.raises(FileNotFoundError, match="model.base.path='./nope'"):
        ZeroTIRModule(BaseModelConfig("./nope"))
    with pytest.raises(ValueError, match="model.tool.sandbox.urls is set but model.tool.max_tool_calls=0"):
        ZeroTIRModule(BaseModelConfig(str(tiny_dir)), tool=ToolConfig(max_tool_calls=0,
                                                                       sandbox=SandboxConfig(urls=["http://x"])))


def test_rollout_schedule_reaches_the_tool_loop(tiny_dir):
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)))
    assert module.source.schedule.kind == "trajectory"  # the default engine and schedule


def test_test_loads_only_the_actor_and_reads_a_ppo_checkpoint(tiny_dir, train_file, tmp_path):
    module, data, trainer, _ = make_run(tiny_dir, train_file, tmp_path, algorithm="ppo", kl_coef=0.05)
    trainer.fit(module, datamodule=data)
    evaluated, edata, etrainer, source = make_run(tiny_dir, train_file, tmp_path / "eval", algorithm="ppo",
                                                   kl_coef=0.05, eval_n=2)
    edata.test_files = [str(train_file)]
    etrainer.test(evaluated, datamodule=edata, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert evaluated.critic is None and evaluated.ref_model is None and evaluated.rl_steps_done == 2
    for name, p in evaluated.actor.named_parameters():
        assert torch.equal(p, dict(module.actor.named_parameters())[name]), name
    report = json.loads((tmp_path / "eval" / "eval" / "test_train.json").read_text())
    metrics = report["benchmarks"]["train"]
    assert metrics["num_problems"] == 6 and metrics["samples_per_problem"] == 2 and metrics["accuracy"] == 0.5
    assert (tmp_path / "eval" / "eval" / "test_summary.md").is_file() and len(source.seen) == 1


def test_a_failing_step_stops_the_rollout_source(tiny_dir, train_file, tmp_path):
    module, data, trainer, source = make_run(tiny_dir, train_file, tmp_path, algorithm="grpo")
    source.failure = "engine crashed"
    module.reward = reward = CountedReward()
    with pytest.raises(RuntimeError, match="engine crashed"):
        trainer.fit(module, datamodule=data)
    assert source.closed  # its tools (the sandbox, MCP servers) do not outlive a failed run: the source closes them
    assert (reward.starts, reward.closes) == (1, 1)  # nor the reward's client (Lightning calls no teardown here)
    module.teardown("fit")
    assert reward.closes == 1  # closed once whatever the exit path


class CountedReward(MathReward):
    """The default reward, counting its ``start`` and ``close`` calls."""

    starts = closes = 0

    def start(self) -> None:
        self.starts += 1

    def close(self) -> None:
        self.closes += 1


# ----- DeepSpeed and tensor-parallel plumbing, with stand-ins for Lightning's trainer and strategy -----
class DeepSpeedStrategy:  # matched by class name, like Lightning's
    def __init__(self, config: dict):
        self.config = config
        self.zero_stage_3 = config["zero_optimization"]["stage"] == 3


class FakeTrainer:
    def __init__(self, strategy=None, world_size=1, global_rank=0, fn="fit"):
        from lightning.pytorch.trainer.states import TrainerFn

        self.strategy = strategy or object()
        self.world_size, self.global_rank = world_size, global_rank
        self.state = type("State", (), {"fn": TrainerFn(fn)})()
        self.callbacks, self.datamodule = [], None
        self.model = type("Engine", (), {"get_global_grad_norm": lambda self: 2.5})()


class RecordingOptimizer:
    def __init__(self):
        self.calls = []

    def step(self):
        self.calls.append("step")

    def zero_grad(self, set_to_none=True):
        self.calls.append("zero_grad")

    def _on_before_step(self):
        self.calls.append("count")

    def _on_after_step(self):
        self.calls.append("counted")


def _ds_config(name: str) -> dict:
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[1] / "configs" / "deepspeed" / name).read_text())


def test_deepspeed_skipped_update_counts_the_step_without_stepping_the_engine(tiny_dir):
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)))
    opt, sched_steps = RecordingOptimizer(), []
    module.optimizers = lambda: opt
    module.lr_schedulers = lambda: type("S", (), {"step": lambda self: sched_steps.append(1)})()
    module._trainer = FakeTrainer(DeepSpeedStrategy(_ds_config("zero2.json")))
    assert module._optimizer_step(False) == 0.0 and opt.calls == ["count", "counted"]
    assert module._optimizer_step(True) == 2.5 and opt.calls[2:] == ["step", "zero_grad"]
    assert len(sched_steps) == 2  # the schedule follows the RL step either way


@pytest.mark.timeout(300)  # a step count that does not advance would never reach max_steps
def test_skip_path_keeps_lightnings_global_step_in_a_real_run(tiny_dir, train_file, tmp_path, monkeypatch):
    import zerotir.module

    module, data, trainer, _ = make_run(tiny_dir, train_file, tmp_path, all_wrong=True, algorithm="grpo")
    monkeypatch.setattr(zerotir.module, "is_deepspeed", lambda trainer: True)  # take the DeepSpeed branch on CPU
    monkeypatch.setattr(zerotir.module, "check_fit_setup", lambda *args: None)
    monkeypatch.setattr(trainer.strategy, "config", {}, raising=False)
    stepped = []
    monkeypatch.setattr(trainer.strategy, "optimizer_step", lambda *a, **k: stepped.append(1))
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 2 and module.rl_steps_done == 2 and stepped == []


def test_setup_checks_the_deepspeed_config_only_for_fit(tiny_dir):
    from zerotir.parallel.deepspeed_setup import DeepSpeedConfigError

    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), optim=OptimConfig(max_grad_norm=0.5))
    module._trainer = FakeTrainer(DeepSpeedStrategy(_ds_config("zero3.json")))
    with pytest.raises(DeepSpeedConfigError, match=r"gradient_clipping=1.0 but model.optim.max_grad_norm=0.5"):
        module.setup("fit")
    module.setup("test")  # evaluation takes no optimizer step
    module._trainer = FakeTrainer()
    module.setup("fit")  # no DeepSpeed: nothing to check


@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_setup_refuses_the_transformers_engine_under_multi_rank_zero3(tiny_dir, stage):
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rollout=HFRollout())
    module._trainer = FakeTrainer(DeepSpeedStrategy(_ds_config("zero3.json")), world_size=2)
    with pytest.raises(ValueError, match=r"would deadlock. Fix: set model.rollout.class_path: zerotir.config.VLLM"):
        module.setup(stage)
    module._trainer = FakeTrainer(DeepSpeedStrategy(_ds_config("zero2.json")), world_size=2)
    module.setup(stage)  # ZeRO-2 keeps whole parameters on every rank: nothing is gathered while decoding


def test_zero3_loading_sees_transformers_zero3_switch(tiny_dir, monkeypatch):
    pytest.importorskip("accelerate", reason="transformers' HfDeepSpeedConfig needs accelerate")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import gc

    from transformers.integrations import is_deepspeed_zero3_enabled

    from zerotir import models

    seen = []

    # a real load needs a process group
    def fake_load(path, dtype="float32", gradient_checkpointing=False, attn_implementation=None):
        seen.append(is_deepspeed_zero3_enabled())
        return torch.nn.Linear(2, 2)

    monkeypatch.setattr(models, "load_causal_lm", fake_load)
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(kl_coef=0.1))
    module._trainer = FakeTrainer(DeepSpeedStrategy(_ds_config("zero3.json")))
    module.configure_model()
    assert seen == [True, True]  # actor and reference
    module.teardown("fit")
    gc.collect()
    assert not is_deepspeed_zero3_enabled()


def test_tensor_parallel_ranks_roll_out_their_engines_prompts_and_train_on_their_share(tiny_dir, monkeypatch):
    import zerotir.module
    import zerotir.rollout.source

    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), sampling=SamplingConfig(n=2),
                           rollout=VLLMRollout(tensor_parallel_size=2))
    source = module.source = ScriptedSource(module)
    source.tp_group = SharedEngineGroup(rank=3, size=2)  # engine 1 = ranks 2 and 3
    module.log = lambda *args, **kwargs: None
    trained = []

    def fake_step(cfg, traj, decision, *args, **kwargs):
        trained.append(traj)
        return zerotir.module.StepResult(1, traj, torch.ones(len(traj), dtype=torch.bool), decision, {})

    monkeypatch.setattr(zerotir.module, "rl_step", fake_step)
    module._trainer = FakeTrainer(world_size=4, global_rank=3)  # engine 1 = ranks 2 and 3
    monkeypatch.setattr(zerotir.rollout.source, "rank_and_world_size", lambda: (3, 4))
    tok = build_byte_tokenizer()
    batch = [{"id": f"q{i}", "prompt_text": f"{i}+{i}", "prompt_ids": tok.encode(f"{i}+{i}"), "answer": str(2 * i),
              "source": "s", "batch_index": 0, "position": i} for i in range(4)]
    source.start(None, tok, "cpu", FixedStream(lambda b: [batch, batch + batch[:2]][b], 4))
    out = module.training_step(0)["step"]  # the source reads the step's batch from the stream
    assert source.seen == [["q2", "q3"]]  # the engine's prompts
    assert trained[0].group_ids.tolist() == [1, 1] and len(out.rollout) == 2  # rank 3: the 2nd group
    # The callbacks' outputs: the rollout and, per group id of it, its prompt (the engine's share of the batch).
    assert out.batch.problem_ids == ["q2", "q3"]
    assert out.batch.prompts == ["2+2", "3+3"] and out.batch.weight_version == 0
    with pytest.raises(ValueError, match=r"data.prompts_per_step=6.*multiple of devices x num_nodes = 4"):
        module.training_step(1)


class SharedEngineGroup(TensorParallelGroup):
    """Rank ``rank`` of a tensor-parallel group of ``size`` ranks, without a process group: this rank runs the tool
    loop itself (the leader's part) and trains on its share of the group's trajectories."""

    def __init__(self, rank: int, size: int):
        super().__init__(1)
        self.rank, self.size, self.leader = rank, size, rank - rank % size

    @property
    def shared(self) -> bool:
        return True

    def rollout(self, engine, run):
        return run(engine)


def test_the_module_trains_an_asynchronous_run_corrected_unless_the_config_says_none(tiny_dir):
    from zerotir.config import HostsConfig

    s1 = HostsConfig(max_staleness=1)
    assert ZeroTIRModule(BaseModelConfig(str(tiny_dir)), hosts=s1).rl.off_policy_correction == "tis"
    uncorrected = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), hosts=s1, rl=RLConfig(off_policy_correction="none"))
    assert uncorrected.rl.off_policy_correction == "none"
    in_line = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), hosts=HostsConfig(max_staleness=0))
    assert in_line.rl.off_policy_correction == "none"
    assert ZeroTIRModule(BaseModelConfig(str(tiny_dir))).rl.off_policy_correction == "none"


def test_every_place_a_push_may_happen_releases_zero3s_prefetch_first(tiny_dir, train_file, tmp_path, monkeypatch):
    """A push gathers every parameter outside a forward, and under ZeRO-3 parameters the prefetch left
    in flight cannot be partitioned again; a fleet pushes inside ``training_step`` too (its first batch, a recovered
    engine), so ``release_for_push`` runs before each batch the source is asked for and before each push after the
    update (it does nothing without ZeRO-3: recorded here on CPU)."""
    import zerotir.module

    module, data, trainer, source = make_run(tiny_dir, train_file, tmp_path)
    events = []
    monkeypatch.setattr(zerotir.module, "release_for_push", lambda trainer: events.append("release"))
    for name in ("batch", "after_update"):
        real = getattr(source, name)
        monkeypatch.setattr(source, name, lambda *a, _real=real, _name=name: (events.append(_name), _real(*a))[1])
    trainer.fit(module, datamodule=data)
    assert events == ["release", "batch", "release", "after_update"] * 2


@pytest.mark.parametrize("in_flight", [0, 8])
def test_the_source_reads_whole_batches_only_when_the_fleet_streams(tiny_dir, tmp_path, in_flight, monkeypatch):
    """The module hands its source the datamodule as the training stream; the source reads it as its steps take it:
    whole batches (each step's marker) only when the fleet streams (``max_in_flight`` > 0), else without the rows a
    record of single prompts consumed; in batch shares the fleet generates the batches ahead (a batch all consumed
    later in the record is refused)."""
    from types import SimpleNamespace

    from zerotir.config import HostsConfig

    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), hosts=HostsConfig(max_staleness=1, engines=1,
                                                                                   max_in_flight=in_flight))
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{k} + 1?", "answer": str(k + 1)}) + "\n" for k in range(6)))
    data = PromptDataModule(train_files=[str(path)], test_files=[], prompts_per_step=3)
    data.set_tokenizer(build_byte_tokenizer())
    data.mark_rows([(0, 1)])
    monkeypatch.setattr(module, "_trainer", SimpleNamespace(datamodule=data), raising=False)
    streams = []
    monkeypatch.setattr(module.source, "start", lambda *args: streams.append(args[-1]))
    module._start_source()
    assert streams == [data]
    steps_take = module.source.steps_take
    assert [row["position"] for row in next(data.train_batches(steps_take))] == ([0, 2] if not in_flight else [0, 1, 2])
    data.mark_rows([(1, p) for p in range(3)])
    if in_flight:
        assert len(next(data.train_batches(steps_take))) == 3
    else:
        with pytest.raises(ValueError, match="cannot leave one out"):
            next(data.train_batches(steps_take))
