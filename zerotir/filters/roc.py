"""Correct-with-errors downsampling (``model.filters.roc``), after GRPO-RoC ("Resample-on-Correct", rStar2-Agent,
arXiv 2508.20722), as pure functions.

rStar2-Agent samples 2G trajectories per prompt and keeps G: the failed ones downsampled uniformly, the correct
ones chosen with preference for the fewest tool errors and the cleanest answer format, so that a correct answer
reached through crashing code is not reinforced like a clean one. Its penalty of a correct trajectory is

    p = p_err + p_format,  p_err = failed calls / calls (0.5 when it made no call),
                           p_format = min(1, (answers - 1) / turns)   (1 without a valid answer)

What is implemented here, without oversampling (a step samples ``model.sampling.n`` per prompt and only drops):
in each prompt group, among the trajectories still kept, every failed one stays (each is a distinct failure mode,
the negative signal GRPO-RoC keeps diverse) and so does every clean correct one (p = 0); the correct ones are ranked
by p, lowest first, ties in an order drawn from the step's seed, and kept up to
``max(clean, ceil(roc_correct_keep x correct))``. With the default 0.5 a group keeps half its correct trajectories,
as 2G -> G does, unless more of them are clean. Failed calls are those that raised, timed out or that the sandbox
could not run; an answer is a ``\\boxed`` of the response, a turn what the model wrote between two outputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from zerotir.filters.blocks import Markers, answer_count, turns, valid_answer
from zerotir.types import Trajectories

NO_CALL_PENALTY = 0.5  # rStar2-Agent's p_err of a response that called no tool


def roc_penalty(traj: Trajectories, markers: Markers) -> Tensor:
    """(B,) float64: p_err + p_format of each trajectory (see the module doc)."""
    failed = (traj.num_exec_errors + traj.num_timeouts + traj.num_sandbox_errors + traj.num_tool_errors).tolist()
    calls = traj.num_calls.tolist()
    truncated = traj.truncated.bool().tolist()
    out = []
    for i, text in enumerate(traj.response_texts):
        p_err = failed[i] / calls[i] if calls[i] else NO_CALL_PENALTY
        if valid_answer(text, truncated[i]):
            p_format = min(1.0, (answer_count(text) - 1) / len(turns(text, markers)))
        else:
            p_format = 1.0
        out.append(p_err + p_format)
    return torch.tensor(out, dtype=torch.float64)


def roc_dropped(keep: Tensor, correct: Tensor, group_ids: Tensor, penalty: Tensor, keep_fraction: float,
                generator: torch.Generator) -> Tensor:
    """(B,) bool: the kept correct trajectories that downsampling drops (see the module doc).

    Args:
        keep: (B,) bool, the trajectories still kept; only these are ranked and counted.
        correct: (B,) bool.
        group_ids: (B,) the prompt of each trajectory (groups are whole on a rank).
        penalty: (B,) ``roc_penalty``.
        keep_fraction: ``model.filters.roc_correct_keep``.
        generator: draws the order among equal penalties (seeded by the step: the same batch, the same rows).
    """
    order = torch.randperm(len(keep), generator=generator).tolist()
    candidates = (keep & correct).tolist()
    groups, values = group_ids.tolist(), penalty.tolist()
    dropped = [False] * len(keep)
    for g in sorted(set(groups)):
        rows = [i for i in range(len(keep)) if groups[i] == g and candidates[i]]
        clean = sum(values[i] == 0 for i in rows)
        quota = max(clean, math.ceil(round(keep_fraction * len(rows), 9)))
        for i in sorted(rows, key=lambda i: (values[i], order[i]))[quota:]:
            dropped[i] = True
    return torch.tensor(dropped, dtype=torch.bool)
