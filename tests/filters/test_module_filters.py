"""``model.filters`` in a real training step of the module (a scripted rollout, as tests/test_module.py runs it):
the pass-rate decision first, then the rules; what they removed reaches the update, the metrics and the step."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest

from callbacks import PassRateFilter, ScalingMetrics
from tests.scripted_source import Recorder, ScriptedSource, recorded
from zerotir.config import BaseModelConfig, FilterConfig, OptimConfig, RLConfig, SamplingConfig, ToolConfig
from zerotir.data.datamodule import PromptDataModule
from zerotir.module import ZeroTIRModule


def test_the_module_composes_the_pass_rate_filter_and_the_rules(tiny_dir, train_file, tmp_path):
    # The scripted rollout: 2 prompts x 2 samples, 8 response tokens each, sample 0 right and sample 1 wrong. The
    # the pass-rate rule keeps both groups (mean 0.5); with a budget of 8 tokens every wrong sample is at the budget,
    # so overlong_wrong removes it: the step trains on the two right samples. Were the pass rate taken after the
    # rules, each group would read 1 of 1 right and be dropped as all-right: nothing would train.
    pl.seed_everything(0)
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(algorithm="reinforce_pp", micro_batch_size=2),
                           optim=OptimConfig(lr=1e-2), sampling=SamplingConfig(n=2, max_response_tokens=8),
                           filters=FilterConfig(pass_rate=True, pass_rate_low=0.2, pass_rate_high=0.8,
                                                overlong_wrong=True), seed=3)
    module.source = ScriptedSource(module)
    data = PromptDataModule(train_files=[str(train_file)], template="plain", tokenizer=str(tiny_dir),
                            prompts_per_step=2, test_files=[])
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         callbacks=[PassRateFilter(), ScalingMetrics(), Recorder()])
    trainer.fit(module, datamodule=data)
    result = recorded(trainer)[0]
    assert result.rollout.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert result.filter.removed["pass_rate"].tolist() == [False] * 4
    assert result.filter.removed["overlong_wrong"].tolist() == [False, True, False, True]
    assert result.kept.tolist() == [True, False, True, False] and not result.skipped
    metrics = trainer.callback_metrics
    assert float(metrics["filter/overlong_wrong_fraction"]) == 0.5 and float(metrics["filter/pass_rate_fraction"]) == 0


def test_a_rule_that_cannot_apply_stops_the_module_at_its_construction(tiny_dir):
    with pytest.raises(ValueError, match=r"model.filters.perplexity=true with model.rl.kl_coef=0"):
        ZeroTIRModule(BaseModelConfig(str(tiny_dir)), filters=FilterConfig(perplexity=True))
    with pytest.raises(ValueError, match=r"model.filters.void_turn=true with model.tool.max_tool_calls=0"):
        ZeroTIRModule(BaseModelConfig(str(tiny_dir)), tool=ToolConfig(max_tool_calls=0),
                      filters=FilterConfig(void_turn=True))
