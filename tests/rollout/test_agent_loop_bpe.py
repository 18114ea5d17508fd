"""The tool loop with a byte-level BPE whose merges cross the fences: the token that closes a code block can also
hold the opening of the output block (``)\\n```\\n```output\\n``). The sampled ids stay exactly as sampled, the code
is extracted right, and the injected block continues the text so the model reads one clean output block."""

from __future__ import annotations

from collections.abc import Hashable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tests.rollout.scripted import ScriptedSandbox, fake_logprob, ok
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import Sample, SamplingParams

PROMPT = "Q: 2+3?\n"
TURN1 = "Let me compute.\n```python\nprint(2+3)\n```\n```output\n"  # the model starts the output block itself
TURN2 = "The answer is \\boxed{5}."
CODE = "\nprint(2+3)\n"
CLEAN = "Let me compute.\n```python\nprint(2+3)\n```\n```output\n5\n```\nThe answer is \\boxed{5}."


def fence_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained, without pre-splitting, on tool transcripts: merges cross newlines and fences."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [f"Q: {a}+{b}?\nLet me compute.\n```python\nprint({a}+{b})\n```\n```output\n{a + b}\n```\n"
              for a in range(10) for b in range(10)] * 5
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


class TurnEngine:
    """Emits each turn's BPE ids one token per call step, ending right after the token that completes a stop (the
    whole token is kept, as vLLM and HFEngine do); a resubmission after an injected block starts the next turn."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tok, self.turns = tokenizer, [tokenizer.encode(t, add_special_tokens=False) for t in turns]
        self.turn, self.cursor, self.context = 0, 0, 0
        self.emitted: list[list[int]] = []
        self._done: list[tuple[Hashable, Sample]] = []

    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        if self.context and len(ids) > self.context:  # the loop injected a block: the model's next turn
            self.turn, self.cursor = self.turn + 1, 0
        todo, out = self.turns[self.turn] if self.turn < len(self.turns) else [], []
        reason, stop = "eos", None
        while self.cursor < len(todo):
            out.append(todo[self.cursor])
            self.cursor += 1
            stop = next((s for s in params.stop if s in self.tok.decode(out)), None)
            if stop is not None:
                reason = "stop"
                break
        if reason == "eos":
            out.append(self.tok.eos_token_id)
        self.context = len(ids) + len(out)
        self.emitted.append(out)
        self._done.append((key, Sample(out, [fake_logprob(t, i) for i, t in enumerate(out)], reason, stop)))

    def step(self) -> list[tuple[Hashable, Sample]]:
        done, self._done = self._done, []
        return done

    def release(self, key: Hashable) -> None:
        pass

    @property
    def num_running(self) -> int:
        return len(self._done)

    context_length = 1 << 20


def test_a_closing_fence_merged_with_the_output_opening_injects_only_the_rest_of_the_block():
    tok = fence_bpe()
    engine = TurnEngine(tok, [TURN1, TURN2])
    sandbox = ScriptedSandbox({CODE: ok("5\n")})
    traj, _ = rollout_sync(engine, tok, sandbox, [tok.encode(PROMPT, add_special_tokens=False)],
                           SamplingParams(temperature=0.0, max_new_tokens=256), ToolConfig(max_tool_calls=4),
                           None, Schedule("lockstep"))
    closing = tok.decode(engine.emitted[1][-1:])  # the token that completed the closing fence
    assert "```" in closing and closing.endswith("```output\n"), closing  # the BPE merged across the fence
    assert sandbox.codes == [CODE]
    start, length = int(traj.prompt_lens[0]), int(traj.response_lens[0])
    response = traj.input_ids[0, start:start + length].tolist()
    action = traj.action_mask[0, start:start + length].tolist()
    assert [t for t, a in zip(response, action) if a] == [t for seg in engine.emitted for t in seg]  # token-out
    assert tok.decode(response, skip_special_tokens=True) == CLEAN  # one output block, no doubled fence


H_TURN1 = ('Let me compute.\n<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>\n'
           "<tool_response>\n")
H_CLEAN = ('Let me compute.\n<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>\n'
           "<tool_response>\n5\n</tool_response>\nThe answer is \\boxed{5}.")


def hermes_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on hermes transcripts: merges cross the call and response markers."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [f'Q: {a}+{b}?\nLet me compute.\n<tool_call>{{"name": "calculator", "arguments": {{"expression": '
              f'"{a}+{b}"}}}}</tool_call>\n<tool_response>\n{a + b}\n</tool_response>\n'
              for a in range(10) for b in range(10)] * 5
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=500, special_tokens=["<pad>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def test_hermes_markers_merged_into_one_token_keep_the_call_and_inject_only_the_rest():
    tok = hermes_bpe()
    engine = TurnEngine(tok, [H_TURN1, TURN2])
    tool = ToolConfig(format="hermes", tools=[{"class_path": "calculator"}])
    traj, _ = rollout_sync(engine, tok, None, [tok.encode(PROMPT, add_special_tokens=False)],
                           SamplingParams(temperature=0.0, max_new_tokens=256), tool, None, Schedule("lockstep"))
    opening, closing = tok.decode(engine.emitted[0][-1:]), tok.decode(engine.emitted[1][-1:])
    assert opening.index("<tool_call>") > 0 and not opening.endswith("<tool_call>"), opening  # text on both sides
    assert closing.endswith("</tool_call>\n<tool_response>\n"), closing  # the BPE merged across the markers
    assert [(c.tool, c.status, c.output) for c in traj.tool_calls[0]] == [("calculator", "ok", "5")]
    start, length = int(traj.prompt_lens[0]), int(traj.response_lens[0])
    response = traj.input_ids[0, start:start + length].tolist()
    action = traj.action_mask[0, start:start + length].tolist()
    assert [t for t, a in zip(response, action) if a] == [t for seg in engine.emitted for t in seg]  # token-out
    assert tok.decode(response, skip_special_tokens=True) == H_CLEAN  # one response block, no doubled marker
