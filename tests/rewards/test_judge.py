"""The judge reward against a local OpenAI-compatible server (FastAPI on a loopback port, real HTTP), its verdicts
scripted by the response it is shown: scores, the bounded cache, a timeout then a retry, a 429 and its Retry-After,
server errors, a request too long for the judge, parse failures and their one line per step, the fallback mode, and
the check at start (the model served, a chat template, the key), each failure naming its setting."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.ports import dead_url
from zerotir.rewards import JudgeReward, Sample

# The judge's reply per response (the word after "Student's response:" in its prompt). "hang-once" never answers
# its first call (the client times out) and answers CORRECT after; "fail-once" is a 503, then CORRECT; "gated..."
# calls wait until two are in flight, then answer CORRECT a moment later (the server keeps the peak in flight).
# "rate-once" is a 429 asking to wait 7 s, then CORRECT; "down" is always a 503; "long" is vLLM's 400 for a prompt
# past the judge's context. A word with digits after it answers as the word ("chatty3": "chatty").
REPLIES = {"right": "CORRECT", "wrong": "Incorrect.", "chatty": "Hmm, hard to say.",
           "reasoned": "It is not INCORRECT at first sight... on reflection: CORRECT", "hang-once": "CORRECT",
           "fail-once": "CORRECT", "hang": "CORRECT", "rate-once": "CORRECT"}
# vLLM's own messages (vllm/renderers): a base model served without --chat-template, a prompt past max_model_len.
NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
               "template if the tokenizer does not define one.")
TOO_LONG = ("This model's maximum context length is 2048 tokens. However, your prompt contains 3100 input tokens, "
            "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt.")


def vllm_error(message: str, status: int) -> JSONResponse:
    """An error as vLLM's OpenAI server writes it."""
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}},
                        status_code=status)


class Judge:
    """The scripted server: its URL and every response it was asked about, in order."""

    def __init__(self, key: str | None = None, chat_template: bool = True) -> None:
        self.asked: list[str] = []
        self.bodies: list[dict] = []  # every chat completion's request body, in order
        self.release = asyncio.Event()
        self.in_flight = self.peak = 0
        self.two_in_flight = asyncio.Event()
        self.crowd, self.crowding = 0, 0  # "crowd..." calls wait until ``crowd`` of them are in flight at once
        self.crowd_in = asyncio.Event()
        app = FastAPI()

        def refused(request: Request) -> JSONResponse | None:
            if key is not None and request.headers.get("authorization") != f"Bearer {key}":
                return vllm_error("Unauthorized", 401)
            return None

        @app.get("/v1/models")
        async def models(request: Request):
            return refused(request) or {"object": "list", "data": [{"id": "judge", "object": "model"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.bodies.append(body)
            if refused(request) or not chat_template:
                return refused(request) or vllm_error(NO_TEMPLATE, 400)
            if "Student's response:" not in body["messages"][0]["content"]:  # the check at start
                return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "CORRECT"}}]}
            word = body["messages"][0]["content"].split("Student's response:\n")[1].split("\n")[0]
            first = word not in self.asked
            self.asked.append(word)
            if word == "hang" or (word == "hang-once" and first):
                await asyncio.sleep(3600)  # never answers: the client's timeout ends the call
            if word.startswith("gated"):
                return await self.gated()
            if word.startswith("crowd"):
                return await self.crowded()
            if (word == "fail-once" and first) or word == "down":
                return JSONResponse({"error": "overloaded"}, status_code=503)
            if word == "rate-once" and first:
                return JSONResponse({"error": "slow down"}, status_code=429, headers={"Retry-After": "7"})
            if word == "long":
                return vllm_error(TOO_LONG, 400)
            if body["model"] != "judge":
                return vllm_error(f"The model `{body['model']}` does not exist.", 404)
            reply = REPLIES[word.rstrip("0123456789")]
            return {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=0))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the scripted judge did not start")
            threading.Event().wait(0.01)

    async def gated(self) -> dict:
        """A call that waits for a second one in flight (a judge called one at a time never answers it), then
        stays in flight a moment, so that calls past the bound would overlap it."""
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight >= 2:
            self.two_in_flight.set()
        await self.two_in_flight.wait()
        await asyncio.sleep(0.2)
        self.in_flight -= 1
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "CORRECT"}}]}

    async def crowded(self) -> dict:
        """A call that answers once ``crowd`` calls are in flight together (a judge holding fewer at once never
        gets an answer to any of them)."""
        self.crowding += 1
        if self.crowding >= self.crowd:
            self.crowd_in.set()
        await self.crowd_in.wait()
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "CORRECT"}}]}

    def close(self) -> None:
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def judge():
    server = Judge()
    yield server
    server.close()


def sample(response: str, question: str = "1 + 1", truncated: bool = False) -> Sample:
    return Sample(question, "2", response, truncated)


def scores(reward: JudgeReward, samples: list[Sample]) -> list[tuple[float, bool]]:
    return [(s.score, s.correct) for s in asyncio.run(reward.score(samples))]


def test_verdicts_score_and_count_a_reply_without_one_as_a_parse_failure(judge):
    reward = JudgeReward(base_url=judge.url, max_concurrency=2)
    reward.start()
    got = scores(reward, [sample("right"), sample("wrong"), sample("chatty"), sample("reasoned"),
                          sample("right", truncated=True)])
    assert got == [(1.0, True), (0.0, False), (0.0, False), (1.0, True), (0.0, False)]  # the last verdict word counts
    stats = reward.stats()
    assert stats["judge_parse_failures"] == 1 and stats["judge_calls"] == 4  # the cut response costs no call
    assert reward.stats()["judge_calls"] == 0  # read and reset


