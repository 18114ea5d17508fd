"""The tool loop on HFEngine with real tiny models (built in the test, never downloaded).

1. A random-init model with stop strings taken from its own greedy output, so that it really makes tool calls:
   shapes, masks, log-probs recomputed by a plain forward, and determinism of greedy decoding.
2. A model trained for a few seconds to memorise two tool-using documents, against the real sandbox server: it
   writes code, the code runs, the real output is injected and the model answers; a division by zero comes back as
   the traceback the model sees.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from sandbox import SandboxClient, format_for_model, local_sandbox
from tests.rollout.memorised import memorise
from tests.rollout.scripted import ScriptedSandbox, ok
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import SamplingParams, generate
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=160)
BUDGETED = SamplingParams(temperature=0.0, max_new_tokens=120)  # the greedy tool configs' response budget
DOCS = {
    "Q: 12*34?\n": "```python\nprint(12*34)\n```\n```output\n408\n```\nA: \\boxed{408}",
    "Q: 1/0?\n": "```python\nprint(1/0)\n```\n```output\nError\n```\nA: undefined",
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def random_model():
    return build_tiny_model(TOK, hidden_size=32, num_layers=2, seed=0).eval()


def greedy_tool_config(model, prompt: list[int]) -> ToolConfig:
    """Fences made of the model's own greedy output: single-byte windows, so the loop stops on them for sure."""
    ref = generate(HFEngine(model, TOK), [prompt], SamplingParams(temperature=0.0, max_new_tokens=60))[0][0].token_ids
    single_byte = [3 <= t < 131 for t in ref]
    i = next(i for i in range(len(ref) - 1) if single_byte[i] and single_byte[i + 1])
    j = next(j for j in range(i + 2, len(ref)) if single_byte[j])  # the first such character after the opening
    return ToolConfig(code_start=TOK.decode(ref[i : i + 2]), code_end=TOK.decode(ref[j : j + 1]), max_tool_calls=3,
                      output_template="<o>{output}</o>")


KINDS = ["trajectory", "rounds"]


