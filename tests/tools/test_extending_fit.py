"""The worked example tool of docs/extending.md trains: its file and its config entry, as written there, in a fit of
the module (Lightning's loop, the in-line source's tool loop, the reward, the filters, the update) for two RL steps;
the doc's example rollout mode (a rollout source) generates the batches of that fit. The doc's example call format
trains too, registered by its config entry alone: its prompt, its parser and the filters read its markers.

The model's sampling is scripted (``tests.rollout.scripted.ScriptedEngine``: a tiny random model would never write
the call); everything after it is the run's own: the call parsed in the doc's format, checked against the tool's
schema and run by the tool, its observation injected and masked, the answers scored, the update made, and the tool's
calls counted in the logged per-tool metrics.
"""

from __future__ import annotations

import csv
import json
import re

import lightning.pytorch as pl
import yaml
from lightning.pytorch.loggers import CSVLogger

from callbacks import PassRateFilter, ScalingMetrics
from tests.rollout.scripted import InlineEngine, ScriptedSandbox
from tests.scripted_source import Recorder, recorded
from tests.tools.test_extending_doc import block
from zerotir import metric_names as mn
from zerotir.cli.app import prompt_tools
from zerotir.config import (BaseModelConfig, FilterConfig, HFRollout, OptimConfig, RLConfig, SamplingConfig,
                            SandboxConfig, ToolConfig)
from zerotir.data.datamodule import PromptDataModule
from zerotir.data.prompts import PLAIN_TEMPLATE
from zerotir.module import ZeroTIRModule
from zerotir.rewards import MathReward
from zerotir.rollout.source import InlineSource
from zerotir.tools import Toolbox

PROBLEM = "Days from 2024-01-01 to 2024-03-01?"
CALL = '<tool_call>{"name": "days_between", "arguments": {"start": "2024-01-01", "end": "2024-03-01"}}</tool_call>'
RIGHT, WRONG = [CALL, "So \\boxed{60}."], ["Let me count. " + CALL, "So \\boxed{59}."]  # two samples a prompt


class ScriptedStart:
    """A start for an in-line source of the run (its real ``roll_out``: the tool loop over ``model.tool``, the
    reward) with a scripted engine; the ``python`` entry of the doc's config gets a sandbox that is never called."""

    def start(self, actor, tokenizer, device, stream) -> None:
        self.stream, self._tokenizer = stream, tokenizer
        self.toolbox = Toolbox.build(self.tool, ScriptedSandbox())  # an unexpected python call fails the test
        self.toolbox.start()
        self.engine = InlineEngine(tokenizer, {PLAIN_TEMPLATE.format(problem=PROBLEM): [RIGHT, WRONG]}, n=2)


def test_the_example_tool_and_rollout_mode_train_in_a_fit_and_are_logged(tiny_dir, tmp_path, monkeypatch):
    (tmp_path / "my_tools").mkdir()
    (tmp_path / "my_tools" / "days.py").write_text(block("tool") + "\n")
    (tmp_path / "my_sources.py").write_text(block("source") + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_sources import CountingSource

    class ScriptedCounting(ScriptedStart, CountingSource):  # the doc's mode (make_rollout_source's branch stood in for)
        pass

    tool = ToolConfig(**yaml.safe_load(block("config"))["model"]["tool"])  # the doc's one config entry
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"id": f"q{i}", "problem": PROBLEM, "answer": "60"}) + "\n" for i in range(4)))
    pl.seed_everything(0)
    sampling = SamplingConfig(n=2, max_response_tokens=256)
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(micro_batch_size=2), optim=OptimConfig(lr=1e-2),
                           tool=tool, sampling=sampling, seed=3)
    module.source = ScriptedCounting(HFRollout(), SandboxConfig(), tool, sampling, MathReward(), "unused", 3)
    data = PromptDataModule(train_files=[str(train)], template="plain", tokenizer=str(tiny_dir), prompts_per_step=2,
                            test_files=[])
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=CSVLogger(tmp_path, name="logs"),
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=tmp_path, callbacks=[PassRateFilter(), ScalingMetrics(histogram=False),
                                                               Recorder()])
    trainer.fit(module, datamodule=data)

    assert module.rl_steps_done == 2
    results = recorded(trainer)
    calls = [c for r in results for row in r.rollout.tool_calls for c in row]
    assert [(c.tool, c.status, c.output) for c in calls] == [("days_between", "ok", "60")] * 8  # 2 steps x 2 x 2
    assert all(r.rollout.correct.tolist() == [True, False] * 2 for r in results)  # the reward read the answers
    assert all(r.stats["grad_norm"] > 0 for r in results)  # each step updated the policy on its kept groups
    rows = list(csv.DictReader((tmp_path / "logs" / "version_0" / "metrics.csv").open()))
    logged = [float(row[mn.tool_tag("days_between", "calls")]) for row in rows if row[mn.tool_tag("days_between",
                                                                                                  "calls")]]
    assert logged == [4.0, 4.0]  # each step: 2 prompts x 2 samples, one call each
    assert {float(row[mn.tool_tag("days_between", "errors")]) for row in rows
            if row[mn.tool_tag("days_between", "errors")]} == {0.0}
    assert not any(k.startswith("tools/python/") for k in rows[0])  # the python entry was never called
    assert [(float(row["pipeline/tool_calls"]), float(row["pipeline/invalid_calls"])) for row in rows
            if row.get("pipeline/tool_calls")] == [(4.0, 0.0), (4.0, 0.0)]  # the doc's rollout mode counted them


