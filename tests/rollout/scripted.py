"""Test doubles for the tool loop: a scripted engine over the byte tokenizer and a scripted sandbox.

``ScriptedEngine`` behaves like a model that conditions on its context: for each prompt it has one or more
*transcripts* (one per sample), each a list of turns, turn k being the text it writes after the k-th injected output
block. On every call it reads the response so far from the context, finds the turn and the part of it already
written, and emits the rest byte by byte (one token per byte), then EOS, honouring stop strings (ending right after
the token that completes one, as vLLM and HFEngine do) and ``max_new_tokens``. Each sampled token's log-prob is a
known function of its id and position, so tests can check that log-probs land on the right tokens.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from sandbox import ExecResult, ExecStatus
from zerotir.rollout.engine import Sample, SamplingParams

_INJECTED = re.compile(r"\n```output\n.*?\n```\n", re.S)


def fake_logprob(token_id: int, index: int) -> float:
    """The scripted log-prob of the ``index``-th token of a call."""
    return -0.01 * (token_id % 17 + 1) - 0.001 * index


@dataclass
class ScriptedEngine:
    """A ``RolloutEngine`` replaying transcripts (see the module docstring).

    Args:
        tokenizer: the byte tokenizer.
        scripts: prompt text -> transcripts (sample j of a call with n samples uses transcript j % len).
    """

    tokenizer: object
    scripts: dict[str, list[list[str]]]
    accepts_param_list: bool = False
    can_pause: bool = False
    calls: list[tuple[list[str], SamplingParams | list[SamplingParams]]] = field(default_factory=list)
    returned: list[list[list[Sample]]] = field(default_factory=list)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], *,
                 pause_fraction: float = 0.0) -> list[list[Sample]]:
        texts = [self.tokenizer.decode(p) for p in prompts]
        self.calls.append((texts, params))
        if isinstance(params, list):
            assert self.accepts_param_list, "a list of params sent to an engine that does not accept one"
            per_prompt = params
        else:
            per_prompt = [params] * len(prompts)
        assert self.can_pause or not pause_fraction, "pause_fraction sent to an engine that cannot pause"
        out = [[self._sample(text, prm, j) for j in range(prm.n)] for text, prm in zip(texts, per_prompt)]
        if pause_fraction:
            out = _pause(out, math.ceil(pause_fraction * sum(len(samples) for samples in out)))
        self.returned.append(out)
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError("a scripted engine has no weights")

    def _sample(self, context: str, params: SamplingParams, j: int) -> Sample:
        prompt = max((p for p in self.scripts if context.startswith(p)), key=len)
        response = context[len(prompt) :]
        written = _INJECTED.split(response)  # model-written parts, one per turn so far
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


def _pause(out: list[list[Sample]], pause_below: int) -> list[list[Sample]]:
    """What a batch decoding all rows in step would return when it pauses once fewer than ``pause_below`` run: after
    step t every row longer than t comes back with its first t tokens, marked partial."""
    lengths = [len(s.token_ids) for samples in out for s in samples]
    for t in range(1, max(lengths, default=0)):
        if 0 < sum(n > t for n in lengths) < pause_below:
            return [[Sample(s.token_ids[:t], s.logprobs[:t], "length", partial=True) if len(s.token_ids) > t else s
                     for s in samples] for samples in out]
    return out


def _consistent(script: list[str], written: list[str]) -> bool:
    turn = len(written) - 1
    if turn >= len(script):
        return all(a == b for a, b in zip(script, written[: len(script)]))
    return script[:turn] == written[:turn] and script[turn].startswith(written[-1])


@dataclass
class ScriptedSandbox:
    """Answers each snippet from a table (code -> ExecResult; unknown code -> ``default``) and records the calls."""

    table: dict[str, ExecResult] = field(default_factory=dict)
    default: ExecResult | None = None
    raises: Exception | None = None
    codes: list[str] = field(default_factory=list)
    timeouts: list[float | None] = field(default_factory=list)

    async def run(self, code: str, *, run_timeout: float | None = None) -> ExecResult:
        self.codes.append(code)
        self.timeouts.append(run_timeout)
        if self.raises is not None:
            raise self.raises
        if code in self.table:
            return self.table[code]
        if self.default is None:
            raise AssertionError(f"unexpected code sent to the sandbox: {code!r}")
        return self.default


def ok(stdout: str) -> ExecResult:
    return ExecResult(ExecStatus.OK, stdout, "", 0.01, 0)


@dataclass
class ScriptedBatchSandbox(ScriptedSandbox):
    """A ``ScriptedSandbox`` that also takes a whole round's code at once, recording each batch."""

    batches: list[list[str]] = field(default_factory=list)

    async def run_many(self, codes: list[str], *, run_timeout: float | None = None) -> list[ExecResult]:
        self.batches.append(list(codes))
        return [await self.run(code, run_timeout=run_timeout) for code in codes]
