"""``format: fences`` with the ``python`` tool gives exactly the trajectories of the loop before the tool plug-ins
(commit 96d949d, where the loop called ``sandbox.run`` itself), every field, on a fixed model and seed.

``golden_fences.json`` was written by ``record()`` below on that commit: greedy decoding of a random-init tiny Llama
(seed 0) with fences its output hits, a sandbox whose answer depends on the code (ok, a long output cut at
the token cap, an error, a timeout), per trajectory. The transformers engine is compared here; the vLLM one in
``test_agent_loop_vllm.py`` (on its engines). Ids, masks, counters and texts must be equal; log-probs within 1e-4
(float rounding may differ on another CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sandbox import ExecResult, ExecStatus
from tests.tiny_models import vllm_sized_model
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.rewards import MathReward
from zerotir.rollout.scoring import score_trajectories
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.types import Trajectories

TOK = build_byte_tokenizer()
GOLDEN = Path(__file__).with_name("golden_fences.json")
PROMPTS = ["Hello", "What is 2+3?", "x", "Solve: 12*34"]
PARAMS = SamplingParams(n=2, temperature=0.0, max_new_tokens=160, seed=7)
MAX_LEN = 512

pytestmark = pytest.mark.usefixtures("one_thread")


class CodeDependentSandbox:
    """Answers by the code's length: ok, a long output (cut by the caps), an error, a timeout."""

    async def run(self, code: str, *, run_timeout: float | None = None) -> ExecResult:
        kind = len(code) % 4
        if kind == 0:
            return ExecResult(ExecStatus.OK, "7\n", "", 0.01, 0)
        if kind == 1:
            return ExecResult(ExecStatus.OK, "".join(f"line {i}\n" for i in range(90)), "", 0.01, 0)
        if kind == 2:
            return ExecResult(ExecStatus.ERROR, "", 'Traceback (most recent call last):\n  File "<s>", line 1\n'
                              "ZeroDivisionError: division by zero\n", 0.01, 1)
        return ExecResult(ExecStatus.TIMEOUT, "", "", run_timeout or 5.0, None)


def tool_config() -> ToolConfig:
    """Fences of two tokens the model's greedy loops hit (found by trying): calls ending ok, cut, error, timeout."""
    return ToolConfig(code_start=TOK.decode([69]), code_end=TOK.decode([159]), max_tool_calls=3,
                      output_template="<o>{output}</o>", max_output_tokens=64)


def tiny_model(save_dir: Path | None = None):
    return vllm_sized_model(TOK, MAX_LEN, save_dir=save_dir).eval()


ANSWERS = ["7", "5", "", "408"]


def run_fences(engine, tool: ToolConfig) -> Trajectories:
    """The tool loop, then the one scoring path (``score_trajectories`` with the math reward: before the reward
    plug-ins the loop scored each trajectory itself, so the golden rewards are the math reward's)."""
    prompts = [TOK.encode(p) for p in PROMPTS]
    traj = rollout_sync(engine, TOK, CodeDependentSandbox(), prompts, PARAMS, tool, ANSWERS)[0]
    rows = [{"problem": p, "answer": a} for p, a in zip(PROMPTS, ANSWERS)]
    score_trajectories(MathReward(), traj, rows)
    return traj


def as_json(traj: Trajectories) -> dict:
    """Every field of ``traj`` as plain values (tensors as lists, tool calls as their three fields)."""
    out = {}
    for name, value in vars(traj).items():
        if isinstance(value, torch.Tensor):
            out[name] = value.tolist()
        elif name == "tool_calls":
            out[name] = [[[c.code, c.status, c.output] for c in row] for row in value]
        else:
            out[name] = value
    return out


def assert_matches_golden(traj: Trajectories, engine_name: str) -> None:
    want, got = json.loads(GOLDEN.read_text())[engine_name], as_json(traj)
    # ``corrects`` came with the reward plug-ins (the reward's own verdict): the math reward's is rewards > 0
    assert got.pop("corrects") == [r > 0 for r in want["rewards"]]
    # ``reward_failed`` came with the infrastructure rule (the math reward never fails for infrastructure reasons)
    assert got.pop("reward_failed") == [False] * len(want["rewards"])
    assert sorted(got) == sorted(want), "the fields of Trajectories changed"
    assert sum(want["num_calls"]) >= 4 and len({c[1] for row in want["tool_calls"] for c in row}) >= 3
    for name in want:
        if name == "logprobs":
            assert torch.allclose(torch.tensor(got[name]), torch.tensor(want[name]), atol=1e-4), name
        else:
            assert got[name] == want[name], name


def record(engines: dict) -> None:
    """Write ``golden_fences.json`` from ``{name: engine}`` (run once, on the commit named in the module doc)."""
    GOLDEN.write_text(json.dumps({name: as_json(run_fences(e, tool_config())) for name, e in engines.items()}) + "\n")


def test_fences_with_the_python_tool_give_the_golden_trajectories_on_transformers():
    engine = HFEngine(tiny_model(), TOK)
    traj = run_fences(engine, tool_config())
    assert_matches_golden(traj, "hf")
