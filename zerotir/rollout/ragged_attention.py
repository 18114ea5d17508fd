"""Decode attention over rows of very different widths, without padding every row to the widest one.

In a ``DecodeSession`` each row attends to its own filled columns, but one attention call over the batch reads
rows x the widest row's columns. In a tool loop rows differ much in width: the ones that got a long tool output (a
traceback echoing a long line, a big printed number) are hundreds of columns ahead of the others for the rest of
their lives. On a CPU, decode attention is bound by reading keys / values, so every padded column costs as much as
a real one. Measured on the overhead benchmark (tiny model, real sandbox): two thirds of the columns decode
attention read were real; with instant tool outputs, nine tenths.

The fix splits only the attention, not the forward (a second forward through the whole model costs more than the
padding it saves on a small model): the batch's attention reads the first ``width`` columns, the *main* width, and
each wider row gets its attention again over exactly its own columns (a view of its row of the cache: no copy, no
mask), overwriting its row of the output. ``split_width`` picks the main width that minimises the cost.

This module holds the cost model and the plan; the split itself runs in ``hf_adapter.ragged_sdpa_attention``, an
attention function registered with transformers that the session selects for the forwards it plans (it calls
transformers' own sdpa attention for every part, so the numbers are sdpa's: GQA, scaling and masks included).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# One row's own attention call costs ~14 us; one cell (row x column) of batched decode attention ~0.00026 us per
# query head x head dimension (fp32, torch's sdpa on cache views; 2 CPU cores, head sizes 64 to 128).
ROW_CALL_US = 14.0
CELL_US_PER_HEAD_DIM = 0.00026


def row_cost_cells(heads: int, head_dim: int) -> int:
    """The fixed cost of one row's own attention call, in cells of the batch's attention, for a model with
    ``heads`` query heads of ``head_dim``: ~840 for 4 x 16, ~420 for 4 x 32."""
    return max(1, round(ROW_CALL_US / (CELL_US_PER_HEAD_DIM * heads * head_dim)))


def split_width(widths: list[int], row_cost: int) -> int | None:
    """The main width for rows needing ``widths`` columns, or None when reading every row at the widest is cheaper.

    Cost of main width ``m``: ``len(widths) * m`` cells, plus, for every row wider than ``m``, its own width and
    ``row_cost`` (its own attention call). Candidate main widths are the rows' own widths.
    """
    n = len(widths)
    if n < 2:
        return None
    ordered = sorted(widths, reverse=True)
    best_cost, best = n * ordered[0], None
    apart = 0
    for k in range(1, n):  # the k widest rows apart; the main width is the (k+1)-th widest
        apart += ordered[k - 1] + row_cost
        if apart >= best_cost:
            break
        cost = n * ordered[k] + apart
        if cost < best_cost:
            best_cost, best = cost, ordered[k]
    return best


@dataclass
class RaggedPlan:
    """The wide rows of one decode forward, each attended apart over its own columns.

    Attributes:
        rows: ``(k,)`` positions of the wide rows in the forward's batch.
        wide: ``(position in the batch, row of the cache buffers, columns)`` of each wide row.
        cache: the session's ``hf_adapter.RaggedCache``; ``cache.row_columns`` gives a row's keys / values.
    """

    rows: torch.Tensor
    wide: list[tuple[int, int, int]]
    cache: object  # hf_adapter.RaggedCache (not imported: the adapter imports this module)
