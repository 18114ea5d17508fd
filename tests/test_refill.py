"""Dynamic sampling with refill in real module steps (Lightning's loop, the data stream, checkpoints), with a scripted
rollout whose rewards depend on the prompt: a step fills its batch from rounds of the stream, stops at the round
bound, resumes with nothing lost or repeated, and through the thread host too; a run whose steps train nothing
warns and stops, also across a resume."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from callbacks import PassRateFilter, ScalingMetrics
from tests.rollout.scripted import ScriptedEngine
from tests.scripted_source import Recorder, ScriptedSource, recorded
from zerotir import metric_names as mn
from zerotir.config import (
    BaseModelConfig, FilterConfig, HFRollout, HostsConfig, OptimConfig, RefillConfig, RLConfig,
    SamplingConfig, SandboxConfig, ToolConfig,
)
from zerotir.data.datamodule import PromptDataModule
from zerotir.data.stream import PromptStream
from zerotir.module import ZeroTIRModule
from zerotir.fleet.source import FleetSource
from zerotir.rl.guards import EmptyStepsError
from zerotir.rollout.engines import create_engine
from zerotir.rewards import Reward, Score
from zerotir.sources import make_rollout_source

ROWS = 12  # prompts q0..q11; data.prompts_per_step = 2, so batches 0..5 are the first epoch
SEED = 3  # the module's (rollout) seed


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"{i} + {i}", "answer": str(2 * i)}) + "\n"
                            for i in range(ROWS)))
    return path


def stream_ids(batch_index: int) -> list[str]:
    """The ids of batch ``batch_index`` of the training stream (the datamodule's seed 0)."""
    rows = [{"id": f"q{i}", "prompt_ids": []} for i in range(ROWS)]
    return [r["id"] for r in PromptStream(rows, 2, seed=0).batch(batch_index)]


class GradedSource(ScriptedSource):
    """The scripted rollout, with each prompt either informative (its 2 samples: one right, one wrong) or not (both
    wrong); records every round's prompt ids and seed."""

    def __init__(self, module: ZeroTIRModule, informative: set[str]):
        super().__init__(module)
        self.informative = informative
        self.seeds: list[int] = []

    def roll_out(self, rows, params):
        self.seeds.append(params.seed)
        traj, timings = super().roll_out(rows, params)
        for group, row in enumerate(rows):
            if row["id"] not in self.informative:
                traj.rewards[traj.group_ids == group] = 0.0
        return traj, timings


def make_run(tiny_dir, train_file, root, informative: set[str], refill: RefillConfig, max_steps: int, **trainer):
    pl.seed_everything(0)
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(algorithm="grpo", micro_batch_size=2),
                           optim=OptimConfig(lr=1e-2), sampling=SamplingConfig(n=2, max_response_tokens=16),
                           filters=FilterConfig(pass_rate=True, pass_rate_low=0.2, pass_rate_high=0.8, refill=refill),
                           seed=SEED)
    source = module.source = GradedSource(module, informative)
    data = PromptDataModule(train_files=[str(train_file)], template="plain", tokenizer=str(tiny_dir), prompts_per_step=2,
                            test_files=[])
    ckpt = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=1, save_last=True, save_top_k=-1)
    callbacks = [PassRateFilter(), ScalingMetrics(), ckpt, Recorder()]
    run = pl.Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=root, callbacks=callbacks, **trainer)
    return module, data, run, source


