"""``judge``: an LLM judges each answer against the reference, over an OpenAI-compatible endpoint (a vLLM server,
``vllm serve <model>``, or any ``/v1/chat/completions``).

The prompt is ``template`` with ``{question}``, ``{answer}`` (the reference) and ``{response}``; the judge answers
with a verdict word, the last ``CORRECT`` / ``INCORRECT`` of its reply (case-insensitive). CORRECT scores 1 and
counts as correct, INCORRECT 0; a reply with neither is a parse failure: 0, not correct, counted
(``pipeline/judge_parse_failures``). A truncated response scores 0 without a call (the paper's rule).

``mode: fallback`` asks the judge only where math-verify cannot read the final answer (no boxed answer, or one it
does not parse): math-verify's verdict stands wherever it can give one, the judge covers the rest (text answers,
unusual notation). Calls run at most ``max_concurrency`` at a time; a call that times out or meets a server error
is retried ``retries`` times, then scores 0 (``pipeline/judge_errors``). Verdicts are cached by (question, response):
a repeated response (greedy evaluation, a collapsed group) costs no call. ``start`` asks the endpoint's model list
once before step 1: an unreachable judge stops the run there, naming the setting.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from zerotir.rollout.scoring import Reward, Sample, Score
from zerotir.rewards.math import MathReward

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "You grade a student's answer to a math problem against the reference answer.\n\n"
    "Problem:\n{question}\n\nReference answer:\n{answer}\n\nStudent's response:\n{response}\n\n"
    "Is the student's final answer equivalent to the reference answer? Reply with one word: CORRECT or INCORRECT.")
_VERDICT = re.compile(r"\b(CORRECT|INCORRECT)\b", re.IGNORECASE)
_COUNTERS = ("judge_calls", "judge_cache_hits", "judge_parse_failures", "judge_errors")


@dataclass(frozen=True, eq=False)
class JudgeReward(Reward):
    """An LLM judge over an OpenAI-compatible endpoint (docs/rewards.md)."""

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
    max_concurrency: int = 8
    """Judge calls in flight at most."""
    timeout_s: float = 60.0
    """Seconds one call may take."""
    retries: int = 2
    """Further tries of a call that timed out or met a server error (5xx, connection lost)."""
    max_tokens: int = 16
    """The judge's reply budget (the verdict is one word; more for a judge that reasons first)."""

    def __post_init__(self) -> None:
        missing = [k for k in ("{question}", "{answer}", "{response}") if k not in self.template]
        if missing:
            raise ValueError(f"model.reward.init_args.template lacks {', '.join(missing)}: the judge must see the "
                             "problem, the reference and the response")
        if self.mode not in ("always", "fallback"):
            raise ValueError(f"model.reward.init_args.mode={self.mode!r}: choose 'always' or 'fallback'")
        for name, low in (("max_concurrency", 1), ("retries", 0), ("max_tokens", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"model.reward.init_args.{name}={getattr(self, name)}: must be >= {low}")
        if self.timeout_s <= 0:
            raise ValueError(f"model.reward.init_args.timeout_s={self.timeout_s}: must be > 0 seconds")
        if self.api_key_env is not None and self.api_key_env not in os.environ:
            raise ValueError(f"model.reward.init_args.api_key_env={self.api_key_env!r}: that environment variable "
                             "is not set; export it or set api_key_env to null")
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_counts", dict.fromkeys(_COUNTERS, 0))

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {os.environ[self.api_key_env]}"} if self.api_key_env else {}

    def start(self) -> None:
        """One ``GET /models`` before step 1: an endpoint that does not answer is an error now."""
        import httpx

        url = self.base_url.rstrip("/") + "/models"
        try:
            httpx.get(url, headers=self._headers(), timeout=self.timeout_s).raise_for_status()
        except httpx.HTTPError as error:
            raise RuntimeError(f"the judge at model.reward.init_args.base_url={self.base_url!r} does not answer "
                               f"({type(error).__name__}: {error}): start the server (e.g. `vllm serve <model> "
                               "--served-model-name judge`) or point base_url at it") from error

    def stats(self) -> dict[str, float]:
        """The judge's counts since the last call (calls made, cache hits, parse failures, failed calls)."""
        counts = {name: float(value) for name, value in self._counts.items()}
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
        gate = asyncio.Semaphore(self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers()) as client:
            verdicts = await asyncio.gather(*(self._verdict(client, gate, s) for s, a in zip(samples, ask) if a))
        found = iter(verdicts)  # in the order of the asked samples
        out = []
        for score, asked in zip(scores, ask):
            verdict = next(found) if asked else None
            out.append(score if verdict is None else Score(float(verdict), verdict))
        return out

    async def _verdict(self, client: Any, gate: asyncio.Semaphore, sample: Sample) -> bool:
        """Whether the judge says ``sample`` is correct: from the cache, else one call (retried)."""
        key = (sample.question, sample.response)
        if key in self._cache:
            self._counts["judge_cache_hits"] += 1
            return self._cache[key]
        prompt = self.template.format(question=sample.question, answer=sample.answer, response=sample.response)
        async with gate:
            reply = await self._call(client, prompt)
        if reply is None:
            return False
        found = _VERDICT.findall(reply)
        if not found:
            self._counts["judge_parse_failures"] += 1
            log.warning("judge: no CORRECT / INCORRECT in its reply %r; scored 0", reply[:200])
            return False
        self._cache[key] = verdict = found[-1].upper() == "CORRECT"
        return verdict

    async def _call(self, client: Any, prompt: str) -> str | None:
        """The judge's reply text, or None when every try timed out or met a server error."""
        import httpx

        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": self.max_tokens, "temperature": 0.0}
        url = self.base_url.rstrip("/") + "/chat/completions"
        for attempt in range(self.retries + 1):
            self._counts["judge_calls"] += 1
            try:
                response = await client.post(url, json=body)
            except httpx.TransportError as error:  # timeouts, refused or lost connections
                log.warning("judge: try %d of %d failed (%s)", attempt + 1, self.retries + 1, type(error).__name__)
                continue
            if response.status_code >= 500:
                log.warning("judge: try %d of %d: status %d", attempt + 1, self.retries + 1, response.status_code)
                continue
            if response.status_code >= 400:
                raise RuntimeError(f"the judge at {url} refused the call ({response.status_code}: "
                                   f"{response.text[:200]}): check model.reward.init_args.model={self.model!r} "
                                   "and api_key_env")
            return str(response.json()["choices"][0]["message"]["content"] or "")
        self._counts["judge_errors"] += 1
        return None
