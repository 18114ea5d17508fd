"""The judge against the failures a real endpoint gives (the scripted OpenAI-compatible server of test_judge.py, real
HTTP, vLLM's own error messages): the check at start names the model served, a missing chat template and the key; at
run time a 429 waits its Retry-After, a 5xx backs off, a request too long for the judge scores 0 and the run goes on,
a refused key or model stops it naming the setting; the cache is bounded and keeps failed parses; failures are one
line per step."""

from __future__ import annotations

import logging

import pytest

import zerotir.rewards.judge as judge_module
from tests.rewards.test_judge import Judge, sample, scores
from zerotir.rewards import JudgeReward


@pytest.fixture(scope="module")
def judge():
    server = Judge()
    yield server
    server.close()


@pytest.fixture(scope="module")
def strict():
    """A server that wants the key ``s3cret`` and, like vLLM serving a base model, has no chat template."""
    server = Judge(key="s3cret", chat_template=False)
    yield server
    server.close()


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The backoff's waits, recorded instead of spent."""
    waited: list[float] = []

    async def record(seconds: float) -> None:
        waited.append(seconds)

    monkeypatch.setattr(judge_module, "_sleep", record)
    return waited


def test_the_check_at_start_passes_for_a_served_model_with_a_chat_template(judge):
    before = len(judge.asked)
    JudgeReward(base_url=judge.url).start()  # the model listed, one token of a chat completed
    assert judge.asked[before:] == []  # the check is no judged response


def test_a_model_the_endpoint_does_not_serve_is_an_error_at_start_naming_model_and_the_served_names(judge):
    with pytest.raises(RuntimeError, match=r"model.reward.init_args.model='other' is not served at .*; it serves: "
                                           r"judge: set model to one of them"):
        JudgeReward(base_url=judge.url, model="other").start()


def test_a_server_without_a_chat_template_is_an_error_at_start_saying_to_start_it_with_one(strict, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "s3cret")
    with pytest.raises(RuntimeError, match=r"no chat template .* start the server with a chat template "
                                           r"\(--chat-template\)"):
        JudgeReward(base_url=strict.url, api_key_env="JUDGE_KEY").start()


def test_a_missing_or_wrong_key_is_an_error_naming_api_key_env(strict, monkeypatch):
    with pytest.raises(RuntimeError, match=r"wants a key \(401: .*\) and none is sent: set "
                                           r"model.reward.init_args.api_key_env to an environment variable"):
        JudgeReward(base_url=strict.url).start()
    monkeypatch.setenv("JUDGE_KEY", "wrong")
    with pytest.raises(RuntimeError, match=r"refused the key in \$JUDGE_KEY .*\.api_key_env='JUDGE_KEY'"):
        JudgeReward(base_url=strict.url, api_key_env="JUDGE_KEY").start()
    with pytest.raises(RuntimeError, match=r"refused the key in \$JUDGE_KEY"):  # at run time too
        scores(JudgeReward(base_url=strict.url, api_key_env="JUDGE_KEY"), [sample("right")])


def test_a_429_is_tried_again_after_its_retry_after(judge, waits):
    reward = JudgeReward(base_url=judge.url, retries=2, backoff_s=0.5)
    assert scores(reward, [sample("rate-once")]) == [(1.0, True)]
    assert waits == [7.0]  # the server's Retry-After, longer than the backoff's 0.25 to 0.5 s
    stats = reward.stats()
    assert (stats["judge_calls"], stats["judge_failures"]) == (2.0, 0.0)


def test_a_5xx_backs_off_exponentially_with_jitter_then_scores_zero(judge, waits):
    reward = JudgeReward(base_url=judge.url, retries=3, backoff_s=0.5)
    assert scores(reward, [sample("down")]) == [(0.0, False)]
    assert len(waits) == 3  # between the 4 tries
    for attempt, wait in enumerate(waits):
        assert 0.5 * 2 ** attempt / 2 <= wait <= 0.5 * 2 ** attempt  # half to all of base * 2^attempt
    stats = reward.stats()
    assert (stats["judge_calls"], stats["judge_errors"], stats["judge_failures"]) == (4.0, 1.0, 1.0)


