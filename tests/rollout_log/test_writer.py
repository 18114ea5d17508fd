"""The background writer: jobs run in order off the calling thread, the queue is bounded, failures surface."""

from __future__ import annotations

import threading

import pytest

from zerotir.rollout_log.writer import BackgroundWriter, RolloutWriteError


def test_jobs_run_in_order_on_another_thread():
    done, threads = [], set()
    writer = BackgroundWriter(max_pending=2)
    for i in range(5):
        writer.submit(lambda i=i: (done.append(i), threads.add(threading.current_thread().name)))
    writer.close()
    assert done == [0, 1, 2, 3, 4] and threads == {"zerotir-rollout-writer"} and not writer.alive
    with pytest.raises(RolloutWriteError, match="closed"):
        writer.submit(lambda: None)


def test_submit_blocks_when_the_queue_is_full():
    gate, started = threading.Event(), threading.Event()
    writer = BackgroundWriter(max_pending=1)
    writer.submit(lambda: (started.set(), gate.wait()))  # the thread holds this one
    started.wait()
    writer.submit(lambda: None)  # fills the queue
    third = threading.Thread(target=writer.submit, args=(lambda: None,))
    third.start()
    third.join(timeout=0.5)
    assert third.is_alive()  # blocked: the disk is max_pending jobs behind
    gate.set()
    third.join()
    writer.close()


def test_a_failed_job_surfaces_on_the_next_call_and_later_jobs_are_skipped():
    ran = []
    writer = BackgroundWriter()
    writer.submit(lambda: (_ for _ in ()).throw(OSError("disk full")))
    writer.submit(lambda: ran.append(1))
    with pytest.raises(RolloutWriteError, match="OSError: disk full") as info:
        writer.flush()
    assert isinstance(info.value.__cause__, OSError) and ran == []
    with pytest.raises(RolloutWriteError):
        writer.submit(lambda: None)
    writer.close(raise_errors=False)  # on an exception path: stop without raising
    with pytest.raises(RolloutWriteError):
        writer.close()


def test_bad_queue_size():
    with pytest.raises(ValueError, match="max_pending=0"):
        BackgroundWriter(0)
