"""The rules that judge one scored trajectory by itself, each a pure function with its switch in ``model.filters``,
and their registry by name (``RULES``, the names of ``FilterConfig.trajectory_rules``).

Every rule maps the batch to a (B,) bool tensor: True where the trajectory matches, i.e. leaves the loss. Four are
the paper's public code's "experience filter" (the ZeroTIR code drops a sample when any matches), one is SimpleTIR's:

    overlong_wrong   wrong, and the response reached the token budget or was truncated
    shortcut         correct, but the code blocks opened, closed and answered by an output do not agree in number
    code_mismatch    a valid answer (it stopped, with a last \\boxed{}), the block counts disagree, and at least one
                     execution succeeded (the paper's code: ``not code_exection_all_failed``; none ran counts as all
                     failed there)
    void_repetition  no valid answer, and the repeat score is above ``void_repetition_threshold`` (a repetition loop)
    void_turn        SimpleTIR: a turn that ended with neither a closed code block nor a \\boxed{} answer

"Valid answer" is the reward's own format (``blocks.valid_answer``): the paper's code has ``format_answer`` set for an
invalid answer format and filters void / code-count cases on it that way round. The paper's code also counts a
3-gram repetition penalty in its void rule; here the repeat score alone is used. Length is the response's tokens,
sampled and injected, the quantity the budget ``model.sampling.max_response_tokens`` bounds.

The high-perplexity rule needs the reference model's log-probs, so the RL step applies it
(``FilterDecision.perplexity_threshold``, ``zerotir.rl.perplexity``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

from zerotir.config import FilterConfig, ToolConfig
from zerotir.eval.text_metrics import repeat_score
from zerotir.filters.blocks import Markers, answer_count, block_counts, has_closed_code, turns, valid_answer
from zerotir.types import Trajectories


@dataclass(frozen=True)
class FilterContext:
    """What the rules need besides the trajectories and ``model.filters``: the block markers (``model.tool``) and the
    response budget (``model.sampling.max_response_tokens``)."""

    markers: Markers
    max_response_tokens: int

    @classmethod
    def of(cls, tool: ToolConfig, max_response_tokens: int) -> FilterContext:
        return cls(Markers.of(tool), max_response_tokens)


Rule = Callable[[Trajectories, FilterConfig, FilterContext], Tensor]


def _rows(traj: Trajectories, fn: Callable[[int], bool]) -> Tensor:
    return torch.tensor([bool(fn(i)) for i in range(len(traj))], dtype=torch.bool)


def _truncated(traj: Trajectories) -> list[bool]:
    return traj.truncated.bool().tolist()


def _valid(traj: Trajectories) -> Tensor:
    truncated = _truncated(traj)
    return _rows(traj, lambda i: valid_answer(traj.response_texts[i], truncated[i]))


def _counts_disagree(traj: Trajectories, ctx: FilterContext) -> Tensor:
    return _rows(traj, lambda i: not block_counts(traj.response_texts[i], ctx.markers).agree)


def overlong_wrong(traj: Trajectories, cfg: FilterConfig, ctx: FilterContext) -> Tensor:
    """Wrong, and at the budget (``response_lens >= max_response_tokens``) or truncated."""
    overlong = traj.truncated.cpu().bool() | (traj.response_lens.cpu() >= ctx.max_response_tokens)
    return overlong & ~traj.correct.cpu()


def shortcut(traj: Trajectories, cfg: FilterConfig, ctx: FilterContext) -> Tensor:
    """Correct, and the code blocks opened / closed / output blocks disagree in number."""
    return traj.correct.cpu() & _counts_disagree(traj, ctx)


def code_mismatch(traj: Trajectories, cfg: FilterConfig, ctx: FilterContext) -> Tensor:
    """A valid answer, the block counts disagree, and at least one execution succeeded."""
    failed = traj.num_exec_errors + traj.num_timeouts + traj.num_sandbox_errors + traj.num_tool_errors
    succeeded = (traj.num_calls - failed).cpu() > 0
    return _valid(traj) & _counts_disagree(traj, ctx) & succeeded


def void_repetition(traj: Trajectories, cfg: FilterConfig, ctx: FilterContext) -> Tensor:
    """No valid answer, and a repeat score above ``cfg.void_repetition_threshold``."""
    repeats = _rows(traj, lambda i: repeat_score(traj.response_texts[i]) > cfg.void_repetition_threshold)
    return ~_valid(traj) & repeats


def has_void_turn(text: str, truncated: bool, m: Markers) -> bool:
    """A turn of ``text`` without a closed code block or a ``\\boxed{}`` answer; the last turn of a truncated
    response was cut, not ended, so it does not count."""
    pieces = turns(text, m)
    judged = pieces[:-1] if truncated else pieces
    return any(not has_closed_code(p, m) and answer_count(p) == 0 for p in judged)


def void_turn(traj: Trajectories, cfg: FilterConfig, ctx: FilterContext) -> Tensor:
    """SimpleTIR's void turn: a turn that ended with neither a closed code block nor an answer."""
    truncated = _truncated(traj)
    return _rows(traj, lambda i: has_void_turn(traj.response_texts[i], truncated[i], ctx.markers))


RULES: Mapping[str, Rule] = MappingProxyType({
    "overlong_wrong": overlong_wrong,
    "shortcut": shortcut,
    "code_mismatch": code_mismatch,
    "void_repetition": void_repetition,
    "void_turn": void_turn,
})