def half_informative() -> set[str]:
    """The first prompt of every batch of the first epoch: each round keeps one group of its two."""
    return {stream_ids(b)[0] for b in range(ROWS // 2)}


def test_half_uninformative_groups_fill_the_batch_in_two_rounds(tiny_dir, train_file, tmp_path):
    module, data, trainer, source = make_run(tiny_dir, train_file, tmp_path, half_informative(),
                                             RefillConfig(max_rounds=3), max_steps=2)
    trainer.fit(module, datamodule=data)
    results = recorded(trainer)
    assert [r.refill["generation_rounds"] for r in results] == [2.0, 2.0]
    assert [r.refill["prompts_consumed"] for r in results] == [4.0, 4.0]  # two rounds of data.prompts_per_step
    assert [r.refill["exhausted_steps"] for r in results] == [0.0, 0.0]
    for k, r in enumerate(results):  # step k+1 took batches 2k and 2k+1; it trains on 2 groups x 2 samples
        assert r.batch.problem_ids == stream_ids(2 * k) + stream_ids(2 * k + 1)
        assert len(r.rollout) == 8 and int(r.kept.sum()) == 2 * 2 and r.stats
        assert r.rollout.group_ids[r.kept].unique().tolist() == [0, 2]  # the first of each round, renumbered
        assert (r.filter.kept_groups, r.filter.groups) == (2, 4)
    assert source.seen == [stream_ids(b) for b in range(4)] and data.consumed == 4
    assert source.seeds == [SEED + b + 1 for b in range(4)]  # each round seeded by its batch index
    metrics = ScalingMetrics().step_metrics(results[0])
    assert metrics[mn.GENERATION_ROUNDS] == 2.0 and metrics[mn.PROMPTS_CONSUMED] == 4.0
    assert metrics[mn.EMPTY_STEPS_IN_A_ROW] == 0.0


def test_rounds_running_out_train_what_they_kept_then_empty_steps_stop_the_run(tiny_dir, train_file, tmp_path, caplog):
    # Only batch 0's first prompt is informative. Step 1: batches 0, 1 keep one group of the two a batch holds: the
    # rounds (2) run out and the step trains on that one. Steps 2 and 3 keep nothing (batches 2-5): no update, and
    # the second empty step in a row stops the run (max_empty_steps=2).
    module, data, trainer, source = make_run(tiny_dir, train_file, tmp_path, {stream_ids(0)[0]},
                                             RefillConfig(max_rounds=2, max_empty_steps=2), max_steps=5)
    with caplog.at_level(logging.WARNING, logger="zerotir.rl.refill"):
        with pytest.raises(EmptyStepsError,
                           match=r"RL step 3: 2 consecutive steps without an update \(model.filters.refill"
                                                  r".max_empty_steps=2\).*of the 4 prompt groups of the last one "
                                                  r"\(2 generation rounds\)"):
            trainer.fit(module, datamodule=data)
    first, second = recorded(trainer)
    assert first.refill == {"generation_rounds": 2.0, "prompts_consumed": 4.0, "empty_steps_in_a_row": 0.0,
                            "exhausted_steps": 1.0}
    assert first.stats and int(first.kept.sum()) == 2 and first.filter.kept_groups == 1  # a smaller batch, trained
    assert second.skipped and second.refill["empty_steps_in_a_row"] == 1.0 and second.refill["exhausted_steps"] == 2
    assert source.seen == [stream_ids(b) for b in range(6)]  # the bound: 2 rounds a step, 3 steps
    assert data.consumed == 4  # steps 1 and 2 finished; step 3 stopped the run
    assert ("RL step 1: 2 generation rounds (model.filters.refill.max_rounds=2) kept 1 of the 2 prompt groups"
            in caplog.text)
    assert "RL step 2: the filters kept no trajectory of the 4 prompt groups (2 generation rounds): no update, 1 " \
           "consecutive steps without one" in caplog.text


def test_resume_mid_run_trains_exactly_the_rounds_not_yet_consumed(tiny_dir, train_file, tmp_path):
    refill = RefillConfig(max_rounds=3)
    straight, sdata, strainer, ssource = make_run(tiny_dir, train_file, tmp_path / "s", half_informative(), refill, 3)
    strainer.fit(straight, datamodule=sdata)
    first, fdata, ftrainer, fsource = make_run(tiny_dir, train_file, tmp_path / "a", half_informative(), refill, 2)
    ftrainer.fit(first, datamodule=fdata)
    ckpt = torch.load(tmp_path / "a" / "ckpt" / "last.ckpt", weights_only=False)
    assert ckpt["PromptDataModule"]["consumed"] == 4 and ckpt["zerotir"]["rl_steps_done"] == 2
    resumed, rdata, rtrainer, rsource = make_run(tiny_dir, train_file, tmp_path / "r", half_informative(), refill, 3)
    rtrainer.fit(resumed, datamodule=rdata, ckpt_path=str(tmp_path / "a" / "ckpt" / "last.ckpt"))
    assert fsource.seen + rsource.seen == ssource.seen == [stream_ids(b) for b in range(6)]  # none lost, none twice
    assert rsource.seeds == ssource.seeds[4:]
    trained = [r.batch.problem_ids for r in recorded(strainer)]
    assert [r.batch.problem_ids for r in recorded(ftrainer) + recorded(rtrainer)] == trained
    assert rdata.consumed == 6 and resumed.rl_steps_done == 3
    filters = [next(cb for cb in t.callbacks if isinstance(cb, PassRateFilter)) for t in (strainer, rtrainer)]
    assert filters[0].state_dict() == filters[1].state_dict()  # the pass-rate filter's counts survived the resume
    for name, p in straight.named_parameters():
        assert torch.allclose(p, dict(resumed.named_parameters())[name], atol=1e-6), name


def test_all_filtered_steps_warn_and_the_count_survives_resume(tiny_dir, train_file, tmp_path, caplog):
    # Without refill and nothing informative: every step is empty. Two steps, a checkpoint, then a resumed run stops
    # at its first step (the third empty one in a row): the count came back with the checkpoint.
    refill = RefillConfig(max_empty_steps=3)
    module, data, trainer, _ = make_run(tiny_dir, train_file, tmp_path / "a", set(), refill, max_steps=2)
    with caplog.at_level(logging.WARNING, logger="zerotir.rl.refill"):
        trainer.fit(module, datamodule=data)
    warnings = [m for m in caplog.messages if "no update" in m]
    assert len(warnings) == 2 and "2 consecutive steps without one" in warnings[1]
    assert "of the 2 prompt groups (1 generation round)" in warnings[1]
    assert [r.refill["empty_steps_in_a_row"] for r in recorded(trainer)] == [1.0, 2.0]
    assert all("exhausted_steps" not in r.refill for r in recorded(trainer))  # no refill: nothing to run out
    resumed, rdata, rtrainer, rsource = make_run(tiny_dir, train_file, tmp_path / "r", set(), refill, max_steps=10)
    with pytest.raises(EmptyStepsError, match=r"RL step 3: 3 consecutive steps without an update"):
        rtrainer.fit(resumed, datamodule=rdata, ckpt_path=str(tmp_path / "a" / "ckpt" / "last.ckpt"))
    assert rsource.seen == [stream_ids(2)]


def test_bad_refill_settings_name_the_field():
    # refill without the pass-rate rule: tests/filters/test_pass_rate.py
    with pytest.raises(ValueError, match=r"model.filters.refill.max_rounds=0: must be >= 1 \(1: no refill\)"):
        RefillConfig(max_rounds=0)
    with pytest.raises(ValueError, match=r"model.filters.refill.max_empty_steps=0: must be >= 1"):
        RefillConfig(max_empty_steps=0)


class PushableEngine(ScriptedEngine):
    """The scripted engine as the thread host's: weight pushes land on it and change nothing it writes."""

    def load_weights_from(self, actor) -> None:
        pass


@dataclass(frozen=True)
class ScriptedRollout(HFRollout):
    """A ``model.rollout`` group whose engine is ``engine``, the scripted one, in place of a built one."""

    engine: Any = None


@create_engine.register
def _scripted_engine(backend: ScriptedRollout, *args: Any, **kwargs: Any) -> PushableEngine:
    return backend.engine


def scripted_pipeline(module: ZeroTIRModule, engine: PushableEngine) -> FleetSource:
    """The pipeline's source (one engine host in a thread, S = 1) with the scripted engine (no sandbox: no tools);
    its schedule, capacity rule, version checks and batch checks are the real ones."""
    hosts = HostsConfig(max_staleness=1, timeout_s=20.0)  # a stuck host fails fast
    return make_rollout_source(hosts, ScriptedRollout(engine=engine), SandboxConfig(),
                               ToolConfig(max_tool_calls=0), module.sampling, _BoxedReward(), module.model_path, SEED)


class _BoxedReward(Reward):
    """Right when the reference's box is in the response (no math-verify pool to start)."""

    async def score(self, samples):
        return [Score(float(right), right) for right in (f"\\boxed{{{s.answer}}}" in s.response for s in samples)]


def test_the_pipeline_fills_a_step_from_the_thread_hosts_next_batches(tiny_dir, train_file, tmp_path):
    # As the in-line test: every batch has one informative prompt of two, so every step takes two batches, now
    # generated ahead by the thread host (S = 1); a refill batch is the stream's next one, checked against the loader's.
    module, data, trainer, _ = make_run(tiny_dir, train_file, tmp_path, set(), RefillConfig(max_rounds=3), max_steps=2)
    data.set_tokenizer(module.tokenizer)
    data.setup("fit")
    scripts = {}
    for row in data.train_rows:  # informative: sample 0 right, sample 1 wrong; otherwise both wrong
        right, wrong = [f"\\boxed{{{row['answer']}}}"], ["\\boxed{x}"]
        scripts[module.tokenizer.decode(row["prompt_ids"])] = [right, wrong] if row["id"] in half_informative() \
            else [wrong]
    engine = PushableEngine(module.tokenizer, scripts, n=2, tokens_per_step=4)
    module.source = scripted_pipeline(module, engine)
    trainer.fit(module, datamodule=data)
    results = recorded(trainer)
    assert [r.refill["generation_rounds"] for r in results] == [2.0, 2.0]
    for k, r in enumerate(results):
        assert r.batch.problem_ids == stream_ids(2 * k) + stream_ids(2 * k + 1)
        assert int(r.kept.sum()) == 2 * 2 and r.stats and r.pipeline["staleness_max"] <= 1
    assert data.consumed == 4
