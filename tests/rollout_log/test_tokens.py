"""Per-token records: the sampled rows of a real RL step written token by token with the engine's and the trainer's
log-probs, advantages, loss weights, versions and span kinds; the sample's size and its stability; span labels."""

from __future__ import annotations

import pytest
import torch

from callbacks import RolloutDumper
from tests.callbacks.helpers import FakeModule
from tests.callbacks.test_rollout_dumper import trainer
from tests.rl.test_step import SAMPLING, Recording, tiny_actor
from tests.rollout_log.test_records import batch
from zerotir.config import FilterConfig, RLConfig
from zerotir.filters.pass_rate import pass_rate
from zerotir.rl.update import sequence_logprobs
from zerotir.rl.step import BatchInfo, Models, StepResult, rl_step
from zerotir.rollout_log import records as R
from zerotir.rollout_log import tokens as T

INFO = BatchInfo(["Q: 3 + 4 = ?", "Q: 1 + 1 = ?"], ["a", "b"], ["toy", "toy"], 0)


def dump(tmp_path, result, **kwargs):
    tr, module = trainer(tmp_path), FakeModule()
    dumper = RolloutDumper(tensorboard_samples=False, **kwargs)
    dumper.setup(tr, module, "fit")
    dumper.on_train_batch_end(tr, module, {"step": result}, None, 0)
    dumper.on_fit_end(tr, module)
    return R.read_step(tmp_path / "rollouts", result.rl_step)


def trained_step():
    """Rows 0, 1 (group 0) train; group 1 (row 2) is dropped by the pass rate. Versions 5 on the action tokens."""
    rollout = batch()
    rollout.versions = torch.where(rollout.action_mask, 5, -1)
    decision = pass_rate(FilterConfig(pass_rate=True), rollout)
    actor = tiny_actor()
    result = rl_step(RLConfig(micro_batch_size=4), rollout, decision, Models(actor), Recording(actor).callables,
                     step=1, seed=0, **SAMPLING)
    result.batch = INFO
    return result


def test_a_sampled_row_carries_each_token_with_what_trained_it(tmp_path):
    result = trained_step()
    rows = dump(tmp_path, result, token_samples=None)
    traj = result.rollout
    action = traj.action_mask[0].tolist()  # 2 prompt tokens, 3 sampled, 1 injected
    first = rows[0]["tokens"]
    assert first["ids"] == traj.input_ids[0].tolist()
    assert first["pieces"] == [FakeModule().tokenizer.decode([i]) for i in first["ids"]]
    assert first["span"][:2] == ["prompt", "prompt"] and first["span"][5] == "output"
    assert first["loss_weight"] == [0, 0, 1, 1, 1, 0]
    assert first["engine_logprob"] == [None, None, -0.5, -0.5, -0.5, None]
    # the actor before its update (tiny_actor is seeded): what the trainer scored the tokens at
    old = sequence_logprobs(tiny_actor(), traj.input_ids, traj.attention_mask, temperature=1.0)[0][0].tolist()
    adv = result.trained.advantages[0].tolist()
    assert first["trainer_logprob"] == pytest.approx([round(v, 4) if a else None for v, a in zip(old, action)],
                                                     abs=2e-4)
    assert first["advantage"] == [round(v, 4) if a else None for v, a in zip(adv, action)]
    assert first["advantage"][2] > 0  # the right answer of its group
    assert first["weight_version"] == [None, None, 5, 5, 5, None]
    entropy = result.trained.entropy[0].tolist()
    assert first["entropy"] == [round(v, 4) if a else None for v, a in zip(entropy, action)]
    vocab = tiny_actor().config.vocab_size
    assert all(0 < e <= torch.log(torch.tensor(float(vocab))).item() + 1e-3 for e in first["entropy"][2:5])
    assert rows[0]["advantage"] == pytest.approx(sum(first["advantage"][2:5]) / 3, abs=1e-3)
    assert rows[1]["advantage"] < 0
    dropped = rows[2]["tokens"]  # the pass rate removed it: nothing trained it
    assert dropped["loss_weight"] == [0] * 6 and dropped["trainer_logprob"] is None and dropped["advantage"] is None
    assert dropped["entropy"] is None
    assert dropped["engine_logprob"][2] == -0.5 and rows[2]["advantage"] is None


