"""The one scoring path of every rollout source: a batch's trajectories scored by the ``model.reward`` plug-in
(its protocol, ``Reward`` / ``Sample`` / ``Score``, is ``zerotir.rewards.protocol``).

``score_trajectories`` is the only place a reward is applied: the in-line source, the thread host and the fleet
all call it on the trainer once a batch's trajectories are back (rewards never cross to an engine host), and each
starts it early (``EarlyScores``: each trajectory scored as it ends, or each prompt group as it comes back from an
engine, while the others generate). It lives here, beside the sources, because it runs on the rollout's event loop
(``sync``); the rewards know nothing of the rollout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch

from zerotir.rewards.protocol import Reward, Sample, Score
from zerotir.rollout.sync import run_sync, thread_loop
from zerotir.types import PromptRow, Trajectories

T = TypeVar("T")
_ROW_TEXT_KEYS = ("problem", "answer", "prompt_ids")  # the row keys a Sample holds as fields, not metadata


def samples_of(traj: Trajectories, rows: Sequence[PromptRow]) -> list[Sample]:
    """The samples of ``traj``, trajectory ``i`` with prompt row ``rows[traj.group_ids[i]]``."""
    groups = traj.group_ids.tolist()
    if groups and max(groups) >= len(rows):
        raise ValueError(f"score_trajectories: group id {max(groups)} but only {len(rows)} prompt rows")
    calls = traj.tool_calls or [[] for _ in groups]
    out = []
    for i, group in enumerate(groups):
        row = rows[group]
        meta = {k: v for k, v in row.items() if k not in _ROW_TEXT_KEYS}
        out.append(Sample(row["problem"], row["answer"], traj.response_texts[i], bool(traj.truncated[i]),
                          tuple(calls[i]), meta))
    return out


def score_trajectories(reward: Reward | None, traj: Trajectories, rows: Sequence[PromptRow],
                       early: EarlyScores | None = None) -> float:
    """Fill ``traj.rewards`` and ``traj.corrects`` with ``reward``'s scores of ``traj`` (prompt rows ``rows``,
    indexed by its group ids), those ``early`` took while the batch generated first; the seconds it waited (0
    without a reward: rewards stay 0)."""
    if reward is None:
        return 0.0
    start = time.perf_counter()
    if early is not None:
        scores = run_sync(early.rest(traj, rows), "score_trajectories")
    else:
        samples = samples_of(traj, rows)
        scores = _checked(reward, run_sync(reward.score(samples), "score_trajectories"), len(samples)) \
            if samples else []
    traj.rewards = torch.tensor([s.score for s in scores], dtype=torch.float32)
    traj.corrects = torch.tensor([bool(s.correct) for s in scores], dtype=torch.bool)
    traj.reward_failed = torch.tensor([bool(s.infra_failed) for s in scores], dtype=torch.bool)
    return time.perf_counter() - start


class EarlyScores:
    """Scores a batch's trajectories as they end, while the others still generate (a slow reward such as the judge
    overlaps generation instead of waiting after the batch); ``score_trajectories`` takes what it scored and scores
    the rest. Every source uses it, on the trainer (rewards never cross to an engine host).

    The in-line source: the tool loop calls ``finished`` on its event loop as each trajectory ends
    (``rollout(on_end=...)``), keyed by its index in the batch. The fleet and the thread host: the schedule hands
    over each prompt group as it comes back from an engine (``ended``), keyed by its row's place in the stream, and
    waits for the next through ``wait``, so that the scoring goes on meanwhile on the trainer's event loop
    (``sync.thread_loop``); one ``EarlyScores`` serves every batch of the run, as a group may end long before the
    step that trains it.

    A reward that takes concurrent calls (``Reward.concurrent_calls``: the judge, whose ``max_concurrency`` bounds
    all its calls together) gets a call per trajectory or group as it ends, side by side, so its bound stays full;
    any other gets one call at a time, over everything that ended since the previous one.

    Args:
        reward: the ``model.reward`` plug-in (None: nothing is scored).
        rows: the batch's prompt rows (the in-line source; trajectories keyed by their index in the batch); None:
            the stream's groups (``ended``; trajectories keyed by ``stream_keys``).
        tokenizer: the tokenizer of the rollout (``finished`` decodes a trajectory as the batch's does).
    """

    def __init__(self, reward: Reward | None, rows: Sequence[PromptRow] | None = None, tokenizer: Any = None):
        self.reward, self.rows, self.tokenizer = reward, rows, tokenizer
        self.scores: dict[Hashable, Score] = {}
        self._queue: list[tuple[Hashable, int, Sample]] = []  # (key, the key's hand-over count, sample)
        self._latest: dict[Hashable, int] = {}  # per key, its last hand-over: an earlier one's score is stale
        self._tasks: list[asyncio.Future] = []

    def finished(self, key: int, row: Any) -> None:
        """Trajectory ``key`` of the batch (a ``rows.Row``) has ended: score it."""
        from zerotir.rollout.trajectories import to_trajectories

        if self.reward is not None:
            one = to_trajectories([row], self.tokenizer, [r["answer"] for r in self.rows])
            self.add([(key, samples_of(one, self.rows)[0])])

    def ended(self, row: PromptRow, group: Trajectories) -> None:
        """The prompt group of stream row ``row`` (its trajectories, group id 0) came back from an engine: score
        each trajectory under its ``stream_keys`` key (a group generated again replaces the first one's scores)."""
        if self.reward is not None:
            self.add(list(zip(stream_keys(group, [row]), samples_of(group, [row]))))

    def add(self, keyed: list[tuple[Hashable, Sample]]) -> None:
        """Queue the ``(key, sample)`` pairs and start scoring them (a failed call stops it: ``rest`` raises its
        error)."""
        for key, sample in keyed:
            self._latest[key] = self._latest.get(key, -1) + 1
            self._queue.append((key, self._latest[key], sample))
        self._tasks = [t for t in self._tasks if not t.done() or t.cancelled() or t.exception() is not None]
        if any(t.done() for t in self._tasks):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # the trainer between two waits: the task goes on at the next one
            loop = thread_loop()
        if self.reward.concurrent_calls:
            batch, self._queue = self._queue, []
            self._tasks.append(loop.create_task(self._score(batch)))
        elif not self._tasks:
            self._tasks.append(loop.create_task(self._drain()))

    def wait(self, blocking: Callable[..., T], *args: Any) -> T:
        """``blocking(*args)`` (a wait for engines) in a worker thread while this thread's event loop goes on
        scoring what was queued; its result."""
        if all(t.done() for t in self._tasks):
            return blocking(*args)
        return run_sync(asyncio.to_thread(blocking, *args), "EarlyScores.wait")

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            await self._score(batch)

    async def _score(self, batch: list[tuple[Hashable, int, Sample]]) -> None:
        scores = _checked(self.reward, await self.reward.score([s for _, _, s in batch]), len(batch))
        for (key, handed, _), score in zip(batch, scores):
            if self._latest.get(key) == handed:
                self.scores[key] = score

    async def rest(self, traj: Trajectories, rows: Sequence[PromptRow]) -> list[Score]:
        """Every trajectory's score, in order: the calls in flight awaited, the trajectories not yet scored (all
        of them on a rank that only replayed the loop) scored now. The scores returned are forgotten."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await task
        keys = list(range(len(traj.group_ids))) if self.rows is not None else stream_keys(traj, rows)
        missing = [i for i, key in enumerate(keys) if key not in self.scores]
        if missing:
            samples = samples_of(traj, rows)
            scores = _checked(self.reward, await self.reward.score([samples[i] for i in missing]), len(missing))
            self.scores.update((keys[i], score) for i, score in zip(missing, scores))
        for key in keys:
            self._latest.pop(key, None)
        return [self.scores.pop(key) for key in keys]

    def cancel(self) -> None:
        """Stop the calls in flight (the rollout failed, the source closed) and forget what was queued and scored."""
        for task in self._tasks:
            task.cancel()
        self._tasks, self._queue = [], []
        self.scores.clear()
        self._latest.clear()


def stream_keys(traj: Trajectories, rows: Sequence[PromptRow]) -> list[tuple[int, int, int]]:
    """Each trajectory's place in the training stream: its row's ``(batch_index, position)`` (``rows`` indexed by
    the group ids) and its rank among its group's trajectories."""
    seen: dict[int, int] = {}
    keys = []
    for group in traj.group_ids.tolist():
        rank = seen[group] = seen.get(group, -1) + 1
        keys.append((rows[group]["batch_index"], rows[group]["position"], rank))
    return keys


def _checked(reward: Reward, scores: list[Score], n: int) -> list[Score]:
    if len(scores) != n:
        raise RuntimeError(f"{type(reward).__qualname__}.score returned {len(scores)} scores for {n} samples: it "
                           "must return one per sample, in order")
    return scores
