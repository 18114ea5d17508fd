"""The records of the tool loop: a trajectory being built (``Row``), its mode (``Mode``) and its response
(``Response``: the ids with, per id, what the loss needs).

``agent_loop`` moves the state machine; ``trajectories`` turns finished rows into the ``Trajectories`` batch. Both
read a row only through these types, so a mode is never a free string and the per-token values of a response
never get out of step with its ids.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from zerotir.tools.formats import CallFormat
from zerotir.types import ToolCall

__all__ = ["UNSTAMPED", "Mode", "Response", "Row", "stops"]

UNSTAMPED = -1  # the version of an id no engine stamped: injected ids, or a sample without a version


class Mode(enum.Enum):
    """What a trajectory is generating, which decides the stop strings of its next segment (the module doc of
    ``agent_loop``)."""

    TEXT = "text"  # prose: stops on the format's ``call_start``, which opens a call
    CALL = "call"  # inside a call: stops on ``call_end``, whose call then goes to its tool
    FINAL = "final"  # the call budget is spent: no call stop at all, the model finishes in text


def stops(mode: Mode, fmt: CallFormat, extra: Sequence[str]) -> list[str]:
    """The stop strings of a segment in ``mode``: its own marker first, then the caller's ``extra`` ones."""
    if mode is Mode.TEXT:
        own = [fmt.call_start]
    elif mode is Mode.CALL:
        own = [fmt.call_end]
    else:
        own = []
    return own + [s for s in extra if s not in own]


class Response:
    """A trajectory's response ids (sampled and injected, in order) and, per id, whether the policy sampled it, its
    engine log-prob (0 where injected) and the weight version that sampled it (``UNSTAMPED`` where none did).

    The four sequences grow only through ``append_sampled`` (one engine segment) and ``append_injected`` (one
    output block), and shrink only through ``truncate``, so they always have one entry per id. The properties give
    the stored lists themselves (no copy: the engine is resubmitted with ``ids`` after every segment); read them,
    never change them.
    """

    __slots__ = ("_ids", "_sampled", "_logprobs", "_versions")

    def __init__(self) -> None:
        self._ids: list[int] = []
        self._sampled: list[bool] = []
        self._logprobs: list[float] = []
        self._versions: list[int] = []

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> list[int]:
        """The token ids: the response part of the trajectory's context."""
        return self._ids

    @property
    def sampled(self) -> Sequence[bool]:
        """Per id: True when the policy sampled it (the action mask), False when the loop injected it."""
        return self._sampled

    @property
    def logprobs(self) -> Sequence[float]:
        """Per id: the engine's log-prob of a sampled id, 0.0 for an injected one."""
        return self._logprobs

    @property
    def versions(self) -> Sequence[int]:
        """Per id: the weight version that sampled it, ``UNSTAMPED`` for an injected or unstamped one."""
        return self._versions

    def append_sampled(self, ids: Sequence[int], logprobs: Sequence[float], version: int | None) -> None:
        """Append one engine segment: its ids, one log-prob each, all stamped with ``version`` (None: unstamped).

        Raises:
            ValueError: when ``logprobs`` does not hold exactly one value per id.
        """
        if len(logprobs) != len(ids):
            raise ValueError(f"Response.append_sampled: {len(ids)} ids and {len(logprobs)} log-probs; the engine "
                             "must return one log-prob per sampled id")
        self._ids += ids
        self._sampled += [True] * len(ids)
        self._logprobs += logprobs
        self._versions += [UNSTAMPED if version is None else version] * len(ids)

    def append_injected(self, ids: Sequence[int]) -> None:
        """Append ids the loop wrote (an output block): not sampled, log-prob 0, unstamped."""
        self._ids += ids
        self._sampled += [False] * len(ids)
        self._logprobs += [0.0] * len(ids)
        self._versions += [UNSTAMPED] * len(ids)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` ids (and their values); the rest are dropped as if never drawn."""
        del self._ids[length:], self._sampled[length:], self._logprobs[length:], self._versions[length:]


@dataclass
class Row:
    """One trajectory being built."""

    group: int
    prompt: list[int]
    mode: Mode
    head: str | None = None  # code already in the prompt, when the prompt ends inside an open block
    mode_start: int = 0  # response index where the current mode began
    block_from: int = 0  # response index from which the decoded text holds the current block's opening
    response: Response = field(default_factory=Response)
    call_text: str | None = None  # the call extracted from the last segment, to send to its tool
    tail: str = ""  # text the closing fence's token held after the fence (tool_block.injection_text)
    running: str = ""  # the call in flight (recorded with its observation in tool_calls)
    pending: asyncio.Future | None = None  # the tool call of this trajectory, in flight
    in_engine: bool = False  # submitted and not yet returned by the engine
    limit: int = 0  # max_new_tokens of the last submission
    segments: int = 0  # submissions so far
    calls: int = 0
    exec_errors: int = 0
    timeouts: int = 0
    sandbox_errors: int = 0
    tool_errors: int = 0
    finish: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