def test_calls_run_at_most_max_concurrency_at_a_time(judge):
    reward = JudgeReward(base_url=judge.url, max_concurrency=2)
    reward.start()
    assert scores(reward, [sample(f"gated{i}") for i in range(6)]) == [(1.0, True)] * 6
    assert judge.peak == 2  # two at once (the bound is used), never more


def test_calls_side_by_side_share_one_bound():
    """``EarlyScores`` calls the judge for each group as it ends, several calls in flight: together they stay within
    ``max_concurrency``."""
    server = Judge()
    try:
        reward = JudgeReward(base_url=server.url, max_concurrency=2)

        async def two_calls():
            return await asyncio.gather(*(reward.score([sample(f"gated{k}{i}") for i in range(3)]) for k in (1, 2)))

        assert [(s.score, s.correct) for call in asyncio.run(two_calls()) for s in call] == [(1.0, True)] * 6
        assert server.peak == 2
    finally:
        server.close()


@pytest.mark.parametrize("bound", [None, 120])
def test_as_many_calls_as_max_concurrency_are_in_flight_at_once(bound):
    """The default (64) holds a batch's calls 64 at a time, and a bound past httpx's own pool of 100 connections is
    the bound: ``bound`` calls that each answer only once all of them are in flight all score."""
    server = Judge()
    try:
        reward = JudgeReward(base_url=server.url, timeout_s=10.0, retries=0,
                             **({} if bound is None else {"max_concurrency": bound}))
        server.crowd = bound or 64
        assert scores(reward, [sample(f"crowd{i}") for i in range(server.crowd)]) == [(1.0, True)] * server.crowd
    finally:
        server.close()


def test_the_cache_answers_a_repeated_question_and_response_without_a_call(judge):
    reward = JudgeReward(base_url=judge.url)
    before = len(judge.asked)
    assert scores(reward, [sample("right", "q1"), sample("wrong", "q1")]) == [(1.0, True), (0.0, False)]
    assert scores(reward, [sample("right", "q1"), sample("right", "q2")]) == [(1.0, True), (1.0, True)]
    # q1's "right" asked once, q2's is another key (the first two calls run at once: either may arrive first)
    assert sorted(judge.asked[before:before + 2]) == ["right", "wrong"] and judge.asked[before + 2:] == ["right"]
    assert reward.stats()["judge_cache_hits"] == 1


def test_a_timed_out_or_failed_call_is_retried_then_scores_zero_when_every_try_fails(judge):
    reward = JudgeReward(base_url=judge.url, timeout_s=2.0, retries=1, backoff_s=0.01)
    assert scores(reward, [sample("hang-once"), sample("fail-once")]) == [(1.0, True), (1.0, True)]
    assert reward.stats() == {"judge_asked": 2.0, "judge_calls": 4.0, "judge_cache_hits": 0.0,
                              "judge_parse_failures": 0.0, "judge_overlong": 0.0, "judge_errors": 0.0,
                              "judge_failures": 0.0}
    no_retry = JudgeReward(base_url=judge.url, timeout_s=0.5, retries=0)
    assert scores(no_retry, [sample("hang")]) == [(0.0, False)]
    assert no_retry.stats()["judge_errors"] == 1


def test_fallback_asks_the_judge_only_where_math_verify_cannot_read_the_answer(judge):
    reward = JudgeReward(base_url=judge.url, mode="fallback")
    before = len(judge.asked)
    samples = [Sample("1 + 1", "2", "so \\boxed{2}"), Sample("1 + 1", "2", "so \\boxed{3}"),
               Sample("capital?", "Paris", "right"), Sample("capital?", "Paris", "wrong")]
    assert scores(reward, samples) == [(1.0, True), (0.0, False), (1.0, True), (0.0, False)]
    assert judge.asked[before:] in (["right", "wrong"], ["wrong", "right"])  # the boxed numbers never reach it


def test_an_unreachable_judge_or_a_refused_call_is_an_error_naming_the_setting(judge):
    nobody = dead_url("/v1")
    with pytest.raises(RuntimeError, match="model.reward.init_args.base_url=.*does not answer"):
        JudgeReward(base_url=nobody, timeout_s=2.0).start()
    with pytest.raises(RuntimeError, match="model.reward.init_args.model='other'"):
        scores(JudgeReward(base_url=judge.url, model="other"), [sample("right")])
    with pytest.raises(ValueError, match="template lacks {response}"):
        JudgeReward(template="{question} {answer}")


def test_extra_body_rides_on_every_request_the_check_at_start_included_and_may_not_replace_the_judges_own(judge):
    options = {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 1}
    reward = JudgeReward(base_url=judge.url, extra_body=options, cache_size=0)
    before = len(judge.bodies)
    reward.start()
    assert scores(reward, [sample("right"), sample("wrong")]) == [(1.0, True), (0.0, False)]
    sent = judge.bodies[before:]
    assert len(sent) == 3 and all({k: b[k] for k in options} == options for b in sent)
    assert all(b["model"] == "judge" and b["max_tokens"] == reward.max_tokens for b in sent[1:])
    with pytest.raises(ValueError, match=r"extra_body sets max_tokens, model, which the judge sets itself"):
        JudgeReward(base_url=judge.url, extra_body={"model": "other", "max_tokens": 9})