ARITHMETIC = "What is 2*3?"
TAGGED_RIGHT = ["Let me compute <calc>2*3</calc>", "\nSo \\boxed{6}."]
TAGGED_OPEN = ["Let me check <calc>2*3</calc>", "\nSo \\boxed{5}. Or <calc>2*3"]  # the last call never closed
TAGGED_WRONG = ["Let me try <calc>2*2</calc>", "\nSo \\boxed{4}."]


def test_the_example_format_registered_by_its_config_entry_trains_and_every_reader_takes_its_markers(
        tiny_dir, tmp_path, monkeypatch):
    (tmp_path / "my_formats.py").write_text(block("format") + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tool = ToolConfig(**yaml.safe_load(block("format-config"))["model"]["tool"])  # the doc's one config entry
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"id": f"q{i}", "problem": ARITHMETIC, "answer": "6"}) + "\n"
                             for i in range(4)))
    # The data module as the command line links it from model.tool (zerotir.cli.app: data.tools, data.tool_format).
    data = PromptDataModule(train_files=[str(train)], template="orz_tool", tokenizer=str(tiny_dir),
                            tools=prompt_tools(tool.format, tool.tools), tool_format=tool.format, prompts_per_step=2,
                            test_files=[])
    data.setup("fit")
    prompt = data.train_rows[0]["prompt_text"]
    assert "write <calc>expression</calc>; its value is shown to you right after it as <result>value</result>" in prompt
    assert "```" not in prompt  # nothing of the fences' sentences: the prompt asks for the format's own markers

    class ScriptedInline(ScriptedStart, InlineSource):
        def start(self, actor, tokenizer, device, stream) -> None:
            super().start(actor, tokenizer, device, stream)
            self.engine = InlineEngine(tokenizer, {prompt: [TAGGED_RIGHT, TAGGED_OPEN, TAGGED_WRONG]}, n=3,
                                    injected=re.compile(r"<result>.*?</result>", re.S))

    pl.seed_everything(0)
    sampling = SamplingConfig(n=3, max_response_tokens=256)
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(micro_batch_size=2), optim=OptimConfig(lr=1e-2),
                           tool=tool, sampling=sampling, filters=FilterConfig(code_mismatch=True), seed=3)
    module.source = ScriptedInline(HFRollout(), SandboxConfig(), tool, sampling, MathReward(), "unused", 3)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         callbacks=[PassRateFilter(), Recorder()])
    trainer.fit(module, datamodule=data)

    assert module.rl_steps_done == 2
    results = recorded(trainer)
    for r in results:  # the parser: each closed <calc> ran on the calculator, its result in the format's block
        assert [[(c.tool, c.status, c.output) for c in row] for row in r.rollout.tool_calls] == \
            [[("calculator", "ok", "6")], [("calculator", "ok", "6")], [("calculator", "ok", "4")]] * 2
        assert r.rollout.response_texts[0] == "Let me compute <calc>2*3</calc><result>6</result>\nSo \\boxed{6}."
        assert r.rollout.correct.tolist() == [True, False, False] * 2
        # The filters: the wrong answer's unclosed <calc> leaves 2 blocks opened, 1 closed and 1 output, removed as a
        # mismatch (under the fences' markers neither response holds a block, and nothing would be removed).
        assert r.filter.removed["code_mismatch"].tolist() == [False, True, False] * 2
        assert r.kept.tolist() == [True, False, True] * 2 and r.stats["grad_norm"] > 0  # it trained on the rest
