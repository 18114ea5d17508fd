"""Test doubles for the tool loop: a scripted engine over the byte tokenizer and a scripted sandbox.

``ScriptedEngine`` behaves like a model that conditions on its context: for each prompt it has one or more
*transcripts* (one per sample), each a list of turns, turn k being the text it writes after the k-th injected output
block. On every submitted request it reads the response so far from the ids, finds the turn and the part of it
already written, and emits the rest byte by byte (one token per byte), then EOS, honouring stop strings (ending right
after the token that completes one, as vLLM and HFEngine do) and ``max_new_tokens``. Each sampled token's log-prob is a
known function of its id and position, so tests can check that log-probs land on the right tokens.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import torch

from sandbox import ExecResult, ExecStatus
from zerotir.rollout.engine import Sample, SamplingParams

_INJECTED = re.compile(r"\n```output\n.*?\n```\n|\n<tool_response>\n.*?\n</tool_response>\n", re.S)  # fences, hermes


def fake_logprob(token_id: int, index: int) -> float:
    """The scripted log-prob of the ``index``-th token of a call."""
    return -0.01 * (token_id % 17 + 1) - 0.001 * index


@dataclass
class Submission:
    """One ``submit`` the engine received."""

    key: Hashable
    ids: list[int]
    text: str
    params: SamplingParams


@dataclass
class ScriptedEngine:
    """A ``GenerationEngine`` replaying transcripts (see the module docstring).

    Each submitted request finishes after ``ceil(len / tokens_per_step)`` steps (its tokens appear as if decoded at
    that rate, all requests in parallel), so requests end in the order a real engine would end them.

    Args:
        tokenizer: the byte tokenizer.
        scripts: prompt text -> transcripts (trajectory ``key`` uses transcript ``(key % n) % len``: sample j of its
            prompt, with ``n`` samples per prompt).
        n: samples per prompt of the rollout (to find a trajectory's sample index from its key).
        tokens_per_step: tokens per request and step.
        context_length: the context the engine reports.
        injected: what an injected output block looks like (fences' and hermes's by default), to tell turns apart.
    """

    tokenizer: object
    scripts: dict[str, list[list[str]]]
    n: int = 1
    tokens_per_step: int = 1
    context_length: int = 1 << 20
    injected: re.Pattern = _INJECTED
    calls: list[Submission] = field(default_factory=list)
    returned: list[tuple[Hashable, Sample]] = field(default_factory=list)
    released: list[Hashable] = field(default_factory=list)
    steps: int = 0
    closed: bool = False
    _running: dict[Hashable, tuple[Sample, int]] = field(default_factory=dict)

    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        assert params.n == 1, "a request is one sample"
        assert key not in self._running, f"{key!r} submitted while running"
        text = self.tokenizer.decode(ids)
        self.calls.append(Submission(key, list(ids), text, params))
        index = key[-1] if isinstance(key, tuple) else key  # a stream's share submits (its tag, the loop's key)
        sample = self._sample(text, params, index % self.n if isinstance(index, int) else 0)
        self._running[key] = (sample, self.steps + max(1, math.ceil(len(sample.token_ids) / self.tokens_per_step)))

    def step(self) -> list[tuple[Hashable, Sample]]:
        self.steps += 1
        done = [(k, s) for k, (s, at) in self._running.items() if at <= self.steps]
        for key, _ in done:
            del self._running[key]
        self.returned += done
        return done

    def release(self, key: Hashable) -> None:
        self.released.append(key)
        self._running.pop(key, None)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError("a scripted engine has no weights")

    def adapter_path(self, actor: torch.nn.Module | None) -> str:
        """A LoRA actor's pushes would come as whole (merged) weights, as ``update_weights`` takes them."""
        return "merged"

    def reset_cache(self) -> None:
        pass

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def submissions(self, key: Hashable) -> list[Submission]:
        return [c for c in self.calls if c.key == key]

    def _sample(self, context: str, params: SamplingParams, j: int) -> Sample:
        prompt = max((p for p in self.scripts if context.startswith(p)), key=len)
        response = context[len(prompt) :]
        written = self.injected.split(response)  # model-written parts, one per turn so far
        turn = len(written) - 1
        alternatives = self.scripts[prompt]
        if response:  # a continuation: the transcript whose earlier turns match what is already there
            alternatives = [t for t in alternatives if _consistent(t, written)]
            if not alternatives:
                raise AssertionError(f"no transcript of {prompt!r} matches the response {response!r}")
            script = alternatives[0]
        else:
            script = alternatives[j % len(alternatives)]
        todo = script[turn][len(written[-1]) :] if turn < len(script) else ""
        ids: list[int] = []
        text = ""
        for ch in todo:
            if len(ids) == params.max_new_tokens:
                return self._done(ids, "length")
            ids += self.tokenizer.encode(ch, add_special_tokens=False)
            text += ch
            hit = next((s for s in params.stop if s in text), None)
            if hit is not None:
                return self._done(ids, "stop", hit)
        if len(ids) == params.max_new_tokens:
            return self._done(ids, "length")
        return self._done(ids + [self.tokenizer.eos_token_id], "eos")

    @staticmethod
    def _done(ids: list[int], reason: str, stop: str | None = None) -> Sample:
        return Sample(ids, [fake_logprob(t, i) for i, t in enumerate(ids)], reason, stop)


class InlineEngine(ScriptedEngine):
    """The scripted engine as the in-line source holds it: nothing to load between updates, nothing to put to rest."""

    def load_weights_from(self, actor: torch.nn.Module) -> None:
        pass

    def rest(self) -> None:
        pass


def _consistent(script: list[str], written: list[str]) -> bool:
    turn = len(written) - 1
    if turn >= len(script):
        return all(a == b for a, b in zip(script, written[: len(script)]))
    return script[:turn] == written[:turn] and script[turn].startswith(written[-1])


@dataclass
class ScriptedSandbox:
    """Answers each snippet from a table (code -> ExecResult; unknown code -> ``default``) after its delay (code ->
    seconds, default 0) and records the calls; ``events`` logs ("start", code) and ("done", code) in order."""

    table: dict[str, ExecResult] = field(default_factory=dict)
    default: ExecResult | None = None
    raises: Exception | None = None
    delays: dict[str, float] = field(default_factory=dict)
    codes: list[str] = field(default_factory=list)
    timeouts: list[float | None] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)

    async def run(self, code: str, *, run_timeout: float | None = None) -> ExecResult:
        self.codes.append(code)
        self.timeouts.append(run_timeout)
        self.events.append(("start", code))
        if code in self.delays:
            await asyncio.sleep(self.delays[code])
        self.events.append(("done", code))
        if self.raises is not None:
            raise self.raises
        if code in self.table:
            return self.table[code]
        if self.default is None:
            raise AssertionError(f"unexpected code sent to the sandbox: {code!r}")
        return self.default


def ok(stdout: str) -> ExecResult:
    return ExecResult(ExecStatus.OK, stdout, "", 0.01, 0)