@torch.inference_mode()
def recomputed_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 from one plain forward over the whole sequence."""
    logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


@pytest.mark.parametrize("kind", KINDS)
def test_random_model_makes_tool_calls_with_exact_masks_and_logprobs(random_model, kind):
    prompts = [TOK.encode("Hello"), TOK.encode("What is 2+3?")]
    tool = greedy_tool_config(random_model, prompts[0])
    sandbox = ScriptedSandbox(default=ok("7"))
    traj, _ = rollout_sync(HFEngine(random_model, TOK), TOK, sandbox, prompts, SamplingParams(n=2, temperature=0.0,
                           max_new_tokens=120), tool, schedule=Schedule(kind))
    assert traj.input_ids.shape[0] == 4 and traj.group_ids.tolist() == [0, 0, 1, 1]
    assert traj.num_calls[0] >= 1 and len(sandbox.codes) == int(traj.num_calls.sum())
    injected = TOK.encode("<o>7</o>", add_special_tokens=False)
    for b in range(4):
        p, n = int(traj.prompt_lens[b]), int(traj.response_lens[b])
        assert n <= 120 and traj.attention_mask[b].sum() == p + n
        ids = traj.input_ids[b, : p + n].tolist()
        action = traj.action_mask[b]
        assert not action[:p].any() and not action[p + n :].any()
        # The unmasked response tokens are exactly the injected blocks, whole except a cut at the budget.
        env = [t for t, a in zip(ids[p:], action[p : p + n].tolist()) if not a]
        calls = int(traj.num_calls[b])
        assert env == (injected * calls)[: len(env)] and len(env) > len(injected) * (calls - 1)
        # Each sampled token's log-prob is the model's under plain full-sequence recompute (greedy: raw logits).
        want = recomputed_logprobs(random_model, ids)[p - 1 :]
        got = traj.logprobs[b, p : p + n]
        mask = action[p : p + n]
        assert torch.allclose(got[mask], want[mask], atol=1e-4) and not got[~mask].any()


def test_greedy_tool_loop_is_deterministic(random_model):
    prompts = [TOK.encode("Hello"), TOK.encode("x")]
    # Strict lockstep: the rows batched together do not depend on when code results come back, so even float
    # rounding (which can depend on the batch) is the same from run to run.
    tool = greedy_tool_config(random_model, prompts[0])

    def once():
        return rollout_sync(HFEngine(random_model, TOK), TOK, ScriptedSandbox(default=ok("7")), prompts, BUDGETED,
                            tool, schedule=Schedule("lockstep"))[0]

    a, b = once(), once()  # lockstep: the same batches each time
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.action_mask, b.action_mask)
    assert a.num_calls.sum() >= 1


@pytest.mark.parametrize("baseline", [Schedule("rounds"), Schedule("rounds", 5), Schedule("lockstep")],
                         ids=["rounds32", "rounds5", "lockstep"])
def test_per_trajectory_gives_the_trajectories_of_the_synchronous_schedules(random_model, baseline):
    """Greedy decoding: every trajectory on its own (leaving at a code block, rejoining with the output, its keys /
    values in place) produces exactly the trajectories of rounds and of lockstep, with the same tool calls."""
    prompts = [TOK.encode("Hello"), TOK.encode("What is 2+3?"), TOK.encode("x")]
    tool = greedy_tool_config(random_model, prompts[0])

    def once(schedule: Schedule):
        sandbox = ScriptedSandbox(default=ok("7"))
        traj, _ = rollout_sync(HFEngine(random_model, TOK), TOK, sandbox, prompts, BUDGETED, tool, schedule=schedule)
        return traj, sorted(sandbox.codes)

    (base, codes_b), (own, codes_o) = once(baseline), once(Schedule())
    assert codes_b == codes_o and len(codes_o) >= 1
    for name in ("input_ids", "action_mask", "num_calls", "response_lens"):
        assert torch.equal(getattr(base, name), getattr(own, name)), name
    assert torch.allclose(base.logprobs, own.logprobs, atol=1e-4)


@pytest.mark.timeout(60)  # the failure this guards against is a hang
@pytest.mark.parametrize("schedule", [Schedule(), Schedule("rounds", 5), Schedule("lockstep")],
                         ids=["trajectory", "rounds5", "lockstep"])
def test_more_trajectories_than_the_engines_batch_give_the_trajectories_of_one_batch(random_model, schedule):
    """6 trajectories on 2 rows of the engine: the rounds keep a stopped trajectory until the round ends, so the
    queued ones start only in the slots of stopped ones (they once waited for a slot for ever); greedy decoding gives
    what one batch of all 6 gives."""
    prompts = [TOK.encode("Hello"), TOK.encode("What is 2+3?"), TOK.encode("x")]
    tool = greedy_tool_config(random_model, prompts[0])
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=120)

    def once(rows: int):
        traj, _ = rollout_sync(HFEngine(random_model, TOK, max_batch_size=rows), TOK,
                               ScriptedSandbox(default=ok("7")), prompts, params, tool, schedule=schedule)
        return traj

    small, whole = once(2), once(6)
    assert whole.num_calls.sum() >= 1
    for name in ("input_ids", "action_mask", "num_calls", "response_lens"):
        assert torch.equal(getattr(small, name), getattr(whole, name)), name
    assert torch.allclose(small.logprobs, whole.logprobs, atol=1e-4)


@pytest.fixture(scope="module")
def trained_model():
    """A tiny Llama that has memorised ``DOCS`` (about 100 full-batch steps, a few seconds)."""
    return memorise(TOK, [q + a for q, a in DOCS.items()])


@pytest.fixture(scope="module")
def sandbox_urls():
    with local_sandbox(workers=1) as urls:
        yield urls


@pytest.mark.parametrize("kind", KINDS)
def test_trained_model_calls_the_real_sandbox_and_answers(trained_model, sandbox_urls, kind):
    client = SandboxClient(sandbox_urls)
    prompts = [TOK.encode(q) for q in DOCS]
    traj, timings = rollout_sync(HFEngine(trained_model, TOK), TOK, client, prompts, GREEDY,
                                 ToolConfig(max_output_chars=1024), ["408", "undefined"], Schedule(kind))
    # Row 0 follows its document: the real output "408" is what it memorised, so it answers.
    assert traj.response_texts[0] == DOCS["Q: 12*34?\n"]
    assert traj.num_calls[0] == 1 and traj.num_exec_errors[0] == 0 and traj.finish_reasons[0] == "stop"
    assert traj.input_ids[0, int(traj.prompt_lens[0] + traj.response_lens[0]) - 1] == TOK.eos_token_id
    # Row 1's code raises: the model sees the sandbox's own formatting of the traceback.
    error = asyncio.run(client.run("\nprint(1/0)\n"))
    shown = ToolConfig().output_template.format(output=format_for_model(error, 1024))
    assert "ZeroDivisionError: division by zero" in shown
    assert traj.response_texts[1].startswith("```python\nprint(1/0)\n```" + shown)
    assert traj.num_exec_errors.tolist() == [0, 1] and traj.num_sandbox_errors.tolist() == [0, 0]
    assert timings["sandbox"] > 0 and timings["generation"] > 0
    # The injected output carries action 0; the code the model wrote carries action 1.
    p = int(traj.prompt_lens[1])
    code_len = len(TOK.encode("```python\nprint(1/0)\n```"))
    shown_len = len(TOK.encode(shown, add_special_tokens=False))
    assert traj.action_mask[1, p : p + code_len].all()
    assert not traj.action_mask[1, p + code_len : p + code_len + shown_len].any()
