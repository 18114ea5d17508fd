"""The transformers rollout engine: one decoder (``hf_session.DecodeSession``) for the tool loop, validation and
plain generation, always available (CPU or GPU).

Requests are rows of one continuously batched decode session (see ``hf_session``): a row joins the batch when it is
submitted, leaves it when it finishes and stays *parked* with its keys / values in place, so that resubmitting it
with its ids + an injected tool output feeds only the new tokens. The session is opened by the first submit after
the engine was idle and closed when the last request is released (the model's train / eval mode and torch's thread
count are restored then), so nothing cached outlives a rollout.

Greedy decoding is a plain ``argmax`` over float32 logits (no repetition penalty or other processors), the same rule
as vLLM's greedy sampler, so both engines agree token for token on the same model.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from zerotir.config import HFRollout
from zerotir.lora import is_adapted
from zerotir.rollout.engine import AdapterPath, Sample, SamplingParams, check_request, pad_id
from zerotir.rollout.hf_adapter import attention_implementation
from zerotir.rollout.hf_session import SUPPORTED_ATTENTION, DecodeSession
from zerotir.rollout.sampling import StopMatcher
from zerotir.rollout.vllm_lora import actor_adapter

# Below this many parameters a CPU model decodes faster on one thread (see ``num_threads``).
_SMALL_MODEL_PARAMS = 20_000_000


class HFEngine:
    """``RolloutEngine`` over a transformers causal LM (see the module doc).

    All requests running at one time draw from one random generator: the first submit after the engine was idle
    seeds it until the last request is released; each request brings its own temperature, top_p, stops and budget
    (a greedy evaluation request decodes beside sampled ones, as in vLLM).

    Attributes:
        eos_ids: token ids that end a sample (tokenizer EOS + the generation config's); clear it to decode a fixed
            number of tokens (the overhead benchmark does).
        context_length: the model's ``max_position_embeddings``.

    ``max_batch_size``, ``num_threads`` and ``tokens_per_step`` are ``zerotir.config.HFRollout``'s settings
    (``model.rollout.init_args``) and take its defaults.

    Args:
        model: a loaded causal LM, or a folder / hub-style path to load with ``AutoModelForCausalLM``. A passed model
            is used as is (not copied): the transformers backend wraps the trained actor itself.
        tokenizer: required with a loaded model (stop strings are matched on decoded text); loaded from ``model``'s
            folder when ``model`` is a path.
        device: where the model runs.
        dtype: optional dtype to cast the model to (float32 keeps greedy decoding comparable with vLLM on CPU).
        max_batch_size: rows decoded together; more requests wait for a free row (or, when nothing runs, take the
            slot of a finished ``SamplingParams.evictable`` request, whose cached keys / values are then dropped).
        num_threads: torch intra-op threads while a session is open (restored afterwards). None = 1 for a model under
            ``_SMALL_MODEL_PARAMS`` parameters on CPU, else torch's setting: decoding a tiny model is a stream of
            very small matmuls where thread synchronisation costs more than it saves, and on a loaded machine a
            descheduled worker thread stalls every op.
        tokens_per_step: tokens decoded per running request in one ``step`` (fewer when a request finishes first):
            how often the tool loop looks at the sandbox's results.

    Raises:
        ValueError: the model's attention implementation is not one the decode session builds masks for (sdpa,
            eager), naming the fix; a bad size.
    """

    def __init__(
        self,
        model: PreTrainedModel | str | Path,
        tokenizer: PreTrainedTokenizerBase | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_size: int = HFRollout.max_batch_size,
        num_threads: int | None = HFRollout.num_threads,
        tokens_per_step: int = HFRollout.tokens_per_step,
    ):
        if isinstance(model, (str, Path)):
            if not Path(model).exists():
                raise FileNotFoundError(f"HFEngine: model folder {str(model)!r} does not exist; pass the folder of a "
                                        "saved model (config.json, weights, tokenizer)")
            tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(model))
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
        if tokenizer is None:
            raise ValueError("HFEngine: `tokenizer` is required when `model` is a loaded model (stop strings are "
                             "matched on decoded text); pass the tokenizer that goes with the model.")
        for name, value in (("max_batch_size", max_batch_size), ("tokens_per_step", tokens_per_step)):
            if value < 1:
                raise ValueError(f"HFEngine: {name} must be >= 1, got {value}")
        attention = attention_implementation(model.config)
        if attention not in SUPPORTED_ATTENTION:
            raise ValueError(f"HFEngine: the model uses attention implementation {attention!r}; the decode session "
                             f"builds masks for {list(SUPPORTED_ATTENTION)} only. Load the model with "
                             "attn_implementation='sdpa' (or 'eager').")
        self.device = torch.device(device)
        self.model = model.to(self.device) if dtype is None else model.to(self.device, dtype)
        self.tokenizer = tokenizer
        self.max_batch_size, self.tokens_per_step = max_batch_size, tokens_per_step
        config = self.model.config.get_text_config()
        self.num_layers = config.num_hidden_layers
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.context_length = getattr(config, "max_position_embeddings", None) or 1 << 30
        self.pad_id = pad_id(tokenizer)
        self.eos_ids = _eos_ids(self.model, tokenizer)
        self._matchers: dict[tuple[str, ...], StopMatcher] = {}
        self._session: DecodeSession | None = None
        if num_threads is None and self.device.type == "cpu":
            small = sum(p.numel() for p in self.model.parameters()) < _SMALL_MODEL_PARAMS
            num_threads = 1 if small else None
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"HFEngine: num_threads must be >= 1 or None, got {num_threads}")
        self.num_threads = num_threads
        self._adapter_config: dict[str, Any] | None = None  # set by the first update_adapter (its model adapted)

    # ---------------------------------------------------------------------------------------- the protocol
    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        """Start or continue request ``key`` (``GenerationEngine.submit``).

        Raises:
            ValueError: bad ids / params, or ``key`` still running.
        """
        check_request(key, ids, params, self.vocab_size, self.context_length)
        session = self._session
        if session is None:
            session = self._session = DecodeSession(self, params.seed)
        session.add(key, list(ids), params)

    def step(self) -> list[tuple[Hashable, Sample]]:
        """Decode up to ``tokens_per_step`` tokens per running request; the requests that finished."""
        if self._session is None:
            return []
        return self._session.step(self.tokens_per_step)

    def release(self, key: Hashable) -> None:
        """Forget request ``key``; the session closes when no request is left."""
        if self._session is None:
            return
        self._session.release(key)
        if self._session.empty:
            self._close()

    @property
    def num_running(self) -> int:
        return 0 if self._session is None else self._session.num_running

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> None:
        """Copy ``(name, tensor)`` pairs (HF parameter / buffer names) into the model; no reference is kept. Then
        ``reset_cache``.

        Raises:
            KeyError: a name the model does not have.
            ValueError: a tensor whose shape differs from the model's.
        """
        if isinstance(named_tensors, Mapping):
            named_tensors = named_tensors.items()
        targets = dict(self.model.named_parameters())
        targets.update(self.model.named_buffers())
        with torch.no_grad():
            for name, tensor in named_tensors:
                target = targets.get(name)
                if target is None:
                    raise KeyError(f"update_weights: the model has no parameter {name!r} (expected HF names such as "
                                   f"{next(iter(targets))!r})")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the model expects "
                                     f"{tuple(target.shape)}")
                target.copy_(tensor)
        self.reset_cache()

    def reset_cache(self) -> None:
        """Drop every cached key / value (they belong to the weights before a change): parked requests are
        forgotten, running ones recompute theirs at their next step and go on sampling. Between rollouts there is
        nothing to drop: the session closes with its last request."""
        if self._session is not None:
            self._session.drop_cache()
            if self._session.empty:
                self._close()

    def update_adapter(self, tensors: Mapping[str, torch.Tensor], config: dict[str, Any]) -> None:
        """Generate through this LoRA adapter from now on (``EngineWeights.update_adapter``): the first call puts
        adapters of ``config`` on the engine's own model (``peft.inject_adapter_in_model``: the model stays a plain
        transformers module, its base weights untouched), every call copies ``tensors`` into them
        (``peft.set_peft_model_state_dict``), then ``reset_cache``.

        Raises:
            ValueError: ``config`` differs from the first push's, or ``tensors`` do not fit the adapters (names or
                shapes).
        """
        import peft

        if self._adapter_config is None:
            peft.inject_adapter_in_model(peft.LoraConfig(**config), self.model)
            self.model.requires_grad_(False)
            self._adapter_config = dict(config)
        elif config != self._adapter_config:
            raise ValueError(f"HFEngine.update_adapter: the adapter's settings {config} differ from those its "
                             f"adapters were built with ({self._adapter_config}); a run pushes one adapter shape")
        root = "base_model.model."  # peft's prefix of a PeftModel's names; the adapted model here is the bare one
        state = {name.removeprefix(root): t for name, t in tensors.items()}
        with torch.no_grad():
            loaded = peft.set_peft_model_state_dict(self.model, state)
        missing = [name for name in loaded.missing_keys if ".lora_" in name]
        if loaded.unexpected_keys or missing:
            raise ValueError(f"HFEngine.update_adapter: tensors {loaded.unexpected_keys[:2]} fit no adapter of the "
                             f"model and adapters {missing[:2]} got no tensor; push the whole adapter of the actor")
        self.reset_cache()

    def adapter_path(self, actor: torch.nn.Module | None) -> AdapterPath:
        """"in place" when the engine wraps ``actor`` itself (the colocated engine), else "adapter": a model of its
        own (an engine host's) takes the adapter tensors (``update_adapter``)."""
        return "in place" if actor is not None and actor is self.model else "adapter"

    def load_weights_from(self, actor: torch.nn.Module) -> None:
        """Generate with ``actor``'s current weights from now on. The engine that wraps the trained actor itself has
        them already: only its cached keys / values (of the old weights) are dropped (``reset_cache``). An engine on
        a model of its own (an engine host's) gets a LoRA actor's adapter (``update_adapter``), else every weight
        copied in buckets (``zerotir.parallel.weight_sync.sync_weights``)."""
        if actor is self.model:
            self.reset_cache()
            return
        if is_adapted(actor):
            with actor_adapter(actor) as adapter:
                self.update_adapter(*adapter)
            return
        from zerotir.parallel.weight_sync import sync_weights

        sync_weights(actor, self)

    def rest(self) -> None:
        """Nothing to release between rollouts: the engine generates with the trained module, whose memory training
        uses, or with a model of its own that keeps generating (an engine host's)."""

    def close(self) -> None:
        """End the open decode session, if any (its rows and cached keys / values); the model is left as it is
        (it may be the trained actor). The engine can open a new session afterwards."""
        if self._session is not None:
            self._close()

    # ---------------------------------------------------------------------------------------- internals
    def _close(self) -> None:
        session, self._session = self._session, None
        session.close()

    def _matcher(self, stops: list[str]) -> StopMatcher:
        """The stop matcher of ``stops``, built once (it scans the vocabulary) and kept for later calls."""
        key = tuple(stops)
        if key not in self._matchers:
            if len(self._matchers) >= 64:
                self._matchers.clear()
            self._matchers[key] = StopMatcher(self.tokenizer, stops, self.vocab_size)
        return self._matchers[key]


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """EOS ids from the tokenizer and the model's generation config (vLLM stops on both)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    generation_config = model.generation_config if model.can_generate() else None
    gen_eos = generation_config.eos_token_id if generation_config is not None else None
    ids.update([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []))
    return ids
