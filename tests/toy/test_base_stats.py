"""Tests of the base-model measurement: the rates are computed from the trajectories as documented."""

import contextlib

import pytest
import torch

from zerotir.data.prompts import render_prompt, tokenize_prompts
from zerotir.toy import base_stats
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.types import Trajectories


def _trajectories(texts, calls, errors, truncated, truths):
    b = len(texts)
    zeros = torch.zeros(b, 4)
    return Trajectories(
        input_ids=zeros.long(), attention_mask=zeros.long(), action_mask=zeros.bool(), logprobs=zeros,
        prompt_lens=torch.full((b,), 2), response_lens=torch.tensor([10, 20, 30, 40, 50]),
        group_ids=torch.arange(b), rewards=torch.zeros(b), num_calls=torch.tensor(calls),
        num_exec_errors=torch.tensor(errors), num_timeouts=torch.zeros(b, dtype=torch.long),
        num_sandbox_errors=torch.zeros(b, dtype=torch.long), truncated=torch.tensor(truncated),
        finish_reasons=["stop"] * b, response_texts=texts, ground_truths=truths,
    )


def test_rates_hand_worked(monkeypatch, tmp_path):
    build_tiny_model(build_byte_tokenizer(), save_dir=tmp_path, hidden_size=16, num_layers=1, num_heads=2)
    # 5 answers: code + right, code + wrong (its one call errored), code + right with 2 calls, no code + right,
    # no code + right but truncated (scores 0).
    traj = _trajectories(
        ["x \\boxed{7}", "x \\boxed{8}", "x \\boxed{7}", "\\boxed{7}", "\\boxed{7}"],
        calls=[1, 1, 2, 0, 0], errors=[0, 1, 0, 0, 0], truncated=[False, False, False, False, True],
        truths=["7"] * 5,
    )
    seen = {}

    def fake_rollout(engine, tok, client, prompts, params, tool, truths, schedule):
        seen.update(prompts=prompts, params=params, tool=tool, truths=truths, schedule=schedule)
        return traj, {}

    monkeypatch.setattr(base_stats, "rollout_sync", fake_rollout)
    monkeypatch.setattr(base_stats, "_sandbox_client", lambda urls: contextlib.nullcontext(object()))
    stats = base_stats.measure_base(tmp_path, n=5, heldout_n=16, max_response_tokens=64)
    assert stats["code_rate"] == 0.6  # 3 of 5 ran code
    assert stats["accuracy"] == 0.6  # answers 1, 3, 4
    assert stats["code_run_accuracy"] == round(2 / 3, 4)
    assert stats["accuracy_no_code"] == 0.5  # the truncated one scores 0
    assert stats["exec_error_rate"] == 0.25  # 1 error in 4 executions
    assert stats["truncation_rate"] == 0.2 and stats["mean_response_tokens"] == 30.0
    # The prompts are the toy template's, tokenized as the data module tokenizes them.
    held = base_stats.heldout_set(16)[:5]
    assert seen["truths"] == [q.answer for q in held]
    assert seen["params"].temperature == 1.0 and seen["params"].max_new_tokens == 64
    expected = tokenize_prompts("toy", [render_prompt("toy", q.problem) for q in held], build_byte_tokenizer())
    assert seen["prompts"] == expected


@pytest.mark.timeout(60)  # the failure this guards against is a hang
def test_more_answers_than_the_engines_default_batch_all_finish(monkeypatch, tmp_path):
    """In the lockstep schedule a row that has stopped keeps its batch slot until every row has stopped: with more
    answers than ``HFRollout.max_batch_size`` (64) slots the queued ones once waited for a slot for ever."""
    build_tiny_model(build_byte_tokenizer(), save_dir=tmp_path, hidden_size=16, num_layers=1, num_heads=2)
    monkeypatch.setattr(base_stats, "_sandbox_client", lambda urls: contextlib.nullcontext(object()))
    questions = base_stats.heldout_set(80)[:70]  # 2 tokens per answer: no code block, the sandbox is never asked
    stats = base_stats.measure_questions(tmp_path, questions, max_response_tokens=2)
    assert stats["n_answers"] == 70 and stats["truncation_rate"] == 1.0
