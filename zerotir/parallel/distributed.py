"""Cross-rank statistics for data-parallel RL steps: the same numbers as one process on the whole batch.

In a multi-GPU / multi-node run every rank rolls out its own share of the prompts (all ``n`` samples of a prompt on
the same rank, see ``shard_prompts``; with tensor-parallel vLLM engines the ranks of an engine share its prompts and
``training_share`` splits the resulting trajectories between them), so per-group quantities (GRPO baselines,
pass-rate keep masks) stay local.
Quantities defined over the *whole* batch need reductions:

    * REINFORCE++ whitens the returns over every action token of the global batch, and PPO optionally its advantages
      -> ``zerotir.rl.algorithms.masked_whiten(..., all_reduce=all_reduce_sum)``;
    * the pass-rate filter's kept fraction and the decision to skip an update -> ``global_group_counts`` /
      ``global_kept_fraction``;
    * logged means (reward, accuracy, ...) -> ``global_mean``; token counts and micro-batch counts that must agree
      across ranks (ZeRO-3 gathers parameters collectively, so every rank must run the same number of forward and
      backward passes) -> ``global_sum`` / ``global_max``.

Errors: a check that fails on one rank must stop every rank, or the others wait forever in their next collective.
``fail_together`` runs a check on every rank and, when it raised on any of them, raises the same error (type and
message, from the lowest failing rank) on all of them.

Every function falls back to the local computation when ``torch.distributed`` is not initialised or the world has one
rank, so the CPU path and the tests need no process group. Reductions run in float64 on the device the process group
wants (CUDA for NCCL, CPU otherwise) and the result comes back on the input's device.

"""

from __future__ import annotations

import contextlib
import logging
import pickle
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

T = TypeVar("T")
log = logging.getLogger(__name__)


def is_distributed() -> bool:
    """True when a process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group; ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _reduce_device() -> torch.device:
    # NCCL reduces CUDA tensors only; gloo (CPU runs, tests) reduces CPU tensors.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: Tensor) -> Tensor:
    """Sum a small float64 vector over all ranks (a copy; the input itself without a process group). The
    ``all_reduce`` of ``zerotir.rl.algorithms.masked_whiten`` / ``masked_mean_var``."""
    return _all_reduce(values)


def _all_reduce(values: Tensor, op: Any = None) -> Tensor:
    """All-reduce (``op``, default SUM) a small float64 vector when distributed (on a copy); else return it."""
    if not is_distributed():
        return values
    buf = values.detach().to(_reduce_device(), torch.float64, copy=True)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM if op is None else op)
    return buf.to(values.device)


def global_sum(value: float | int | Tensor) -> float:
    """Sum of a scalar over all ranks (e.g. action tokens of a mini-batch, trajectories kept by the filter)."""
    local = torch.as_tensor(value, dtype=torch.float64).reshape(1)
    return float(_all_reduce(local)[0])


def global_max(value: float | int) -> float:
    """Maximum of a scalar over all ranks (e.g. the number of micro-batches every rank must run under ZeRO-3)."""
    local = torch.as_tensor(value, dtype=torch.float64).reshape(1)
    return float(_all_reduce(local, dist.ReduceOp.MAX)[0])


def global_mean(values: Tensor | Sequence[float]) -> float:
    """Mean of all elements of ``values`` over all ranks, each element weighted equally (not each rank).

    Ranks may hold different numbers of elements (after filtering). Returns 0.0 when no rank holds any element,
    as ``zerotir.rl.algorithms.masked_mean`` does for an empty mask.
    """
    x = torch.as_tensor(values, dtype=torch.float64).detach().flatten().cpu()
    sums = _all_reduce(torch.stack([x.sum(), torch.tensor(float(x.numel()), dtype=torch.float64)]))
    return float(sums[0] / sums[1].clamp(min=1))


def gather_objects(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` without a process group.

    For small things only (per-rank statistics, sample texts for logging): it pickles through the process group.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def global_group_counts(keep_mask: Tensor, group_ids: Tensor) -> tuple[int, int]:
    """``(kept_groups, groups)`` summed over all ranks.

    Each rank holds whole prompt groups (``shard_prompts``), so its group ids need not be unique across ranks:
    groups are counted per rank and the counts are added.

    Args:
        keep_mask: (B,) bool, the rank's trajectories kept by the pass-rate filter.
        group_ids: (B,) prompt index of each trajectory on this rank.
    """
    if keep_mask.dim() != 1 or group_ids.shape != keep_mask.shape:
        raise ValueError(f"keep_mask and group_ids must both be (B,), got {tuple(keep_mask.shape)} and "
                         f"{tuple(group_ids.shape)}")
    if keep_mask.dtype != torch.bool:
        raise ValueError(f"keep_mask must be a bool tensor (from pass_rate_keep_mask), got {keep_mask.dtype}")
    groups = torch.unique(group_ids).numel()
    kept = torch.unique(group_ids[keep_mask]).numel()
    counts = _all_reduce(torch.tensor([float(kept), float(groups)], dtype=torch.float64))
    return int(counts[0]), int(counts[1])


def global_kept_fraction(keep_mask: Tensor, group_ids: Tensor) -> float:
    """Share of prompt groups kept by the pass-rate filter over the whole batch (all ranks); 1.0 for no groups.

    Same definition as ``PassRateFilter.last_kept_fraction`` (kept groups / groups), but global.
    """
    kept, groups = global_group_counts(keep_mask, group_ids)
    return kept / groups if groups else 1.0


def shard_prompts(rows: Sequence[T], rank: int, world_size: int, tensor_parallel_size: int = 1) -> list[T]:
    """This rank's contiguous share of a step's prompts (all of a prompt's samples are then rolled out here).

    Every rank reads the same global batch of ``P`` prompts (its rollout source). With one engine per rank
    (``tensor_parallel_size=1``) rank ``r`` takes rows ``[r * P / W, (r + 1) * P / W)``. With tensor-parallel engines
    the ``W / tp`` engines split the batch and every rank of an engine's group (ranks ``g * tp .. g * tp + tp - 1``)
    gets the group's share, since all of them must submit the same requests; ``training_share`` then splits the
    group's trajectories between them for the update. Shares must be equal: equal work keeps the ranks' rollouts
    and updates (and their collective calls) in step.

    Raises:
        ValueError: a rank outside ``[0, world_size)``, ``tensor_parallel_size`` not dividing ``world_size``, or
            ``P`` not a multiple of the number of engines.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank}, world_size={world_size}: need world_size >= 1 and 0 <= rank < world_size")
    if tensor_parallel_size < 1 or world_size % tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size} must divide the world size {world_size} "
                         f"(model.rollout.init_args.tensor_parallel_size vs trainer.devices x trainer.num_nodes)")
    engines = world_size // tensor_parallel_size
    if len(rows) % engines:
        raise ValueError(
            f"{len(rows)} prompts per step cannot be split evenly over {engines} rollout engines; set "
            f"data.prompts_per_step to a multiple of devices x num_nodes / tensor_parallel_size = {engines}"
        )
    share, group = len(rows) // engines, rank // tensor_parallel_size
    return list(rows[group * share:(group + 1) * share])


