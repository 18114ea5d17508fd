"""The transformers rollout engine: batched sampling with a KV cache, always available (CPU or GPU).

Rows are left-aligned to a common last column and decoded together; each row finishes on its own (EOS, a stop string
found in the decoded tail of its sampled ids, or its token limit). Finished rows are dropped from the batch in groups
so the rest does not pay for them. Greedy decoding is a plain ``argmax`` over float32 logits (no repetition penalty or
other processors), the same rule as vLLM's greedy sampler, so both engines agree token for token on the same model.

For the tool loop it also takes one ``SamplingParams`` per prompt (each row its own stops and limit, as vLLM's
``LLM.generate`` does), can pause a call once few rows still run (``pause_fraction``), and keeps the keys / values of
rows that ended on a stop string or their limit in a prefix store: when such a row is continued (its ids + the
injected tool output as the next prompt) only the new tokens are prefilled. See ``kv_cache``. Those new parts differ
in length (one token for a paused row, a whole output block for a row whose code has run): rows are prefilled in
groups of similar length, one forward each, into the same cache, so that short rows are not padded to the longest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from zerotir.rollout.engine import Sample, SamplingParams, check_prompts, pad_id, per_prompt_params, torch_threads
from zerotir.rollout.hf_session import SUPPORTED_ATTENTION, DecodeSession
from zerotir.rollout.kv_cache import (
    PrefixEntry,
    PrefixStore,
    drop_leading,
    grow_columns,
    prefill_groups,
    row_view,
    select_rows,
    set_length,
    slot_cache,
)
from zerotir.rollout.sampling import StopMatcher, ended_rows, sample_tokens

# Decode columns reserved up front per call; the cache doubles beyond that (keeps memory small for short calls).
_INITIAL_DECODE_ROOM = 256
# Below this many parameters a CPU model decodes faster on one thread (see ``num_threads``).
_SMALL_MODEL_PARAMS = 20_000_000
# Fixed cost of one prefill forward in token positions, for splitting a prefill into groups (``prefill_groups``):
# a second forward pays off only when it saves more padding than this. ~2 decode steps of a 128-row batch.
_FORWARD_COST_TOKENS = 256


@dataclass
class _Outputs:
    """What the rows of one chunk have sampled so far (indexed by row)."""

    rows: list[list[int]]
    limits: list[int]
    matchers: list[StopMatcher | None]
    ids: list[list[int]] = field(init=False)
    lps: list[list[float]] = field(init=False)
    results: list[Sample | None] = field(init=False)

    def __post_init__(self) -> None:
        self.ids = [[] for _ in self.rows]
        self.lps = [[] for _ in self.rows]
        self.results = [None] * len(self.rows)


@dataclass
class _Batch:
    """Decoding state of the rows of one chunk; position p of every tensor is row ``slots[p]`` (-1 = finished)."""

    cache: object
    attn: torch.Tensor  # (B, capacity) bool: which cache columns are real tokens of the row
    length: int  # filled cache columns
    next_pos: torch.Tensor  # (B,) long: position id of the next fed token
    logits: torch.Tensor  # (B, V) float32: next-token logits
    slots: list[int]


class HFEngine:
    """``RolloutEngine`` over a transformers causal LM.

    Attributes:
        accepts_param_list: ``generate`` takes one ``SamplingParams`` per prompt (the tool loop uses it to give each
            row its own stops and budget in one call).
        can_pause: ``generate`` takes ``pause_fraction`` (see there).
        eos_ids: token ids that end a sample (tokenizer EOS + the generation config's); clear it to decode a fixed
            number of tokens (the overhead benchmark does).
        prefix_store: keys / values of rows that ended on a stop string or their budget, for their continuation.

    Args:
        model: a loaded causal LM, or a folder / hub-style path to load with ``AutoModelForCausalLM``. A passed model
            is used as is (not copied): pass a separate copy if another module trains it.
        tokenizer: required with a loaded model (stop strings are matched on decoded text); loaded from ``model``'s
            folder when ``model`` is a path.
        device: where the model runs.
        dtype: optional dtype to cast the model to (float32 keeps greedy decoding comparable with vLLM on CPU).
        max_batch_size: rows decoded together; more rows are processed in consecutive chunks.
        prefix_cache_tokens: tokens of keys / values kept for rows that ended on a stop string or their limit, so
            that their continuation prefills only the new tokens (0 disables it; least recently stored go first).
        num_threads: torch intra-op threads while generating (restored afterwards). None = 1 for a model under
            ``_SMALL_MODEL_PARAMS`` parameters on CPU, else torch's setting: decoding a tiny model is a stream of
            very small matmuls where thread synchronisation costs more than it saves, and on a loaded machine a
            descheduled worker thread stalls every op (measured: 0.1 ms vs 8 ms per matmul on 2 busy cores).
    """

    accepts_param_list = True
    can_pause = True

    def __init__(
        self,
        model: PreTrainedModel | str | Path,
        tokenizer: PreTrainedTokenizerBase | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_size: int = 64,
        prefix_cache_tokens: int = 262_144,
        num_threads: int | None = None,
    ):
        if isinstance(model, (str, Path)):
            tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(model))
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
        if tokenizer is None:
            raise ValueError("HFEngine: `tokenizer` is required when `model` is a loaded model (stop strings are "
                             "matched on decoded text); pass the tokenizer that goes with the model.")
        if max_batch_size < 1:
            raise ValueError(f"HFEngine: max_batch_size must be >= 1, got {max_batch_size}")
        if prefix_cache_tokens < 0:
            raise ValueError(f"HFEngine: prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}")
        self.device = torch.device(device)
        self.model = model.to(self.device) if dtype is None else model.to(self.device, dtype)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        config = self.model.config.get_text_config()
        self.num_layers = config.num_hidden_layers
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.max_positions = getattr(config, "max_position_embeddings", None) or 1 << 30
        self.pad_id = pad_id(tokenizer)
        self.eos_ids = _eos_ids(self.model, tokenizer)
        self.prefix_store = PrefixStore(prefix_cache_tokens)
        self._matchers: dict[tuple[str, ...], StopMatcher] = {}
        if num_threads is None and self.device.type == "cpu":
            small = sum(p.numel() for p in self.model.parameters()) < _SMALL_MODEL_PARAMS
            num_threads = 1 if small else None
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"HFEngine: num_threads must be >= 1 or None, got {num_threads}")
        self.num_threads = num_threads

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], *,
                 pause_fraction: float = 0.0) -> list[list[Sample]]:
        """For each prompt (token ids), ``n`` samples (see ``RolloutEngine.generate``).

        ``params`` may also be a list with one ``SamplingParams`` per prompt (``accepts_param_list``), as vLLM's
        ``LLM.generate`` takes: they may differ in ``n``, ``max_new_tokens`` and ``stop``; temperature, top_p and
        seed must be the same (one sampler per call).

        ``pause_fraction`` (``can_pause``): return as soon as fewer than this fraction of a batch's rows are still
        running; those come back as ``partial`` samples (finish "length") to be continued later. The tool loop uses
        it so that a few slow rows do not hold up the rows waiting to run their code (0 = never pause).

        Raises:
            ValueError: an empty prompt, an id outside the vocabulary, a prompt that fills the model's context, or
                invalid ``params``.
        """
        per_prompt = _per_prompt_params(prompts, params)
        check_prompts(prompts, self.vocab_size, self.max_positions, "the model's context")
        shared = per_prompt[0] if per_prompt else SamplingParams()
        rows = [list(p) for p, prm in zip(prompts, per_prompt) for _ in range(prm.n)]
        row_params = [prm for prm in per_prompt for _ in range(prm.n)]
        generator = None if shared.seed is None else torch.Generator(self.device).manual_seed(shared.seed)
        matchers = {tuple(prm.stop): self._matcher(prm.stop) for prm in per_prompt if prm.stop}
        was_training = self.model.training
        self.model.eval()
        samples: list[Sample] = []
        try:
            with torch.inference_mode(), torch_threads(self.num_threads):
                for start in range(0, len(rows), self.max_batch_size):
                    part = slice(start, start + self.max_batch_size)
                    row_matchers = [matchers.get(tuple(prm.stop)) for prm in row_params[part]]
                    pause_below = math.ceil(pause_fraction * len(rows[part]))
                    samples += self._generate_chunk(rows[part], [prm.max_new_tokens for prm in row_params[part]],
                                                    row_matchers, shared, generator, pause_below)
        finally:
            self.model.train(was_training)
        out, at = [], 0
        for prm in per_prompt:
            out.append(samples[at : at + prm.n])
            at += prm.n
        return out

    @property
    def can_continue(self) -> bool:
        """Whether ``session`` is available (it builds attention masks for sdpa and eager attention)."""
        return self.model.config._attn_implementation in SUPPORTED_ATTENTION

    def session(self, params: SamplingParams) -> DecodeSession:
        """A continuous-batching session (``hf_session.DecodeSession``) sampling with ``params``' temperature,
        top_p and seed; each row added brings its own stops and limit."""
        params.validate()
        if not self.can_continue:
            raise ValueError(f"HFEngine.session: attention implementation "
                             f"{self.model.config._attn_implementation!r} is not supported; load the model with "
                             f"attn_implementation='sdpa' or 'eager', or use generate")
        return DecodeSession(self, params.temperature, params.top_p, params.seed)

    def _matcher(self, stops: list[str]) -> StopMatcher:
        """The stop matcher of ``stops``, built once (it scans the vocabulary) and kept for later calls."""
        key = tuple(stops)
        if key not in self._matchers:
            if len(self._matchers) >= 64:
                self._matchers.clear()
            self._matchers[key] = StopMatcher(self.tokenizer, stops, self.vocab_size)
        return self._matchers[key]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> None:
        """Copy ``(name, tensor)`` pairs (HF parameter / buffer names) into the model; no reference is kept.

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
        self.prefix_store.clear()  # cached keys / values belong to the old weights

    def _generate_chunk(
        self, rows: list[list[int]], max_new: list[int], matchers: list[StopMatcher | None], shared: SamplingParams,
        generator: torch.Generator | None, pause_below: int,
    ) -> list[Sample]:
        limits = [min(m, self.max_positions - len(p)) for p, m in zip(rows, max_new)]
        out = _Outputs(rows, limits, matchers)
        batch = self._prefill(rows, min(max(limits), _INITIAL_DECODE_ROOM))
        while True:
            tokens, logps = sample_tokens(batch.logits, shared.temperature, shared.top_p, generator)
            self._take_step(batch, out, tokens.tolist(), logps.tolist())
            running = [(pos, row) for pos, row in enumerate(batch.slots) if row >= 0]
            if 0 < len(running) < pause_below:
                for pos, row in running:
                    out.results[row] = Sample(out.ids[row], out.lps[row], "length", partial=True)
                    self._remember(batch, pos, rows[row] + out.ids[row][:-1])
                return out.results
            if not running:
                return out.results
            tokens = self._compact(batch, tokens)
            self._step(batch, tokens)

    def _take_step(self, batch: _Batch, out: _Outputs, toks: list[int], lps: list[float]) -> None:
        """Append each running row's new token and end the rows that hit EOS, a stop string or their limit."""
        running = []
        for pos, row in enumerate(batch.slots):
            if row >= 0:
                out.ids[row].append(toks[pos])
                out.lps[row].append(lps[pos])
                running.append(((pos, row), out.ids[row], out.matchers[row], out.limits[row]))
        ended = [(pos, row, reason, stop) for (pos, row), reason, stop in ended_rows(running, self.eos_ids)]
        for pos, row, reason, stop in ended:
            out.results[row] = Sample(out.ids[row], out.lps[row], reason, stop)
            if reason != "eos":  # a row that ends on a stop or its limit may be continued (tool loop)
                self._remember(batch, pos, out.rows[row] + out.ids[row][:-1])
            batch.slots[pos] = -1

    def _prefill(self, rows: list[list[int]], decode_room: int) -> _Batch:
        """Run the prompts (identical prompts once, reusing stored prefixes) and return the batch ready to decode.

        Rows are prefilled in groups of similar new-part lengths (``prefill_groups``), one forward each, into one
        cache: the rows continuing after a pause (one new token) are not padded to the length of an injected tool
        output. Layout: E = the common end column. Group g has longest new part S_g; its rows' new tokens sit
        right-aligned in [E - S_g, E), their reused keys / values right-aligned just before, ending at E - S_g;
        gaps are masked out. E is the smallest end that fits every group's longest reused prefix.
        """
        index: dict[tuple, int] = {}
        inverse = [index.setdefault(tuple(p), len(index)) for p in rows]
        uniq = [list(k) for k in index]
        entries = [self.prefix_store.take(p) if self.prefix_store.max_tokens else None for p in uniq]
        reused = [len(e.ids) if e is not None else 0 for e in entries]
        fresh = [len(p) - m for p, m in zip(uniq, reused)]
        # Without a reused prefix the buffers' shape is known only after the first forward: one group then.
        groups = prefill_groups(fresh, _FORWARD_COST_TOKENS) if any(reused) else [list(range(len(uniq)))]
        order = [i for g in groups for i in g]
        spans, at = [], 0  # (first, last + 1, longest new part) of each group, in batch positions
        for g in groups:
            spans.append((at, at + len(g), max(fresh[i] for i in g)))
            at += len(g)
        uniq, entries = [uniq[i] for i in order], [entries[i] for i in order]
        reused, fresh = [reused[i] for i in order], [fresh[i] for i in order]
        end = max(max(reused[a:b]) + s for a, b, s in spans)
        cache = slot_cache(self.num_layers, end + decode_room)
        if any(reused):
            splits = [end - s for a, b, s in spans for _ in range(a, b)]
            self._load_prefixes(cache, entries, splits, end + decode_room)
        attn = torch.zeros(len(uniq), end + decode_room, dtype=torch.bool, device=self.device)
        logits = [self._prefill_group(cache if len(spans) == 1 else row_view(cache, a, b, end - s), uniq[a:b],
                                      reused[a:b], attn[a:b], end, s) for a, b, s in spans]
        set_length(cache, end)
        batch = _Batch(cache, attn, end, torch.tensor([len(p) for p in uniq], device=self.device),
                       torch.cat(logits), list(range(len(rows))))
        position = {u: k for k, u in enumerate(order)}  # unique prompt -> its batch position
        inv = [position[u] for u in inverse]
        if inv != list(range(len(uniq))):  # expand identical prompts (the n samples of one prompt) to their rows
            idx = torch.tensor(inv, device=self.device)
            select_rows(cache, idx)
            batch.attn, batch.next_pos, batch.logits = attn[idx], batch.next_pos[idx], batch.logits[idx]
        return batch

    def _prefill_group(self, cache, prompts: list[list[int]], reused: list[int], attn: torch.Tensor, end: int,
                       s: int) -> torch.Tensor:
        """Feed the new tokens of ``prompts`` (right-aligned in [end - s, end)) through ``cache``, whose columns
        before ``end - s`` hold their reused prefixes; mark the real columns in ``attn``; return last logits."""
        ids = torch.full((len(prompts), s), self.pad_id, dtype=torch.long)
        for i, (p, m) in enumerate(zip(prompts, reused)):
            f = len(p) - m
            attn[i, end - s - m : end - s] = True
            attn[i, end - f : end] = True
            ids[i, s - f :] = torch.tensor(p[m:])
        offsets = torch.tensor([m - (s - (len(p) - m)) for p, m in zip(prompts, reused)])
        positions = (torch.arange(s)[None, :] + offsets[:, None]).clamp(min=0)
        out = self.model(input_ids=ids.to(self.device), attention_mask=attn[:, :end],
                         position_ids=positions.to(self.device), past_key_values=cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1].float()

    def _load_prefixes(self, cache, entries: list[PrefixEntry | None], splits: list[int], capacity: int) -> None:
        """Copy the reused keys / values into fresh buffers, row i's right-aligned to end at column ``splits[i]``
        (the cache counts as filled up to the last of them; ``_prefill`` sets the real length afterwards)."""
        sample = next(e for e in entries if e is not None)
        for layer_idx, layer in enumerate(cache.layers):
            heads, _, dim = sample.keys[layer_idx].shape
            kv = sample.keys[layer_idx]
            keys = kv.new_zeros(len(entries), heads, capacity, dim)
            values = torch.zeros_like(keys)
            for i, (e, c) in enumerate(zip(entries, splits)):
                if e is not None:
                    m = len(e.ids)
                    keys[i, :, c - m : c] = e.keys[layer_idx]
                    values[i, :, c - m : c] = e.values[layer_idx]
            layer.preload(keys, values, max(splits))

    def _remember(self, batch: _Batch, pos: int, ids: list[int]) -> None:
        """Keep row ``pos``'s keys / values (its prompt + sampled ids but the last, not yet fed) for a continuation."""
        if not self.prefix_store.max_tokens:
            return
        cols = batch.attn[pos, : batch.length].nonzero().squeeze(1)
        if len(cols) != len(ids):  # the layout invariant; never silently store a misaligned prefix
            raise RuntimeError(f"HFEngine: row has {len(cols)} cached columns for {len(ids)} ids")
        keys = [layer.keys[pos].index_select(1, cols) for layer in batch.cache.layers]
        values = [layer.values[pos].index_select(1, cols) for layer in batch.cache.layers]
        self.prefix_store.put(PrefixEntry(ids, keys, values))

    def _compact(self, batch: _Batch, tokens: torch.Tensor) -> torch.Tensor:
        """Drop finished rows once they are an eighth of the batch, and padding columns no row uses any more."""
        alive = [p for p, r in enumerate(batch.slots) if r >= 0]
        if len(batch.slots) - len(alive) < max(1, len(batch.slots) // 8):
            return tokens
        idx = torch.tensor(alive, device=self.device)
        select_rows(batch.cache, idx)
        batch.attn, batch.next_pos, batch.logits = batch.attn[idx], batch.next_pos[idx], None
        batch.slots = [batch.slots[p] for p in alive]
        used = batch.attn[:, : batch.length].any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            drop_leading(batch.cache, first)
            batch.attn = batch.attn[:, first:]
            batch.length -= first
        return tokens[idx]

    def _step(self, batch: _Batch, tokens: torch.Tensor) -> None:
        """Feed one token per row and compute the next logits."""
        batch.attn = grow_columns(batch.attn, batch.length + 1, 1)
        batch.attn[:, batch.length] = True
        batch.length += 1
        out = self.model(input_ids=tokens[:, None], attention_mask=batch.attn[:, : batch.length],
                         position_ids=batch.next_pos[:, None], past_key_values=batch.cache, use_cache=True)
        batch.logits = out.logits[:, -1].float()
        batch.next_pos += 1


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """EOS ids from the tokenizer and the model's generation config (vLLM stops on both)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []))
    return ids


def _per_prompt_params(prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[SamplingParams]:
    """``per_prompt_params``, plus what one sampler per call needs: one temperature, top_p and seed."""
    params = per_prompt_params(prompts, params)
    first = params[0] if params else None
    for i, prm in enumerate(params):
        if (prm.temperature, prm.top_p, prm.seed) != (first.temperature, first.top_p, first.seed):
            raise ValueError(f"generate: SamplingParams {i} differs from the first in temperature, top_p or seed; "
                             "per-prompt params may differ only in n, max_new_tokens and stop")
    return params
