"""Pieces of the executor that need no server: the output cap and the worker's command-line-free config."""

from __future__ import annotations

import pytest

from sandbox.config import ExecConfig, WorkerSpec
from sandbox.executor import CappedBuffer


def test_capped_buffer_keeps_head_and_tail_and_counts_the_dropped_middle() -> None:
    buffer = CappedBuffer(10)  # 5 bytes of head, 5 of tail
    for chunk in (b"abc", b"defgh", b"ijklmnop"):  # 16 bytes: head 'abcde', tail 'lmnop', 6 dropped ('fghijk')
        buffer.feed(chunk)
    assert (bytes(buffer.head), bytes(buffer.tail), buffer.dropped) == (b"abcde", b"lmnop", 6)
    assert buffer.text() == "abcde\n[... 6 bytes of output omitted by the sandbox ...]\nlmnop"


def test_capped_buffer_under_the_cap_is_verbatim() -> None:
    buffer = CappedBuffer(10)
    buffer.feed(b"hello")
    buffer.feed(b"!")
    assert buffer.text() == "hello!" and buffer.dropped == 0


def test_capped_buffer_replaces_a_utf8_sequence_cut_at_the_boundary() -> None:
    buffer = CappedBuffer(4)  # head 2 bytes: the first half of 'é' (2 bytes) + nothing else
    buffer.feed("aé".encode() + b"xyzw")
    assert buffer.text().startswith("a\ufffd")


def test_worker_spec_round_trips_through_json() -> None:
    spec = WorkerSpec(index=3, exec_config=ExecConfig(run_timeout=2.0, allow_imports=["*"]), work_dir="/tmp/w3",
                      server_pid=123)
    assert WorkerSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(("field", "value", "fix"), [
    ("run_timeout", 0, "ExecConfig.run_timeout must be > 0"),
    ("run_timeout", 100.0, "raise --max_run_timeout or lower --run_timeout"),
    ("memory_limit_mb", 10_000, "raise --max_memory_limit_mb or lower --memory_limit_mb"),
    ("uid_base", 0, "ExecConfig.uid_base must be a positive unprivileged uid"),
])
def test_bad_exec_config_names_the_field_and_the_fix(field: str, value: object, fix: str) -> None:
    with pytest.raises(ValueError, match=fix.replace(".", r"\.")):
        ExecConfig(**{field: value})
