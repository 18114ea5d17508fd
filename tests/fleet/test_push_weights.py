"""``push_weights``: a push whose transport fails still gathers every bucket (the other training ranks' ZeRO-3
gathers must finish with rank 0's), then raises the failure; a push that goes through ends normally."""

from __future__ import annotations

import contextlib

import pytest
from torch import nn

import zerotir.parallel.weight_sync as weight_sync
from zerotir.fleet.weight_group import WeightGroupError
from zerotir.fleet.weight_push import push_weights


class _Sender:
    """The four calls ``push_weights`` makes of a ``WeightSender``, recorded; the transport fails where told."""

    def __init__(self, fail_at_begin: bool = False, fail_at_bucket: int | None = None):
        self.fail_at_begin, self.fail_at_bucket = fail_at_begin, fail_at_bucket
        self.calls: list[tuple] = []

    def begin(self, version):
        self.calls.append(("begin", version))
        if self.fail_at_begin:
            raise WeightGroupError("a receiver is gone (begin)")

    def update_weights(self, bucket):
        sent = sum(1 for c in self.calls if c[0] == "bucket")
        self.calls.append(("bucket", [name for name, _ in bucket]))
        if sent == self.fail_at_bucket:
            raise WeightGroupError("a receiver is gone (bucket)")

    def abort(self, cause):
        self.calls.append(("abort", str(cause)))

    def end(self):
        self.calls.append(("end",))
        return "stats"


@pytest.fixture
def gathers(monkeypatch):
    """Every bucket gather ``sync_weights`` opens (the ZeRO-3 collective), by the names it gathers."""
    opened = []

    @contextlib.contextmanager
    def record(params):
        opened.append(len(params))
        yield

    monkeypatch.setattr(weight_sync, "_gathered", record)
    return opened


def _model() -> nn.Module:  # three layers of 1 KB each: three buckets of 1 KB
    return nn.Sequential(*(nn.Linear(16, 16, bias=False) for _ in range(3)))


def test_a_push_that_goes_through_sends_every_bucket_and_ends(gathers):
    sender = _Sender()
    assert push_weights(sender, _model(), 4, bucket_bytes=1024) == "stats"
    assert [c[0] for c in sender.calls] == ["begin", "bucket", "bucket", "bucket", "end"]
    assert gathers == [1, 1, 1]


@pytest.mark.parametrize(("sender", "sent"), [(_Sender(fail_at_begin=True), 0), (_Sender(fail_at_bucket=1), 2)],
                         ids=["at-begin", "in-a-bucket"])
def test_a_failed_transport_still_gathers_every_bucket_then_raises(sender, sent, gathers):
    with pytest.raises(WeightGroupError, match="a receiver is gone"):
        push_weights(sender, _model(), 4, bucket_bytes=1024)
    assert gathers == [1, 1, 1]  # every gather ran: the other ranks' collectives are matched
    assert sum(1 for c in sender.calls if c[0] == "bucket") == sent  # nothing sent after the failure
    assert sender.calls[-1][0] == "abort" and "end" not in [c[0] for c in sender.calls]
