"""What an overlong response does (``model.filters.overlong``), as pure functions of the lengths.

* "mask" (TRL's ``mask_truncated_completions``): a truncated response leaves the loss. A response cut at the budget
  was not finished, so its reward of 0 says nothing about its answer; masking it keeps that noise out of the update
  (and out of its group's baseline, like every removal).
* "soft_penalty" (DAPO's overlong reward shaping): with budget ``L_max`` and buffer ``L_cache``,

      penalty(len) = 0                                           len <= L_max - L_cache
                   = -factor * (len - (L_max - L_cache)) / L_cache   L_max - L_cache < len <= L_max
                   = -factor                                     len > L_max

  added to the reward of each trained trajectory before the advantages, never before the pass-rate decision (which
  reads correctness) and never to the rewards the rollout logs. ``len`` is the response's tokens, sampled and
  injected: the tool loop stops a trajectory when that count reaches ``model.sampling.max_response_tokens``, so
  that is ``L_max``. A trajectory the model's context stopped earlier is penalised by its length like any other.
"""

from __future__ import annotations

import torch
from torch import Tensor

from zerotir.types import Trajectories


def soft_overlong_penalty(lengths: Tensor, budget: int, buffer: int, factor: float) -> Tensor:
    """DAPO's penalty (B,) float for response ``lengths`` (B,): 0 up to ``budget - buffer`` tokens, then falling
    linearly to ``-factor`` at ``budget``, and ``-factor`` beyond. Example: budget 8, buffer 4, factor 1: lengths
    4, 5, 8 give 0, -0.25, -1."""
    if not 0 < buffer < budget:
        raise ValueError(f"overlong_buffer={buffer} with a budget of {budget} tokens: need 0 < buffer < budget")
    excess = lengths.to(torch.float32) - (budget - buffer)
    return (-factor * excess / buffer).clamp(min=-factor, max=0.0)


def truncated_rows(traj: Trajectories) -> Tensor:
    """(B,) bool: the responses cut at the budget, which "mask" removes."""
    return traj.truncated.cpu().bool()