def test_a_request_too_long_for_the_judge_scores_zero_and_the_run_goes_on(judge):
    reward = JudgeReward(base_url=judge.url)
    before = len(judge.asked)
    assert scores(reward, [sample("long"), sample("right")]) == [(0.0, False), (1.0, True)]
    assert scores(reward, [sample("long")]) == [(0.0, False)]  # cached: not sent again
    assert judge.asked[before:].count("long") == 1
    stats = reward.stats()
    assert (stats["judge_overlong"], stats["judge_failures"], stats["judge_cache_hits"]) == (1.0, 1.0, 1.0)


def test_the_cache_is_bounded_least_recently_used_first(judge):
    reward = JudgeReward(base_url=judge.url, cache_size=2, max_concurrency=1)
    before = len(judge.asked)
    scores(reward, [sample("right", "a"), sample("right", "b")])
    scores(reward, [sample("right", "a")])  # a hit: a is now the most recently used
    scores(reward, [sample("right", "c")])  # c pushes out b, the least recently used
    scores(reward, [sample("right", "a")])  # still cached (first in, but used since)
    scores(reward, [sample("right", "b")])  # asked again
    assert len(judge.asked) - before == 4 and len(reward._cache) == 2
    assert reward.stats()["judge_cache_hits"] == 2


def test_a_failed_parse_is_cached_and_failures_are_one_line_per_step(judge, caplog):
    reward = JudgeReward(base_url=judge.url)
    before = len(judge.asked)
    with caplog.at_level(logging.DEBUG, logger="zerotir.rewards.judge"):
        scores(reward, [sample(f"chatty{i}") for i in range(5)] + [sample("right")])
        scores(reward, [sample("chatty0")])  # the failed parse is not asked again
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []  # no line per call
        stats = reward.stats()
    assert len(judge.asked) - before == 6
    assert (stats["judge_parse_failures"], stats["judge_failures"], stats["judge_cache_hits"]) == (5.0, 5.0, 1.0)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == ["judge: 5 of 6 responses asked scored 0 without a verdict (5 replies without CORRECT / "
                     "INCORRECT, 0 too long for the judge, 0 failed after 3 tries; 6 calls)"]
    caplog.clear()
    assert reward.stats()["judge_failures"] == 0 and caplog.records == []  # a step without failures says nothing


@pytest.mark.parametrize(("name", "value"), [("cache_size", -1), ("backoff_s", 0), ("max_backoff_s", -1.0),
                                             ("max_concurrency", 0)])
def test_a_bad_setting_is_an_error_naming_it(name, value):
    with pytest.raises(ValueError, match=f"model.reward.init_args.{name}={value}"):
        JudgeReward(**{name: value})


def test_the_documented_judge_entry_builds_with_the_settings_it_shows():
    import re
    from pathlib import Path

    import yaml

    doc = (Path(__file__).resolve().parents[2] / "docs" / "rewards.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "JudgeReward" in b)
    entry = yaml.safe_load(block)["model"]["reward"]
    reward = JudgeReward(**entry["init_args"])
    assert (reward.retries, reward.backoff_s, reward.max_backoff_s, reward.cache_size) == (2, 1.0, 30.0, 10000)


def test_a_score_without_a_verdict_is_marked_an_infrastructure_failure_and_a_verdict_is_not(judge, waits):
    """Every try failed, too long for the judge, a reply without a verdict: the sample's score is a stand-in
    (``Score.infra_failed``: it leaves the loss, ``model.filters.infra_failed``); a verdict, right or wrong, is the
    model's, cached or not."""
    import asyncio

    reward = JudgeReward(base_url=judge.url, retries=1, backoff_s=0.01)
    asked = [sample("down"), sample("long"), sample("chatty-infra"), sample("right"), sample("wrong")]
    for _ in range(2):  # the second time from the cache (but the failed tries, which are asked again)
        got = asyncio.run(reward.score(asked))
        assert [s.infra_failed for s in got] == [True, True, True, False, False]
        assert [s.score for s in got] == [0.0, 0.0, 0.0, 1.0, 0.0]
