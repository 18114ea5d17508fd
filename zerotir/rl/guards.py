"""Failures that must stop a run loudly: a non-finite loss, a sandbox or a tool that keeps failing, and (raised by
``zerotir.rl.refill.FillWatch``) steps that keep training nothing.

A dead or overloaded sandbox does not crash the rollout: the client reports each failed execution as a sandbox error
and the model sees an error message instead of its output. A tool that raises (a dead MCP server) is the same
kind of fault, recorded as a ``tool_error``. Left alone, either silently turns ZeroTIR into a no-tool run, so
``SandboxErrorGuard`` stops the run once the share of failed calls stays above a threshold for several steps. The
two are counted apart (``Trajectories.num_sandbox_errors``, ``num_tool_errors``), and the message speaks of the
sandbox only for the python tool's sandbox errors and names each other tool that failed with its count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from zerotir.parallel.distributed import fail_together
from zerotir.tools.base import STATUS_TOOL_ERROR
from zerotir.types import Trajectories


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN or inf; the message names the RL step and the batch statistics."""


class SandboxFailureError(RuntimeError):
    """The sandbox service or a tool failed too many calls for too long."""


class EmptyStepsError(RuntimeError):
    """Too many consecutive RL steps trained nothing: the filters kept no prompt group (``model.filters.refill``)."""


def _range(t: Tensor | None, mask: Tensor) -> str:
    if t is None:
        return "-"
    vals = t[mask.bool()] if t.shape == mask.shape else t.flatten()
    if vals.numel() == 0:
        return "empty"
    vals = vals.float()
    return f"[{vals.min().item():.4g}, {vals.max().item():.4g}] (finite {bool(torch.isfinite(vals).all())})"


def check_finite(loss: Tensor, stats: Mapping[str, Tensor], rl_step: int, batch: Any) -> None:
    """Raise ``NonFiniteLossError`` if ``loss`` (or a loss term in ``stats``) is NaN or inf, on every rank.

    A collective under a process group (``ppo_update`` calls it for every micro-batch, on every rank the same number
    of times): a NaN on one rank stops all of them with that rank's message instead of leaving the others waiting in
    the next backward's reduction.

    Args:
        loss: the micro-batch loss about to be back-propagated.
        stats: its named terms (policy_loss, value_loss, ...), reported in the message.
        rl_step: the RL step, named in the message.
        batch: the micro-batch (a ``rl_step.TrainBatch``) whose statistics the message reports.
    """
    with fail_together(NonFiniteLossError):
        _check_finite_here(loss, stats, rl_step, batch)


def _check_finite_here(loss: Tensor, stats: Mapping[str, Tensor], rl_step: int, batch: Any) -> None:
    if bool(torch.isfinite(loss.detach()).all()):
        return
    terms = ", ".join(f"{k}={float(v):.4g}" for k, v in stats.items())
    mask = batch.action_mask
    raise NonFiniteLossError(
        f"RL step {rl_step}: the loss is {float(loss.detach()):.4g} ({terms}). Batch: {len(batch)} trajectories, "
        f"{int(mask.sum())} action tokens; advantages {_range(batch.advantages, mask)}; old log-probs "
        f"{_range(batch.old_logp, mask)}; returns {_range(batch.returns, mask)}; old values "
        f"{_range(batch.old_values, mask)}. Fix: lower lr, keep max_grad_norm set, train in float32/bf16 rather "
        "than float16, or resume from the last checkpoint."
    )


class SandboxErrorGuard:
    """Stop the run when the failure rate (sandbox and tool failures per call) stays above ``max_rate`` for
    ``patience`` steps.

    Args:
        max_rate: the highest tolerated share of calls that the sandbox failed to run or whose tool raised.
        patience: consecutive steps above ``max_rate`` that stop the run.
    """

    def __init__(self, max_rate: float = 0.5, patience: int = 3):
        if not 0.0 <= max_rate <= 1.0:
            raise ValueError(f"model.tool.sandbox.max_error_rate={max_rate}: must lie in [0, 1]")
        if patience < 1:
            raise ValueError(f"model.tool.sandbox.error_patience={patience}: must be >= 1")
        self.max_rate = max_rate
        self.patience = patience
        self.bad_steps = 0

    @staticmethod
    def error_rate(traj: Trajectories) -> float | None:
        """Sandbox and tool failures per call in ``traj``; None when nothing was called."""
        calls = int(traj.num_calls.sum())
        failed = int(traj.num_sandbox_errors.sum()) + int(traj.num_tool_errors.sum())
        return None if calls == 0 else failed / calls

    def update(self, traj: Trajectories, rl_step: int, urls: Sequence[str]) -> float | None:
        """Record one step's rollouts (their python code ran on ``urls``, named in the error); raise
        ``SandboxFailureError`` when the patience is exhausted.

        A step without any call neither counts as bad nor resets the count: it says nothing about the service.
        A collective under a process group: every rank calls it each step with its own rollouts (ranks may use their
        own sandboxes), and when the patience runs out on any rank every rank raises that rank's error.

        Returns:
            This step's failure rate (None without calls).
        """
        with fail_together(SandboxFailureError):
            return self._update_here(traj, rl_step, urls)

    def _update_here(self, traj: Trajectories, rl_step: int, urls: Sequence[str]) -> float | None:
        rate = self.error_rate(traj)
        if rate is None:
            return None
        self.bad_steps = self.bad_steps + 1 if rate > self.max_rate else 0
        if self.bad_steps >= self.patience:
            raise SandboxFailureError(
                f"RL step {rl_step}: {rate:.0%} of the tool calls failed, above model.tool.sandbox.max_error_rate="
                f"{self.max_rate} for {self.bad_steps} consecutive steps (model.tool.sandbox.error_patience={self.patience}). "
                + " ".join(failure_report(traj, urls))
                + " Without working tools the run would silently train without them. Once fixed, resume with "
                "`fit --ckpt_path last`."
            )
        return rate

    def state_dict(self) -> dict[str, int]:
        return {"bad_steps": self.bad_steps}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.bad_steps = int(state.get("bad_steps", 0))


def failure_report(traj: Trajectories, urls: Sequence[str]) -> list[str]:
    """One sentence per kind of failure in ``traj``, each with its count and fix: the python tool's sandbox errors
    (with the sandbox ``urls``), then every tool that raised, by name (from ``traj.tool_calls``)."""
    calls = int(traj.num_calls.sum())
    sandbox, tools = int(traj.num_sandbox_errors.sum()), int(traj.num_tool_errors.sum())
    out = []
    if sandbox:
        out.append(
            f"The python tool's sandbox failed {sandbox} of the step's {calls} calls "
            f"(sandbox URLs: {', '.join(urls)}). "
            "Fix: check that the servers are up (`python -m sandbox serve`, GET /health), or leave "
            "model.tool.sandbox.urls unset for an embedded local sandbox."
        )
    if tools:
        called = Counter(c.tool for row in traj.tool_calls for c in row)
        failed = Counter(c.tool for row in traj.tool_calls for c in row if c.status == STATUS_TOOL_ERROR)
        named = ", ".join(f"`{tool}` {n} of its {called[tool]} calls" for tool, n in sorted(failed.items()))
        out.append(
            f"{tools} of the step's {calls} calls failed in their tool (status tool_error: the tool raised)"
            + (f": {named}." if named else ".")
            + " Fix: check each named tool's setup in model.tool.tools (an MCP server that exits or does not "
            "start, a missing corpus); the failed calls' observations in the rollout dumps give the error."
        )
    return out
