"""One engine stepped by several tool loops at once, and the abort at a weight push of the loops that can no
longer train.

Every tool loop of an engine host's stream (``zerotir.fleet.stream``) gets an ``EngineShare``: its own keys on the
one engine, its own finished samples. The share remembers the oldest weight version its segments were submitted
with (``VersionedEngine`` stamps each segment with the version at its submission, the oldest that may have produced
its tokens) and the tokens its finished segments sampled.

The abort: a push of version V means the next RL step trains with weights of V updates (``rl.staleness``), so a
token of version v can train at no later step once v < V - S (S = ``model.hosts.max_staleness``: the floor of
``shares.EndedGroups.stale`` at that step, and versions and steps only grow). A group whose oldest segment is
below that floor is therefore dead at the push: at the first engine step after it, ``EngineHub.step`` releases the
group's requests in the engine (``GenerationEngine.release``: vLLM aborts them, the transformers engine frees their
rows) and marks its share aborted; the stream cancels its tool loop and queues the group again, so it is generated
anew with fresh weights, and none of the tokens it had sampled ever reaches a batch. The drop at collection
(``EndedGroups.stale``) stays as the backstop, for the groups that had ended before the push but were not taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from zerotir.fleet.versioned import VersionedEngine
from zerotir.rollout.engine import Sample, SamplingParams

NO_VERSION = -1  # a segment submitted before any push (the folder's weights): older than every push


class GroupAborted(RuntimeError):
    """A call on a share that ``EngineHub`` aborted at a push: its group is queued again, nothing of it trains."""


class EngineHub:
    """One engine stepped by several tool loops at once: each loop gets an ``EngineShare`` (its own keys), and the
    samples of every step go to the share that submitted them. At the first step after a push, the shares whose
    oldest segment is over the staleness bound are aborted (see the module doc).

    Args:
        engine: the host's engine, behind its push lock (``VersionedEngine``).
        max_staleness: S of ``model.hosts``; None: no bound, nothing aborted.
    """

    def __init__(self, engine: VersionedEngine, max_staleness: int | None = None):
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"EngineHub(max_staleness={max_staleness}): >= 0 (model.hosts.max_staleness), or None")
        self.engine, self.max_staleness = engine, max_staleness
        self.context_length = engine.context_length
        self._shares: dict[int, EngineShare] = {}
        self._next = 0
        self._seen = engine.version  # the version of the last push the hub checked its shares against

    def share(self) -> EngineShare:
        self._next += 1
        share = self._shares[self._next] = EngineShare(self, self._next)
        return share

    def drop(self, share: EngineShare) -> None:
        self._shares.pop(share.tag, None)

    def waiting(self) -> bool:
        """Whether a share holds finished samples its tool loop has not taken yet: until it takes them (and
        resubmits what goes on), an engine step would decode without those requests."""
        return any(share.has_done for share in self._shares.values())

    def step(self) -> None:
        """One engine step, after aborting the shares a push since the last step left over the bound; its
        finished samples to their shares."""
        version = self.engine.version
        if version != self._seen:
            self._seen = version
            if version is not None and self.max_staleness is not None:
                self.abort_below(version - self.max_staleness)
        for (tag, key), sample in self.engine.step():
            self._shares[tag].finished(key, sample)

    def abort_below(self, floor: int) -> list[EngineShare]:
        """Abort every share with a segment submitted with a version below ``floor`` (``EngineShare.abort``);
        returns them."""
        stale = [share for share in self._shares.values() if share.oldest < floor]
        for share in stale:
            share.abort()
            self.drop(share)
        return stale


class EngineShare:
    """One tool loop's view of a shared engine (a ``GenerationEngine``): it submits and releases its own keys,
    and its ``step`` returns its own finished samples, stepping the engine only when no share of the hub holds
    finished samples waiting (else it returns none: the loop yields, the others take theirs and resubmit, so every
    engine step decodes every request that can go on). A sample another loop's step finished waits here, and
    counts as running until it is returned.

    Attributes:
        oldest: the lowest version its segments were submitted with (``NO_VERSION`` before any push); a group
            with none submitted yet has the highest possible.
        tokens: the tokens its finished segments sampled (a segment cut by an abort reports none).
        aborted: the hub aborted it at a push; every further call raises ``GroupAborted``.
        task: the tool loop's task, cancelled by ``abort`` (None: nothing to cancel).
    """

    def __init__(self, hub: EngineHub, tag: int):
        self.hub, self.tag = hub, tag
        self.context_length = hub.context_length
        self.oldest, self.tokens, self.aborted = 1 << 62, 0, False
        self.task: asyncio.Task | None = None
        self._running: set[Hashable] = set()
        self._done: list[tuple[Hashable, Sample]] = []

    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        self._check()
        stamped = self.hub.engine.submit((self.tag, key), ids, params)
        self.oldest = min(self.oldest, NO_VERSION if stamped is None else stamped)
        self._running.add(key)

    def step(self) -> list[tuple[Hashable, Sample]]:
        self._check()
        if not self._done and not self.hub.waiting():
            self.hub.step()
        out, self._done = self._done, []
        return out

    def release(self, key: Hashable) -> None:
        self.hub.engine.release((self.tag, key))
        self._running.discard(key)

    def finished(self, key: Hashable, sample: Sample) -> None:
        self._running.discard(key)
        self._done.append((key, sample))
        self.tokens += len(sample.token_ids)

    def abort(self) -> None:
        """Release every request of the share in the engine, forget its finished samples and cancel its tool
        loop: nothing it sampled leaves it."""
        for key in list(self._running):
            self.release(key)
        self._done.clear()
        self.aborted = True
        if self.task is not None:
            self.task.cancel()

    @property
    def has_done(self) -> bool:
        """Whether finished samples wait here for the tool loop's next ``step``."""
        return bool(self._done)

    @property
    def num_running(self) -> int:
        return len(self._running) + len(self._done)

    def _check(self) -> None:
        if self.aborted:
            raise GroupAborted(f"engine share {self.tag}: aborted at the push of version {self.hub.engine.version} "
                               f"(its oldest segment has version {self.oldest}, over model.hosts.max_staleness="
                               f"{self.hub.max_staleness})")
