"""A response cut at the token budget scores 0 even when it holds the right ``\\boxed{}``, on every path that scores:
the tool loop of the in-line source (training and evaluation batches), and the trainer-side scoring of the engine
hosts' rollouts (the fleet's and the pipeline's thread host). Each path runs the run's reward (``MathReward``) on
the byte tokenizer with a scripted engine: prompt "A:" answers ``\\boxed{1}`` and stops within the budget, prompt
"B:" writes ``\\boxed{1}`` and goes on past it, so it is cut there holding the right answer."""

from __future__ import annotations

import torch

from tests.callbacks.helpers import make_batch
from tests.rollout.scripted import InlineEngine
from tests.scripted_source import FixedStream
from zerotir.config import HFRollout, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.rewards import MathReward
from zerotir.rollout.scoring import score_trajectories
from zerotir.rollout import source as source_module
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.source import InlineSource
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()
NO_TOOLS = ToolConfig(max_tool_calls=0)
BUDGET = 16  # "\boxed{1}" is 9 tokens (one per byte), + EOS: "A:" ends within it; "B:" is cut after 16 tokens
SCRIPTS = {"A:": [["\\boxed{1}"]], "B:": [["\\boxed{1} and then some more words"]]}
ROWS = [{"id": p, "problem": p, "answer": "1", "prompt_text": p, "prompt_ids": TOK.encode(p, add_special_tokens=False),
         "source": "s", "batch_index": 0, "position": i} for i, p in enumerate(SCRIPTS)]
PARAMS = SamplingParams(n=1, temperature=0.0, max_new_tokens=BUDGET, seed=0)


def assert_cut_scores_zero(traj) -> None:
    assert traj.truncated.tolist() == [False, True]
    assert traj.response_texts[1].startswith("\\boxed{1}")  # the right answer is in the cut response
    assert traj.rewards.tolist() == [1.0, 0.0]


def test_the_in_line_source_scores_a_cut_response_zero_in_training_and_evaluation(monkeypatch):
    monkeypatch.setattr(source_module, "create_engine", lambda *args, **kwargs: InlineEngine(TOK, SCRIPTS))
    source = InlineSource(HFRollout(), SandboxConfig(), NO_TOOLS, SamplingConfig(n=1, max_response_tokens=BUDGET),
                          MathReward(), "unused", seed=0)
    source.start(torch.nn.Linear(1, 1), TOK, "cpu", FixedStream(lambda b: ROWS, len(ROWS)))
    try:
        assert_cut_scores_zero(source.batch(1).trajectories)
        assert_cut_scores_zero(source.evaluate(ROWS, PARAMS).trajectories)
    finally:
        source.close()


def test_the_engine_hosts_rollouts_score_a_cut_response_zero_on_the_trainer():
    # The engines return trajectories unscored; the trainer scores them with their truncation flags.
    traj = make_batch([0.0, 0.0], [0, 1], truncated=[False, True],
                      texts=["\\boxed{1}", "\\boxed{1} and then some"])
    score_trajectories(MathReward(), traj, ROWS)
    assert_cut_scores_zero(traj)
