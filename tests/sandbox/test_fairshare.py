"""The batch slots: one cap for all batches, freed slots taken by the clients in turn."""

from __future__ import annotations

import asyncio

import pytest

from sandbox.fairshare import FairShare


async def _wait_in_line(share: FairShare, entries: list[tuple[str, str]], granted: list[str]) -> list[asyncio.Task]:
    """Queue ``(client, name)`` entries in this order; each records its name when it gets a slot."""
    async def one(client: str, name: str) -> None:
        await share.acquire(client)
        granted.append(name)

    tasks = []
    for client, name in entries:
        tasks.append(asyncio.ensure_future(one(client, name)))
        await asyncio.sleep(0)  # queued in this order
    return tasks


def test_a_freed_slot_goes_to_the_clients_in_turn_not_to_the_first_batch_whole() -> None:
    async def scenario() -> tuple[list[str], int]:
        share = FairShare(1)
        granted: list[str] = []
        tasks = await _wait_in_line(share, [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1")],
                                    granted)
        for _ in range(4):  # each running entry ends in turn
            share.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return granted, share.running

    granted, running = asyncio.run(scenario())
    assert granted == ["a1", "a2", "b1", "c1", "a3"]  # a2 was first in line when a1 ended; then b, c, a again
    assert running == 1


def test_a_cancelled_waiter_gives_its_turn_away_and_no_slot_is_lost() -> None:
    async def scenario() -> tuple[list[str], int]:
        share = FairShare(1)
        granted: list[str] = []
        tasks = await _wait_in_line(share, [("a", "a1"), ("b", "b1"), ("c", "c1")], granted)
        tasks[1].cancel()  # b's client went away while it waited
        await asyncio.sleep(0)
        share.release()
        await asyncio.sleep(0)
        await tasks[2]
        return granted, share.running

    granted, running = asyncio.run(scenario())
    assert (granted, running) == (["a1", "c1"], 1)


def test_a_capacity_below_one_is_an_error() -> None:
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        FairShare(0)
