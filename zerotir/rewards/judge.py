"""``judge``: an LLM judges each answer against the reference, over an OpenAI-compatible endpoint (a vLLM server,
``vllm serve <model>``, or any ``/v1/chat/completions``).

The prompt is ``template`` with ``{question}``, ``{answer}`` (the reference) and ``{response}``; the judge answers
with a verdict word, the last ``CORRECT`` / ``INCORRECT`` of its reply (case-insensitive). CORRECT scores 1 and
counts as correct, INCORRECT 0; a reply with neither is a parse failure: 0, not correct, counted
(``pipeline/judge_parse_failures``). A truncated response scores 0 without a call (the paper's rule).

``mode: fallback`` asks the judge only where math-verify cannot read the final answer (no boxed answer, or one it
does not parse): math-verify's verdict stands wherever it can give one, the judge covers the rest (text answers,
unusual notation). Calls run at most ``max_concurrency`` at a time (64 by default, so that a batch of
thousands of responses does not queue behind a handful of calls). A call that times out or meets a busy or broken
server (408, 429, 5xx) is tried again up to ``retries`` times after an exponential backoff with jitter (or the
server's ``Retry-After``), then scores 0 (``pipeline/judge_errors``); a request too long for the judge's context
scores 0 (``pipeline/judge_overlong``); a refusal no retry fixes (a key, a model name, a chat template) stops the
run naming the setting (``zerotir.rewards.judge_http``). The scores given without a verdict are the step's
``pipeline/judge_failures``, said in one line per step, never one per call.

Verdicts are kept in a bounded LRU cache (``cache_size`` entries, keyed by a hash of question and response): a
repeated response (greedy evaluation, a collapsed group) costs no call, and a reply without a verdict or a request
too long is not asked again. ``start`` checks the endpoint before step 1: it answers, serves ``model``, and
completes one token of a chat; each failure names its cause and setting.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import re
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zerotir.rewards.judge_http import (
    backoff_wait, chat_body, check_endpoint, over_long, passing, refusal, retry_after_s,
)
from zerotir.rewards.math import MathReward
from zerotir.rewards.protocol import Reward, Sample, Score

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "You grade a student's answer to a math problem against the reference answer.\n\n"
    "Problem:\n{question}\n\nReference answer:\n{answer}\n\nStudent's response:\n{response}\n\n"
    "Is the student's final answer equivalent to the reference answer? Reply with one word: CORRECT or INCORRECT.")
_VERDICT = re.compile(r"\b(CORRECT|INCORRECT)\b", re.IGNORECASE)
_COUNTERS = ("judge_asked", "judge_calls", "judge_cache_hits", "judge_parse_failures", "judge_overlong",
             "judge_errors")
_FAILURES = ("judge_parse_failures", "judge_overlong", "judge_errors")  # scored 0 without a verdict
_OVERLONG, _FAILED = object(), object()  # a call's outcome without a reply: too long for the judge; every try failed
_sleep = asyncio.sleep  # the backoff's wait (a test records the waits instead of spending them)


_REQUEST_FIELDS = ("model", "messages", "max_tokens", "temperature")  # what each call sets itself


@dataclass(frozen=True, eq=False)
class JudgeReward(Reward):
    """An LLM judge over an OpenAI-compatible endpoint (docs/rewards.md)."""

    concurrent_calls: ClassVar[bool] = True  # its calls share one bound, ``max_concurrency``, per event loop

    base_url: str = "http://127.0.0.1:8000/v1"
    """The endpoint, up to ``/v1`` (``/chat/completions`` and ``/models`` are appended)."""
    model: str = "judge"
    """The model name the server serves (``vllm serve <path> --served-model-name judge``)."""
    api_key_env: str | None = None
    """An environment variable holding the API key (sent as a bearer token); None: no key."""
    template: str = DEFAULT_TEMPLATE
    """The judge's prompt, with ``{question}``, ``{answer}`` and ``{response}``."""
    mode: Literal["always", "fallback"] = "always"
    """"always": every response is judged; "fallback": only where math-verify cannot read the answer."""
    max_concurrency: int = 64
    """Judge calls in flight at most (the HTTP client's connection pool is sized to it). A step's calls take about
    latency x calls / max_concurrency seconds: 2048 calls of 0.5 s take 16 s at 64 and 128 s at 8, so set it to
    what the server takes at once (a vLLM server batches a few hundred requests; a hosted API: its rate limit)."""
    timeout_s: float = 60.0
    """Seconds one call may take."""
    retries: int = 2
    """Further tries of a call that timed out or met a busy or broken server (408, 429, 5xx, connection lost)."""
    backoff_s: float = 1.0
    """The wait before the first retry, doubled at each next one, with jitter (half to all of it)."""
    max_backoff_s: float = 30.0
    """The longest wait before a retry, a server's ``Retry-After`` included."""
    cache_size: int = 10000
    """Verdicts kept (least recently used dropped first; a few dozen bytes each); 0: no cache."""
    max_tokens: int = 16
    """The judge's reply budget (the verdict is one word; more for a judge that reasons first)."""
    extra_body: dict[str, Any] | None = None
    """Fields added to every chat completion the judge asks for, the check at start's included: the server's own
    options, e.g. vLLM's ``chat_template_kwargs: {enable_thinking: false}``, or ``chat_template`` for a base model
    served without one (vLLM takes it with ``--trust-request-chat-template``). None: none."""

    def __post_init__(self) -> None:
        missing = [k for k in ("{question}", "{answer}", "{response}") if k not in self.template]
        if missing:
            raise ValueError(f"model.reward.init_args.template lacks {', '.join(missing)}: the judge must see the "
                             "problem, the reference and the response")
        if self.mode not in ("always", "fallback"):
            raise ValueError(f"model.reward.init_args.mode={self.mode!r}: choose 'always' or 'fallback'")
        for name, low in (("max_concurrency", 1), ("retries", 0), ("max_tokens", 1), ("cache_size", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"model.reward.init_args.{name}={getattr(self, name)}: must be >= {low}")
        for name in ("timeout_s", "backoff_s", "max_backoff_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.reward.init_args.{name}={getattr(self, name)}: must be > 0 seconds")
        taken = sorted(set(self.extra_body or {}) & set(_REQUEST_FIELDS))
        if taken:
            raise ValueError(f"model.reward.init_args.extra_body sets {', '.join(taken)}, which the judge sets itself "
                             f"({', '.join(_REQUEST_FIELDS)}): use model, max_tokens or template, or drop them")
        if self.api_key_env is not None and self.api_key_env not in os.environ:
            raise ValueError(f"model.reward.init_args.api_key_env={self.api_key_env!r}: that environment variable "
                             "is not set; export it or set api_key_env to null")
        object.__setattr__(self, "_cache", OrderedDict())
        object.__setattr__(self, "_rng", random.Random())
        object.__setattr__(self, "_counts", dict.fromkeys(_COUNTERS, 0))
        object.__setattr__(self, "_gates", weakref.WeakKeyDictionary())  # per event loop: its calls' bound
        object.__setattr__(self, "_ssl", None)  # the TLS context of every call, made at the first

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {os.environ[self.api_key_env]}"} if self.api_key_env else {}

    def _tls(self) -> Any:
        """One TLS context for every call (httpx's own default, certifi's CAs): a client building its own loads
        the CA bundle again, ~35 ms of CPU per ``score`` call, and ``EarlyScores`` makes one per group."""
        if self._ssl is None:
            import ssl

            import certifi

            object.__setattr__(self, "_ssl", ssl.create_default_context(cafile=certifi.where()))
        return self._ssl

    def start(self) -> None:
        """Before step 1: the endpoint answers, serves ``model`` and completes a chat (``judge_http.check_endpoint``);
        each failure is an error naming its cause and setting."""
        check_endpoint(self.base_url, self.model, self.api_key_env, self._headers(), self.timeout_s, self.extra_body)

    def stats(self) -> dict[str, float]:
        """The judge's counts since the last call (one step): responses asked, calls made (retries included), cache
        hits, and the scores given without a verdict (``judge_failures``: no verdict word, too long, every try
        failed), said in one line when there are any."""
        counts = {name: float(value) for name, value in self._counts.items()}
        counts["judge_failures"] = failures = sum(counts[name] for name in _FAILURES)
        if failures:
            log.warning("judge: %d of %d responses asked scored 0 without a verdict (%d replies without "
                        "CORRECT / INCORRECT, %d too long for the judge, %d failed after %d tries; %d calls)",
                        failures, counts["judge_asked"], counts["judge_parse_failures"], counts["judge_overlong"],
                        counts["judge_errors"], self.retries + 1, counts["judge_calls"])
        self._counts.update(dict.fromkeys(_COUNTERS, 0))
        return counts

    async def score(self, samples: Sequence[Sample]) -> list[Score]:
        import httpx

        ask = [not s.truncated for s in samples]
        scores = [Score(0.0, False)] * len(samples)
        if self.mode == "fallback":
            math = MathReward()
            scores = await math.score(samples)
            readable = await math.parses(samples)
            ask = [a and not read for a, read in zip(ask, readable)]
        loop = asyncio.get_running_loop()
        if loop not in self._gates:
            self._gates[loop] = asyncio.Semaphore(self.max_concurrency)
        gate = self._gates[loop]
        pool = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers(), limits=pool,
                                     verify=self._tls()) as client:
            verdicts = await asyncio.gather(*(self._verdict(client, gate, s) for s, a in zip(samples, ask) if a))
        found = iter(verdicts)  # in the order of the asked samples
        out = []
        for score, asked in zip(scores, ask):
            if not asked:
                out.append(score)
                continue
            verdict = next(found)  # None: the judge gave no verdict, which is no fault of the model's
            out.append(Score(0.0, False, infra_failed=True) if verdict is None else Score(float(verdict), verdict))
        return out

    async def _verdict(self, client: Any, gate: asyncio.Semaphore, sample: Sample) -> bool | None:
        """Whether the judge says ``sample`` is correct: from the cache, else one call (retried); None when it gave
        no verdict (every try failed, the request was too long for it, its reply named none)."""
        key = hashlib.sha256(f"{sample.question}\0{sample.response}".encode()).digest()
        if key in self._cache:
            self._counts["judge_cache_hits"] += 1
            self._cache.move_to_end(key)
            return self._cache[key]
        self._counts["judge_asked"] += 1
        prompt = self.template.format(question=sample.question, answer=sample.answer, response=sample.response)
        async with gate:
            reply = await self._call(client, prompt)
        if reply is _FAILED:  # a passing failure: asked again when the response comes back
            return None
        found = _VERDICT.findall(reply) if isinstance(reply, str) else []
        if reply is not _OVERLONG and not found:
            self._counts["judge_parse_failures"] += 1
            log.debug("judge: no CORRECT / INCORRECT in its reply %r; scored 0", reply[:200])
        verdict = found[-1].upper() == "CORRECT" if found else None
        self._remember(key, verdict)  # a reply without a verdict, a request too long: the same again if asked
        return verdict

    def _remember(self, key: bytes, verdict: bool | None) -> None:
        if self.cache_size:
            self._cache[key] = verdict
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    async def _call(self, client: Any, prompt: str) -> Any:
        """The judge's reply text; ``_OVERLONG`` when the request is too long for it; ``_FAILED`` when every try
        timed out or met a busy or broken server. Raises ``RuntimeError`` for a refusal no retry fixes."""
        import httpx

        body = chat_body(self.model, prompt, self.max_tokens, self.extra_body)
        url = self.base_url.rstrip("/") + "/chat/completions"
        for attempt in range(self.retries + 1):
            self._counts["judge_calls"] += 1
            wait_asked = None
            try:
                response = await client.post(url, json=body)
            except httpx.TransportError as error:  # timeouts, refused or lost connections
                log.debug("judge: try %d of %d failed (%s)", attempt + 1, self.retries + 1, type(error).__name__)
            else:
                status = response.status_code
                if status < 400:
                    return str(response.json()["choices"][0]["message"]["content"] or "")
                if over_long(status, response.text):
                    self._counts["judge_overlong"] += 1
                    return _OVERLONG
                if not passing(status):
                    raise RuntimeError(refusal(status, response.text, self.model, self.base_url, self.api_key_env))
                wait_asked = retry_after_s(response.headers.get("Retry-After"))
                log.debug("judge: try %d of %d: status %d", attempt + 1, self.retries + 1, status)
            if attempt < self.retries:
                await _sleep(backoff_wait(attempt, wait_asked, self.backoff_s, self.max_backoff_s, self._rng))
        self._counts["judge_errors"] += 1
        return _FAILED
