"""What a reward sees (``zerotir.rollout.scoring.Sample``): the prompt row (question, answer, the rest as metadata),
the response with its injected tool outputs, whether it was cut, and its tool trace; the same through the one
scoring path whether a trajectory is scored as it finishes (``EarlyScores``, the in-line source) or after the batch
(``score_trajectories``, the other sources)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox, ok
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.rewards.protocol import Reward, Score
from zerotir.rollout.scoring import EarlyScores, score_trajectories
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()
PROMPTS = ("Q: 6*7?\n", "Q: 1+1?\n")
SCRIPTS = {PROMPTS[0]: [["Let me check.\n```python\nprint(6*7)\n```", "\\boxed{42}"]],
           PROMPTS[1]: [["It is \\boxed{2} since one and one make two, said at a length that runs past the budget"]]}
ROWS = [{"id": "q0", "problem": "6*7?", "answer": "42", "source": "toy", "kind": "arith",
         "prompt_ids": TOK.encode(PROMPTS[0], add_special_tokens=False)},
        {"id": "q1", "problem": "1+1?", "answer": "2", "source": "toy", "kind": "easy",
         "prompt_ids": TOK.encode(PROMPTS[1], add_special_tokens=False)}]


@dataclass(frozen=True, eq=False)
class Recording(Reward):
    """Keeps every sample it is asked to score; a sample is right when its response ends in its boxed answer."""

    seen: list = field(default_factory=list)

    async def score(self, samples):
        self.seen.extend(samples)
        return [Score(float(s.response.endswith(f"{{{s.answer}}}")), s.response.endswith(f"{{{s.answer}}}"))
                for s in samples]


@pytest.mark.parametrize("early", [True, False], ids=["as-each-finishes", "after-the-batch"])
def test_a_reward_sees_the_prompt_row_the_response_and_its_tool_trace(early):
    reward = Recording()
    scores = EarlyScores(reward, ROWS, TOK) if early else None
    traj, _ = rollout_sync(ScriptedEngine(TOK, SCRIPTS), TOK, ScriptedSandbox({"\nprint(6*7)\n": ok("42\n")}),
                           [r["prompt_ids"] for r in ROWS], SamplingParams(temperature=0.0, max_new_tokens=72),
                           ToolConfig(), None, on_end=scores.finished if early else None)
    score_trajectories(reward, traj, ROWS, scores)
    seen = {s.question: s for s in reward.seen}
    assert sorted(seen) == ["1+1?", "6*7?"] and len(reward.seen) == 2  # each trajectory scored once
    tool, cut = seen["6*7?"], seen["1+1?"]
    assert tool.answer == "42" and tool.metadata == {"id": "q0", "source": "toy", "kind": "arith"}  # no prompt ids
    assert tool.response == "Let me check.\n```python\nprint(6*7)\n```\n```output\n42\n```\n\\boxed{42}"
    assert [(c.tool, c.code, c.status, c.output) for c in tool.tool_calls] == [("python", "\nprint(6*7)\n", "ok",
                                                                                "42")]
    assert not tool.truncated and cut.truncated and cut.tool_calls == ()  # the second hit max_new_tokens
    assert cut.metadata["id"] == "q1" and cut.answer == "2"
    assert traj.rewards.tolist() == [1.0, 0.0] and traj.corrects.tolist() == [True, False]
