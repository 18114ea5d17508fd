"""How the judge reads an endpoint's answers, as pure functions with hand-worked numbers: the backoff and its jitter,
Retry-After in seconds and as a date, which statuses are tried again, and what a 400 means."""

from __future__ import annotations

import email.utils

import pytest

from tests.rewards.test_judge import NO_TEMPLATE, TOO_LONG
from zerotir.rewards.judge_http import backoff_wait, over_long, passing, refusal, retry_after_s


class Draw:
    """A random source whose uniform draw is always the low or the high end."""

    def __init__(self, high: bool) -> None:
        self.high = high

    def uniform(self, low: float, high: float) -> float:
        return high if self.high else low


@pytest.mark.parametrize(("attempt", "retry_after", "high", "expected"), [
    (0, None, True, 1.0),    # 1 * 2^0
    (3, None, True, 8.0),    # 1 * 2^3
    (2, None, False, 2.0),   # 1 * 2^2, half of it
    (6, None, True, 30.0),   # 64 capped at 30
    (6, None, False, 15.0),  # capped, then half
    (0, 7.0, True, 7.0),     # the server's 7 s over the backoff's 1 s
    (2, 0.1, True, 4.0),     # the backoff's 4 s over the server's 0.1 s
    (0, 100.0, True, 30.0),  # the server's 100 s capped at 30
])
def test_backoff_doubles_with_jitter_is_capped_and_honours_retry_after(attempt, retry_after, high, expected):
    assert backoff_wait(attempt, retry_after, base=1.0, cap=30.0, rng=Draw(high)) == expected


def test_retry_after_reads_seconds_and_http_dates():
    now = 1_800_000_000.0
    assert retry_after_s("7") == 7.0 and retry_after_s("1.5") == 1.5 and retry_after_s("-3") == 0.0
    assert retry_after_s(email.utils.formatdate(now + 12, usegmt=True), now=now) == 12.0
    assert retry_after_s(email.utils.formatdate(now - 60, usegmt=True), now=now) == 0.0  # a date past
    assert retry_after_s(None) is None and retry_after_s("") is None and retry_after_s("soon") is None


def test_busy_and_broken_servers_are_tried_again_refusals_are_not():
    assert [s for s in (200, 400, 401, 403, 404, 408, 422, 429, 500, 502, 503) if passing(s)] == [408, 429, 500,
                                                                                                   502, 503]


def test_a_400_for_the_context_length_is_over_long_and_one_for_a_chat_template_is_a_refusal():
    assert over_long(400, TOO_LONG) and over_long(400, '{"error": {"code": "context_length_exceeded"}}')
    assert not over_long(400, NO_TEMPLATE) and not over_long(413, TOO_LONG)
    told = refusal(400, NO_TEMPLATE, "judge", "http://h/v1", None)
    assert "start the server with a chat template (--chat-template)" in told
    assert "api_key_env='K'" in refusal(403, "Forbidden", "judge", "http://h/v1", "K")
    assert "model.reward.init_args.model='j2'" in refusal(404, "no model", "j2", "http://h/v1", None)