def test_only_the_sampled_share_carries_tokens_the_same_rows_for_the_same_step(tmp_path):
    result = trained_step()
    one = dump(tmp_path / "a", result, token_samples=1)
    again = dump(tmp_path / "b", result, token_samples=1)
    with_tokens = [r["index"] for r in one if "tokens" in r]
    assert len(with_tokens) == 1 and with_tokens == [r["index"] for r in again if "tokens" in r]
    assert all("tokens" not in r for r in dump(tmp_path / "c", result, token_samples=0))
    assert all(r["advantage"] is not None for r in one[:2])  # every trained row has its advantage, sampled or not
    with pytest.raises(ValueError, match="token_samples must be None"):
        RolloutDumper(token_samples=-1)


def test_an_evaluation_writes_every_trajectory_with_its_tokens(tmp_path):
    rollout = batch()
    tr, module = trainer(tmp_path), FakeModule()
    dumper = RolloutDumper(tensorboard_samples=False)
    dumper.setup(tr, module, "validate")
    kept = torch.ones(len(rollout), dtype=torch.bool)
    dumper.on_validation_epoch_start(tr, module)
    dumper.on_validation_batch_end(tr, module, {"step": StepResult(2, rollout, kept, None, {}, {}, INFO)}, None, 0)
    dumper.on_validation_epoch_end(tr, module)
    dumper.on_fit_end(tr, module)
    rows = R.read_step(tmp_path / "rollouts", 2, "val")
    assert all(r["tokens"]["loss_weight"] == [0] * 6 for r in rows)  # an evaluation trains nothing
    assert all(r["tokens"]["engine_logprob"][2] == -0.5 and r["tokens"]["trainer_logprob"] is None for r in rows)


def test_spans_label_prompt_text_call_output_and_answer():
    pieces = ["Q", "?", "Let", " me", "```python\n", "print(2)", "\n```\n", "```output\n2\n```\n", "So ", "\\boxed{",
              "2", "}"]
    action = [False, False, True, True, True, True, True, False, True, True, True, True]
    assert T.spans(pieces, 2, action) == ["prompt", "prompt", "text", "text", "call", "call", "call", "output",
                                          "text", "answer", "answer", "answer"]
    hermes = ["<tool_call>", '{"name": "f"}', "</tool_call>", "\n<tool_response>\nx\n</tool_response>\n", "done"]
    assert T.spans(hermes, 0, [True, True, True, False, True]) == ["call", "call", "call", "output", "text"]


def test_pick_rows_is_a_seeded_sample_in_row_order():
    assert T.pick_rows(3, None, 1) == [0, 1, 2] and T.pick_rows(3, 8, 1) == [0, 1, 2]
    picked = T.pick_rows(100, 4, 7)
    assert picked == sorted(picked) and len(set(picked)) == 4 and picked == T.pick_rows(100, 4, 7)
    assert picked != T.pick_rows(100, 4, 8)


def test_the_terminal_colours_each_sampled_token_by_the_overlay(tmp_path):
    from rich.console import Console

    from zerotir.rollout_log.cli import show
    from zerotir.rollout_log.render import overlay_strength, rich_tokens

    rows = dump(tmp_path, trained_step(), token_samples=None)
    tokens = rows[0]["tokens"]
    assert overlay_strength(tokens, 0, "logprob") is None  # a prompt token has no log-prob
    assert overlay_strength(tokens, 2, "logprob") == pytest.approx(min(-tokens["trainer_logprob"][2] / 5, 1))
    assert [overlay_strength(tokens, i, "weight") for i in range(6)] == [0, 0, 1, 1, 1, 0]
    text = rich_tokens(rows[0], "weight")
    styles = [str(span.style) for span in text.spans]
    assert styles[0].startswith("dim on rgb(") and styles[2] != styles[0]  # trained tokens darker than the prompt
    with pytest.raises(ValueError, match="overlay 'loss'"):
        overlay_strength(tokens, 2, "loss")
    console = Console(record=True, width=100, color_system="truecolor")
    show(tmp_path / "rollouts", 1, limit=1, console=console, color="mismatch")
    assert "tokens, coloured by mismatch" in console.export_text()
    assert "on #" in console.export_html(inline_styles=True) or "background-color" in console.export_html(
        inline_styles=True)
