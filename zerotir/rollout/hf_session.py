"""Continuous batching for ``HFEngine``: a decode session that rows leave and rejoin without rebuilding the batch.

The tool loop's rows stop at every code block: the row waits for the sandbox, then goes on with the injected output.
Run as separate ``generate`` calls (rounds), every call rebuilds the batch: keys / values are copied out and back in,
rows that stopped early idle until the round ends, and a row paused at a round's end pays a prefill to resume. A
``DecodeSession`` keeps one batch for the whole rollout instead:

* every row owns a slot (a row of the cache buffers) and its own fill column: rows are *ragged*, each writes its
  next token at its own column, so a row that rejoins after its tool call, or a new row in a freed slot, never
  shifts the others;
* a row that stops (a stop string, EOS, its limit) is returned at once and *parked*: its keys / values stay where
  they are; ``add`` with its ids + new tokens (the injected output) feeds only the new tokens, into its own columns.
  Only when no row runs and queued rows find no free slot do they take the slots of parked rows whose request was
  ``evictable`` (their keys / values are dropped: such a row starts afresh when it is added again);
* rows with several new tokens are fed in one forward over just those rows; every other step is one decode forward
  over the whole batch (parked and free slots compute a throw-away token: cheaper than moving the cache around).
  Free slots are dropped from the batch once they are an eighth of it (the last rows move into the free slots).
* on sdpa, a decode step whose rows differ much in width (a few rows carry a long tool output) attends to the
  wide rows apart over their own columns, the rest over a narrower width (``ragged_attention``).

Masks are built here, one additive ``(B, 1, S, W)`` mask per forward (sdpa and eager attention alike), with W = the widest
row's columns: a query sees its row's filled columns and, among the new ones, itself and those before it.

The cache, the forward and the attention switch go through ``hf_adapter``, the one module that touches transformers
internals.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Self

import torch

from zerotir.rollout.engine import Sample, SamplingParams, torch_threads
from zerotir.rollout.hf_adapter import RaggedCache, attention_implementation, decode_forward
from zerotir.rollout.ragged_attention import RaggedPlan, row_cost_cells, split_width
from zerotir.rollout.sampling import StopMatcher, ended_rows, sample_rows

# Attention implementations whose mask this module can build (a custom 4D mask is passed to them as is).
SUPPORTED_ATTENTION = ("sdpa", "eager")
_INITIAL_COLUMNS = 256  # at most this many columns allocated up front (buffers double when full)


@dataclass
class _Slot:
    """One batch row: what its cache holds, what it must feed next, what it has sampled since its last ``add``."""

    key: Hashable
    fed: list[int]  # ids whose keys / values fill columns [0, len(fed)) of this row
    pending: list[int]  # ids to feed at the next step (the prompt, the new tokens, or the last sampled id)
    limit: int = 0
    matcher: StopMatcher | None = None
    running: bool = False
    evictable: bool = False  # its request's ``SamplingParams.evictable``
    sampler: tuple[float, float] = (1.0, 1.0)  # its request's temperature and top_p
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)


class DecodeSession:
    """Rows decoded together, each leaving on its own stop and rejoining with new tokens (see the module doc).

    Made and closed by ``HFEngine`` (its ``submit`` / ``release``); usable as a context manager. All rows draw from
    one random generator (seeded by the session's first request); each ``add`` brings its own temperature, top_p,
    stops and token limit, so a greedy evaluation row decodes beside sampled training rows.
    """

    def __init__(self, engine, seed: int | None):
        self.engine = engine
        self.model = engine.model
        self.device = engine.device
        self.generator = None if seed is None else torch.Generator(self.device).manual_seed(seed)
        config = self.model.config.get_text_config()
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self._kv_shape = (heads, head_dim)
        self._dtype = next(self.model.parameters()).dtype
        self.slots: list[_Slot | None] = []
        self.index: dict[Hashable, int] = {}  # key -> slot
        self.queue: deque[_Slot] = deque()  # rows waiting for a free slot
        self.cache: RaggedCache | None = None
        self.next_logits: torch.Tensor | None = None  # (B, V): each row's next-token logits
        self._text_config = config
        # Decode attention split by width (``ragged_attention``) runs on transformers' sdpa.
        self._ragged = attention_implementation(config) == "sdpa"
        self._row_cost = row_cost_cells(config.num_attention_heads, head_dim)
        self.was_training = self.model.training
        self.model.eval()
        self._threads = torch_threads(engine.num_threads)  # held until close()
        self._threads.__enter__()

    # ---------------------------------------------------------------------------------------------- public API
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Free the cache and restore the model's mode and torch's thread count."""
        self.cache, self.slots, self.index, self.next_logits = None, [], {}, None
        self.model.train(self.was_training)
        self._threads.__exit__(None, None, None)

    @property
    def num_running(self) -> int:
        return sum(1 for s in self.slots if s is not None and s.running) + len(self.queue)

    @property
    def empty(self) -> bool:
        """No row is running, queued or parked."""
        return not self.queue and all(s is None for s in self.slots)

    def drop_cache(self) -> None:
        """After a weight change: release the parked rows; running rows feed all their ids again from column 0."""
        for slot in [s for s in self.slots if s is not None]:
            if not slot.running:
                self.release(slot.key)
            elif slot.fed:
                slot.fed, slot.pending = [], slot.fed + slot.pending

    def add(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        """Start (or continue) row ``key`` from ``ids`` with ``params.stop`` and ``params.max_new_tokens``.

        A parked row whose ids ``ids`` extend keeps its cache and feeds only the new ids; any other ``ids`` (or an
        unknown key) start the row afresh, in a free slot or, when none is free, once one frees up.
        """
        if not ids:
            raise ValueError(f"DecodeSession.add: row {key!r} has no ids; give at least one token id")
        limit = min(params.max_new_tokens, self.engine.context_length - len(ids))
        if limit < 1:
            raise ValueError(f"DecodeSession.add: row {key!r} has {len(ids)} ids, the model's context is "
                             f"{self.engine.context_length}: no room to generate")
        matcher = self.engine._matcher(params.stop) if params.stop else None
        at = self.index.get(key)
        slot = self.slots[at] if at is not None else None
        if (slot is not None and slot.running) or any(q.key == key for q in self.queue):
            raise ValueError(f"DecodeSession.add: row {key!r} is still running")
        if slot is not None and len(ids) > len(slot.fed) and ids[: len(slot.fed)] == slot.fed:
            slot.pending = ids[len(slot.fed) :]
        else:
            if at is not None:
                self.release(key)
            slot = _Slot(key, [], list(ids))
            self.queue.append(slot)
        slot.limit, slot.matcher, slot.running, slot.ids, slot.lps = limit, matcher, True, [], []
        slot.evictable, slot.sampler = params.evictable, (params.temperature, params.top_p)

    def release(self, key: Hashable) -> None:
        """Forget row ``key`` (it has finished): its slot is free for another row."""
        at = self.index.pop(key, None)
        if at is not None:
            self.slots[at] = None
        else:
            self.queue = deque(s for s in self.queue if s.key != key)

    @torch.inference_mode()
    def step(self, max_steps: int = 1) -> list[tuple[Hashable, Sample]]:
        """Decode up to ``max_steps`` tokens per running row; return at the first step where rows finish, with
        ``(key, Sample)`` for each (finish "eos", "stop" or "length"). A finished row is parked until ``add`` or
        ``release``."""
        done: list[tuple[Hashable, Sample]] = []
        for _ in range(max_steps):
            self._admit()
            running = [i for i, s in enumerate(self.slots) if s is not None and s.running]
            if not running:
                break
            self._feed(running)
            done = self._sample(running)
            if done:
                break
        return done

    # ------------------------------------------------------------------------------------------------ internals
    def _admit(self) -> None:
        """Move queued rows into free slots (growing the batch up to the engine's ``max_batch_size``); when no row
        runs and no slot is free, into the slots of parked evictable rows (see ``_evict_parked``)."""
        if not self.queue:
            return
        free = [i for i, s in enumerate(self.slots) if s is None]
        grow = min(len(self.queue) - len(free), self.engine.max_batch_size - len(self.slots))
        if grow > 0:
            longest = max(len(slot.pending) + slot.limit for slot in self.queue)
            self._grow_rows(grow, min(longest, _INITIAL_COLUMNS))
            free += list(range(len(self.slots) - grow, len(self.slots)))
        if not free:
            free = self._evict_parked(len(self.queue))
        for i in free:
            if not self.queue:
                break
            slot = self.queue.popleft()
            self.slots[i], self.index[slot.key] = slot, i

    def _evict_parked(self, wanted: int) -> list[int]:
        """Free up to ``wanted`` slots of parked rows whose request was ``evictable`` (the first ones) when no row
        runs: the slots that queued rows take. Else nothing: a running row will finish and park first.

        Without it a driver that resubmits its rows only once they have all stopped (the tool loop's "rounds" and
        "lockstep" schedules, which mark their requests evictable) waits for ever when it has more rows than
        ``max_batch_size``: the parked rows hold every slot, so the queued ones never start. Other rows keep their
        slots (the "trajectory" schedule resubmits a row the moment its tool result is back). An evicted row's keys /
        values are dropped; when it is submitted again it starts afresh from all its ids (a prefill, as after
        ``reset_cache``).
        """
        if any(s is not None and s.running for s in self.slots):
            return []
        evicted = [i for i, s in enumerate(self.slots) if s is not None and s.evictable][:wanted]
        for i in evicted:
            del self.index[self.slots[i].key]
            self.slots[i] = None
        return evicted

    def _feed(self, running: list[int]) -> None:
        """Run the pending ids of ``running`` rows: several-token rows in one forward over just them, then one
        decode forward for the one-token rows: over the whole batch, or over just them (their keys / values
        gathered, a copy) when they are fewer than half of it."""
        multi = [i for i in running if len(self.slots[i].pending) > 1]
        single = [i for i in running if len(self.slots[i].pending) == 1]
        if multi:
            # Fresh rows with the same prompt (n samples of one question): prefill one, copy its keys / values.
            first: dict[tuple[int, ...], int] = {}
            copies = [(i, first.setdefault(tuple(self.slots[i].pending), i)) for i in multi if not self.slots[i].fed]
            copies = [(i, src) for i, src in copies if src != i]
            copied = {i for i, _ in copies}
            self._forward([i for i in multi if i not in copied], all_rows=False)
            if copies:
                self._copy_rows(copies)
        if single:  # over every slot (no copy) unless most slots would compute a throw-away token
            self._forward(single, all_rows=2 * len(single) >= len(self.slots))

    def _forward(self, fed: list[int], all_rows: bool) -> None:
        """Feed the pending ids of rows ``fed``; with ``all_rows`` the forward covers every slot (the rows not in
        ``fed`` compute one throw-away token at their next free column), else only ``fed``.

        New ids are right-aligned (the last one of every row at the last query, so one logit per row is computed);
        a row's padding queries write to scratch columns past its new ones, which stay unfilled.
        """
        slots = self.slots
        batch_rows = list(range(len(slots))) if all_rows else fed
        is_fed = set(fed)
        news = [slots[i].pending if i in is_fed else [] for i in batch_rows]
        s = max(map(len, news))
        fills = [len(slots[i].fed) if slots[i] is not None else 0 for i in batch_rows]
        width = max(fills) + s
        self.cache.ensure_columns(width)
        plan = None
        if s == 1 and self._ragged:  # decoding: a few much wider rows get their attention apart
            fed_widths = [fill + 1 if i in is_fed else 1 for i, fill in zip(batch_rows, fills)]
            main = split_width(fed_widths, self._row_cost)
            if main is not None:
                plan = self._plan(batch_rows, fed_widths, main)
                width = main
        pad_id = self.engine.pad_id
        ids = torch.tensor([[pad_id] * (s - len(n)) + n for n in news], device=self.device)
        fill = torch.tensor(fills, device=self.device)[:, None]
        rows_t = None if all_rows else torch.tensor(fed, device=self.device)
        # A row's filled columns are always [0, fill): it starts at column 0 and every feed appends at its fill.
        if s == 1:  # decoding: each row writes at its fill column and sees its filled columns and that one
            cols = fill
            mask = (torch.arange(width, device=self.device)[None, :] <= fill)[:, None, None, :]
        else:
            count = torch.tensor(list(map(len, news)), device=self.device)[:, None]
            t = torch.arange(s, device=self.device)[None, :]
            pad = s - count  # queries before this are padding
            cols = torch.where(t >= pad, fill + t - pad, fill + count + t)  # (n, s): the column each query writes
            c = torch.arange(width, device=self.device)[None, None, :]
            # A real query sees its row's columns up to its own (filled, then new); a padding query (whose output is
            # thrown away) sees the row's real columns and its own scratch column.
            mask = ((c <= cols[:, :, None]) & (c < (fill + count)[:, :, None])) | (c == cols[:, :, None])
            mask = mask[:, None]
        # Additive (0 / most negative), for eager attention and for sdpa alike: sdpa's CPU kernel runs a float mask
        # as fast as no mask, a boolean one ~7% slower (measured at 128 rows x 600 columns).
        mask = torch.where(mask, torch.tensor(0.0, dtype=self._dtype, device=self.device),
                           torch.tensor(torch.finfo(self._dtype).min, dtype=self._dtype, device=self.device))
        self.cache.aim(rows_t, cols, width)
        out = decode_forward(self.model, self._text_config, self.cache, plan, input_ids=ids, attention_mask=mask,
                             position_ids=cols)
        logits = out.logits[:, -1].float()
        if self.next_logits is None:
            self.next_logits = logits.new_zeros(len(slots), logits.shape[-1])
        fed_t = torch.tensor(fed, device=self.device)
        if all_rows and len(fed) == len(slots):  # every slot fed (fed is in slot order): no gather
            self.next_logits = logits
        elif all_rows:
            self.next_logits[fed_t] = logits[fed_t]
        else:
            self.next_logits[fed_t] = logits
        for j, i in enumerate(batch_rows):
            if news[j]:
                slots[i].fed += news[j]
                slots[i].pending = []

    def _copy_rows(self, copies: list[tuple[int, int]]) -> None:
        """Give each ``(row, source)`` pair's row the source's fed ids and, in the cache, its filled columns and
        next-token logits."""
        self._copy_cache_rows([i for i, _ in copies], [j for _, j in copies])
        for i, j in copies:
            self.slots[i].fed, self.slots[i].pending = list(self.slots[j].fed), []

    def _copy_cache_rows(self, dst_rows: list[int], src_rows: list[int]) -> None:
        """Copy the filled columns of cache rows ``src_rows`` (keys / values of every layer) and their next-token
        logits into rows ``dst_rows``."""
        dst, src = torch.tensor(dst_rows, device=self.device), torch.tensor(src_rows, device=self.device)
        self.cache.copy_rows(dst, src, max(len(self.slots[j].fed) for j in src_rows))
        if self.next_logits is not None:
            self.next_logits.index_copy_(0, dst, self.next_logits.index_select(0, src))

    def _plan(self, batch_rows: list[int], widths: list[int], main: int) -> RaggedPlan:
        """The rows of a decode forward wider than ``main`` columns (``widths``: each row's columns, its new
        one included), each to be attended apart over its own columns (see ``ragged_attention``)."""
        wide = [(j, batch_rows[j], w) for j, w in enumerate(widths) if w > main]
        return RaggedPlan(rows=torch.tensor([j for j, _, _ in wide], device=self.device), wide=wide, cache=self.cache)

    def _sample(self, running: list[int]) -> list[tuple[Hashable, Sample]]:
        """Sample the next id of every running row; end rows on EOS, a stop string or their limit."""
        logits = (self.next_logits if len(running) == len(self.slots)
                  else self.next_logits[torch.tensor(running, device=self.device)])
        tokens, logps = sample_rows(logits, [self.slots[i].sampler for i in running], self.generator)
        for i, tok, lp in zip(running, tokens.tolist(), logps.tolist()):
            slot = self.slots[i]
            slot.ids.append(tok)
            slot.lps.append(lp)
            slot.pending = [tok]
        done = ended_rows([(i, self.slots[i].ids, self.slots[i].matcher, self.slots[i].limit) for i in running],
                          self.engine.eos_ids)
        out = []
        for i, reason, stop in done:
            slot = self.slots[i]
            slot.running, slot.pending = False, []
            out.append((slot.key, Sample(slot.ids, slot.lps, reason, stop)))
        if done:
            self._compact()
        return out

    def _grow_rows(self, extra: int, columns: int) -> None:
        """Add ``extra`` free slots at the end of the batch (with room for ``columns`` columns in a new cache)."""
        if self.cache is None:
            self.cache = RaggedCache(self.engine.num_layers, extra, self._kv_shape, columns, self._dtype, self.device)
        else:  # the old rows first get the columns the new ones need: every row has the same capacity
            self.cache.ensure_columns(columns)
            self.cache.add_rows(extra)
        if self.next_logits is not None:
            self.next_logits = torch.cat([self.next_logits, self.next_logits.new_zeros(extra, self.next_logits.shape[1])])
        self.slots += [None] * extra

    def _compact(self) -> None:
        """Drop free slots once they are an eighth of the batch (and no queued row could use them): the rows in the
        last slots move into the free ones before them (a copy of those rows' filled columns only), and the buffers
        become views of their first rows. The capacity stays: shrinking it only to grow it again costs two copies."""
        free = [i for i, s in enumerate(self.slots) if s is None]
        if self.queue or len(free) < max(1, len(self.slots) // 8):
            return
        keep = len(self.slots) - len(free)
        holes = [i for i in free if i < keep]
        movers = [i for i in range(keep, len(self.slots)) if self.slots[i] is not None]
        if movers:
            self._copy_cache_rows(holes, movers)
            for hole, mover in zip(holes, movers):
                self.slots[hole] = self.slots[mover]
        self.cache.keep_rows(keep)
        if self.next_logits is not None:
            self.next_logits = self.next_logits[:keep]
        self.slots = self.slots[:keep]
        self.index = {s.key: j for j, s in enumerate(self.slots)}
