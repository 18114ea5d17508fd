"""How a batch of trajectories is cut into micro-batches (one forward / backward each), as pure functions of the
rows' lengths: ``micro_batch_size`` rows in batch order, or bins under a token budget
(``model.rl.max_tokens_per_micro_batch``).

A micro-batch is trimmed to its longest row (``TrainBatch.select``), so its cost is ``rows x longest length``: the
padded size. With long-tailed response lengths, fixed-size micro-batches in batch order are mostly padding, and the
longest rows of the batch set the memory peak of every micro-batch. Bins under a token budget make each micro-batch
about the same padded size instead, whatever the lengths.

The binning rule (``token_budget_bins``): rows sorted by length, longest first (ties by row index, so the result is
a function of the lengths alone); each bin takes the next rows in that order while ``rows x its first (longest)
length <= max_tokens``. That is first-fit decreasing for this cost: a bin's longest row is the first placed in it,
so its capacity is fixed when it opens, and a later, shorter row never fits an earlier bin that is already full. A
row longer than the budget is a bin of its own, never truncated. Every row is in exactly one bin; the rows of a bin
are listed in increasing index.

Alignment over ranks: the number of micro-batches differs between ranks (their rows differ), while ZeRO-3's
parameter gathers and the data-parallel gradient reductions need every rank to run the same number of passes. The
caller reduces the count with ``global_max`` (a collective, kept visible in the caller) and ``aligned`` pads the
local list with zero-weight passes that repeat row 0.

The loss does not depend on the partition: ``ppo_update`` weighs each micro-batch's aggregate loss by its share of
the mini-batch's ``loss_units`` (action tokens for token-mean, rows with an action token for the sequence means), and
``aggregate_loss`` of a part times that share is the part's sum divided by the whole's units, which sums over any
partition to the whole's aggregate. Only the order of floating-point additions changes.

Packed rows (``model.rl.pack_rows``, ``zerotir.rl.packing``): each micro-batch becomes one row of its trajectories'
real tokens, so its cost is the sum of its lengths, not rows x longest. The bins follow that cost
(``packed_bins``): first-fit decreasing on the summed length, each row (longest first, ties by index) going into the
first bin it still fits (``sum + length <= max_tokens``), a new bin when none has room, a row longer than the budget
alone. So under a budget a packed micro-batch is one row of at most the budget's tokens (the variable-length flash
path takes one packed row at a time). Without a budget, ``micro_batch_size`` rows in batch order make one packed row.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["aligned", "iter_rows", "micro_batches", "packed_bins", "padded_tokens", "row_lengths",
           "token_budget_bins"]


def row_lengths(attention_mask: Tensor) -> Tensor:
    """(B,) real tokens of each right-padded row: the width ``TrainBatch.select`` trims a micro-batch to."""
    return attention_mask.sum(1).long()


def iter_rows(n: int, size: int) -> list[Tensor]:
    """Index chunks ``[0, size), [size, 2 size), ...`` of ``range(n)``."""
    return [torch.arange(i, min(i + size, n)) for i in range(0, n, size)]


def token_budget_bins(lengths: Tensor, max_tokens: int) -> list[Tensor]:
    """Row indices of ``lengths`` (B,) in bins whose padded size ``rows x longest length`` is at most ``max_tokens``
    (a longer row alone); longest rows first, see the module docstring for the rule."""
    if max_tokens < 1:
        raise ValueError(f"model.rl.max_tokens_per_micro_batch={max_tokens}: must be >= 1")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be (B,), got {tuple(lengths.shape)}")
    values = [max(int(v), 1) for v in lengths.tolist()]  # an empty row still costs a position
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    bins: list[list[int]] = []
    longest = 0
    for i in order:
        if bins and (len(bins[-1]) + 1) * longest <= max_tokens:
            bins[-1].append(i)
        else:
            bins.append([i])
            longest = values[i]
    return [torch.tensor(sorted(rows), dtype=torch.long) for rows in bins]


def packed_bins(lengths: Tensor, max_tokens: int) -> list[Tensor]:
    """Row indices of ``lengths`` (B,) in bins whose summed length is at most ``max_tokens`` (a longer row alone):
    first-fit decreasing, see the module docstring; the bins of packed rows."""
    if max_tokens < 1:
        raise ValueError(f"model.rl.max_tokens_per_micro_batch={max_tokens}: must be >= 1")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be (B,), got {tuple(lengths.shape)}")
    values = [max(int(v), 1) for v in lengths.tolist()]
    bins: list[list[int]] = []
    sums: list[int] = []
    for i in sorted(range(len(values)), key=lambda i: (-values[i], i)):
        fits = next((b for b, total in enumerate(sums) if total + values[i] <= max_tokens), None)
        if fits is None:
            bins.append([i])
            sums.append(values[i])
        else:
            bins[fits].append(i)
            sums[fits] += values[i]
    return [torch.tensor(sorted(rows), dtype=torch.long) for rows in bins]


def micro_batches(lengths: Tensor, micro_batch_size: int, max_tokens: int | None, packed: bool = False
                  ) -> list[Tensor]:
    """The micro-batches of rows with ``lengths``: under ``max_tokens`` (``model.rl.max_tokens_per_micro_batch``)
    ``packed_bins`` when the rows are packed (``model.rl.pack_rows``), else ``token_budget_bins``; or
    ``micro_batch_size`` rows in batch order when it is None."""
    if max_tokens is None:
        return iter_rows(len(lengths), micro_batch_size)
    return packed_bins(lengths, max_tokens) if packed else token_budget_bins(lengths, max_tokens)


def padded_tokens(lengths: Tensor, rows: Tensor) -> int:
    """The padded size of micro-batch ``rows``: ``len(rows) x`` its longest length (what its forward computes)."""
    return len(rows) * int(lengths[rows].max()) if len(rows) else 0


def aligned(chunks: list[Tensor], total: int) -> list[tuple[Tensor, bool]]:
    """``(rows, is_padding)`` for each of ``chunks``, padded to ``total`` entries with repeats of row 0 (padding
    passes must not count). A pure function: ``total`` is the largest chunk count over the ranks, which the caller
    reduces (``global_max``), so that every rank runs the same number of passes."""
    if total < len(chunks):
        raise ValueError(f"aligned: total={total} is below this rank's {len(chunks)} micro-batches")
    return [(rows, False) for rows in chunks] + [(torch.zeros(1, dtype=torch.long), True)] * (total - len(chunks))
