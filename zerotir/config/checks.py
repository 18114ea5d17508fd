"""The checks every configuration group shares, and a group as a plain dict."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, get_args


def check_choice(group: str, name: str, value: Any, kind: Any) -> None:
    """``model.<group>.<name>`` must be one of the Literal ``kind``'s values."""
    choices = get_args(kind)
    if value not in choices:
        raise ValueError(f"model.{group}.{name}={value!r}: choose one of {choices}")


def check_min(group: str, obj: Any, names: tuple[str, ...], low: float, what: str = "") -> None:
    """Each of ``names`` of ``obj`` (None allowed) must be >= ``low``; ``what`` says why, after the message."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < low:
            raise ValueError(f"model.{group}.{name}={value}: must be >= {low}{what}")


def check_sampling(where: str, n: int, temperature: float, top_p: float, max_tokens: tuple[str, int]) -> None:
    """The one check of sampling settings, shared by ``SamplingConfig`` and the engines' ``SamplingParams``.

    Args:
        where: how the caller names the object in a message (``model.sampling``, ``params[2]``).
        max_tokens: (field name, value) of the token budget.
    """
    if n < 1:
        raise ValueError(f"{where}.n={n}: must be >= 1")
    if temperature < 0:
        raise ValueError(f"{where}.temperature={temperature}: must be >= 0 (0 = greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"{where}.top_p={top_p}: must be in (0, 1]")
    if max_tokens[1] < 1:
        raise ValueError(f"{where}.{max_tokens[0]}={max_tokens[1]}: must be >= 1")


def as_plain(group: Any) -> dict[str, Any]:
    """A group as a plain dict (for reports and hyperparameter logs)."""
    return {f.name: getattr(group, f.name) for f in fields(group)}