def training_share(group_ids: Tensor, rank: int, tensor_parallel_size: int = 1) -> Tensor:
    """Which of a tensor-parallel group's trajectories this rank trains on: a (B,) bool mask of whole prompt groups.

    The ranks of a TP group hold identical trajectories (they rolled out the same prompts together). Training on
    all of them on every rank would count each trajectory ``tp`` times in the data-parallel update and in every
    global statistic, so rank ``r`` keeps the prompt groups whose position among the sorted group ids is
    ``r % tp`` modulo ``tp``. Apply it before filtering and advantages. With ``tp = 1`` everything is kept.
    """
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size}: must be >= 1")
    if tensor_parallel_size == 1:
        return torch.ones(group_ids.shape, dtype=torch.bool, device=group_ids.device)
    _, position = torch.unique(group_ids, return_inverse=True)
    return position % tensor_parallel_size == rank % tensor_parallel_size


@contextlib.contextmanager
def fail_together(*kinds: type[BaseException]) -> Iterator[None]:
    """Run the block on every rank; if it raised one of ``kinds`` on any rank, raise that error on every rank.

    A collective: every rank must enter the block at the same point (one small all-reduce when nothing failed, an
    object gather when something did). The error raised everywhere is the one of the lowest failing rank, with its
    type and message (pickled; an exception that cannot be pickled travels as a ``RuntimeError`` naming its type), so
    every rank stops with the same message; a failing rank chains its own error to it. Other exceptions are not
    caught. Without a process group the block's error is simply raised.

    Example: ``with fail_together(SandboxFailureError): guard.update(traj, step)``.
    """
    error: BaseException | None = None
    try:
        yield
    except kinds as exc:
        error = exc
    raise_together(error)


def raise_together(error: BaseException | None) -> None:
    """Collective: ``error`` is this rank's failure or None; raise the lowest failing rank's error on every rank."""
    if not is_distributed():
        if error is not None:
            raise error
        return
    if global_max(0.0 if error is None else 1.0) == 0:
        return
    reports = gather_objects(None if error is None else _portable(error))
    rank = dist.get_rank()
    first = next(r for r, report in enumerate(reports) if report is not None)
    log.error("rank %d stops: rank %d raised %s", rank, first, reports[first][1])
    if first == rank:
        raise error
    raise pickle.loads(reports[first][0]) from error


def _portable(error: BaseException) -> tuple[bytes, str]:
    """``(pickled error, 'Type: message')``; an unpicklable error is replaced by a RuntimeError saying what it was."""
    text = f"{type(error).__name__}: {error}"
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
    except Exception:  # noqa: BLE001 (any pickling failure: send the text instead)
        data = pickle.dumps(RuntimeError(text))
    return data, text
