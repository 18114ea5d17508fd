"""Masked statistics of per-token tensors and per-group statistics of per-trajectory ones: the reductions every RL
estimator in ``zerotir.rl.algorithms`` is built from. Pure tensor functions (no Lightning, no distributed import:
a data-parallel reduction is passed in as ``all_reduce``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _check_shape(name: str, tensor: Tensor, like_name: str, like: Tensor) -> None:
    if tensor.shape != like.shape:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)} but {like_name} has shape {tuple(like.shape)}; "
            f"per-token tensors must all be (B, T) and aligned with input_ids"
        )


def _bool_mask(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


# ---- Masked statistics -----------------------------------------------------------------------------------------------


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over the entries where ``mask`` is nonzero.

    Masked-out entries are replaced by 0 rather than multiplied by 0, so a NaN or inf there cannot leak in.

    Args:
        x: values, any shape.
        mask: same shape as ``x``; nonzero = counted.
        dim: reduce over this dimension only; ``None`` reduces over everything.
    """
    _check_shape("mask", mask, "x", x)
    kept = torch.where(_bool_mask(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the entries where ``mask`` is nonzero; 0 (never NaN) when the mask is empty.

    Args:
        x: values, any shape.
        mask: same shape as ``x``; nonzero = counted.
        dim: reduce over this dimension only (an empty row gives 0); ``None`` reduces over everything.
    """
    count = masked_sum(torch.ones_like(x), mask, dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_mean_var(x: Tensor, mask: Tensor, unbiased: bool = True,
                    all_reduce: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Mean and variance of the masked entries of ``x``, and their count; over all data-parallel ranks when
    ``all_reduce`` is given.

    Two passes (sum and count -> mean; then the sum of squared deviations -> variance) in float64: the one-pass
    ``sum(x^2) - n * mean^2`` loses digits when the mean is large compared with the spread. Without gradient.

    Args:
        x: values, any shape (each rank may have its own shape, e.g. its own padded T).
        mask: same shape as ``x``; nonzero = counted.
        unbiased: Bessel's correction (divide by count - 1). With fewer than 2 entries (unbiased) or none (biased)
            the variance is undefined and 0 is returned, so whitening leaves such a batch at 0 instead of NaN.
        all_reduce: sums a small float64 vector over the ranks (``zerotir.parallel.distributed.all_reduce_sum``);
            None = this tensor only.

    Returns:
        ``(mean, var, count)``: 0-dim tensors in ``x``'s dtype and device (count in float64).
    """
    _check_shape("mask", mask, "x", x)
    reduce = all_reduce or (lambda v: v)
    m = _bool_mask(mask)
    x64 = x.detach().to(torch.float64)
    zeros = torch.zeros_like(x64)
    first = reduce(torch.stack([torch.where(m, x64, zeros).sum(), m.sum().to(torch.float64)]))
    total, count = first[0], first[1]
    mean = total / count.clamp(min=1)
    sq = reduce(torch.where(m, (x64 - mean) ** 2, zeros).sum().reshape(1))[0]
    denom = count - 1 if unbiased else count
    var = torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))
    return mean.to(x.dtype), var.to(x.dtype), count


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over the masked entries (whole tensor); see ``masked_mean_var``."""
    return masked_mean_var(x, mask, unbiased)[1]


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8,
                  all_reduce: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """Normalise the masked entries of ``x`` to mean 0 and variance 1 (unbiased), over the whole tensor, or over the
    whole data-parallel batch with ``all_reduce`` (each rank whitens its own entries with the global statistics;
    the concatenated result equals one process whitening the concatenated batch).

    Args:
        x: values, any shape.
        mask: same shape as ``x``.
        shift_mean: if False, the mean is added back (only the scale changes).
        eps: added to the variance before the square root.
        all_reduce: see ``masked_mean_var``.

    Returns:
        The whitened values where ``mask`` is nonzero and 0 elsewhere.
    """
    mean, var, _ = masked_mean_var(x, mask, all_reduce=all_reduce)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_bool_mask(mask), whitened, torch.zeros_like(whitened))


# ---- Groups of samples of one prompt ------------------------------------------------------------------------------


def group_stats(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row statistics of each row's prompt group, in float64: ``(mean, count, inverse)``.

    ``mean[i]`` and ``count[i]`` are the mean of ``values`` and the size of row i's group; ``inverse`` is the
    group index (0..G-1) of each row. Float64 so that a bound written as a decimal (0.25) compares exactly with
    k / n. Shared by GRPO's baseline and the pass-rate filter.

    Args:
        values: (B,) per-trajectory values (rewards).
        group_ids: (B,) prompt index of each trajectory (any integers; groups need not be contiguous).
    """
    if values.dim() != 1 or group_ids.shape != values.shape:
        raise ValueError(
            f"rewards and group_ids must both be (B,), got {tuple(values.shape)} and {tuple(group_ids.shape)}"
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    v = values.to(torch.float64)
    counts = torch.zeros(num_groups, dtype=torch.float64, device=v.device).index_add_(0, inverse, torch.ones_like(v))
    sums = torch.zeros_like(counts).index_add_(0, inverse, v)
    return (sums / counts)[inverse], counts[inverse], inverse
