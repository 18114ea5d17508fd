"""How the judge reads its endpoint's answers (``zerotir.rewards.judge``): which failures are tried again and after
how long, which score 0, which are a configuration error naming the setting to change, and the check at start.

An OpenAI-compatible server (vLLM's, or a hosted one) answers a call with:

* 2xx: the reply;
* 408, 429, 5xx (or no answer: a timeout, a lost connection): a passing condition, tried again after an exponential
  backoff with jitter, or after the server's ``Retry-After`` when it says one;
* 400 whose message speaks of the context length: this one request is too long for the judge (a long response);
  it scores 0 and counts as a judge failure, the run goes on;
* 400 about a chat template (vLLM serving a base model without ``--chat-template``), 401 / 403 (the key), 404 (the
  model name or the path), any other 4xx: every later call would fail the same way, so the run stops naming the fix.
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from typing import Any

FIELD = "model.reward.init_args"
_CHAT_TEMPLATE = re.compile(r"chat[ _-]?template", re.IGNORECASE)
_CONTEXT = re.compile(r"maximum context length|context[ _]length[ _]exceeded|maximum model length|max_model_len",
                      re.IGNORECASE)
# What the check at start asks: one token of a chat completion (the chat template and the model's name at work).
PROBE = "Reply with one word: CORRECT."


def passing(status: int) -> bool:
    """A status worth another try: the server is busy or broke this once (408, 429, 5xx)."""
    return status in (408, 429) or status >= 500


def over_long(status: int, body: str) -> bool:
    """The request alone is too long for the judge's context (a 400 saying so): score 0, not the end of the run."""
    return status == 400 and _CONTEXT.search(body) is not None


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` header asks to wait (a number of seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_wait(attempt: int, retry_after: float | None, base: float, cap: float, rng: random.Random) -> float:
    """The wait before try ``attempt + 2`` (``attempt`` counts from 0): ``base * 2**attempt`` with jitter (a uniform
    draw between half and all of it), at most ``cap``; a server's ``Retry-After`` wins when it is longer (itself at
    most ``cap``, so a server cannot park the rollout for an hour)."""
    jittered = min(cap, base * 2 ** attempt) * rng.uniform(0.5, 1.0)
    return jittered if retry_after is None else max(jittered, min(retry_after, cap))


def refusal(status: int, body: str, model: str, base_url: str, api_key_env: str | None) -> str:
    """What a response that no retry will fix means, naming the setting to change (module doc)."""
    said = f"{status}: {body[:300]}"
    if _CHAT_TEMPLATE.search(body):
        return (f"the judge at {FIELD}.base_url={base_url!r} cannot format a chat for {model!r}: its tokenizer has "
                f"no chat template ({said}); start the server with a chat template (--chat-template), or judge with "
                "an instruct model")
    if status in (401, 403):
        if api_key_env:
            return (f"the judge at {base_url!r} refused the key in ${api_key_env} ({said}): put a valid key in it, "
                    f"or point {FIELD}.api_key_env={api_key_env!r} at a variable holding one")
        return (f"the judge at {base_url!r} wants a key ({said}) and none is sent: set {FIELD}.api_key_env to an "
                "environment variable holding it")
    if status == 404:
        return (f"the judge at {base_url!r} does not serve {FIELD}.model={model!r}, or has no such path ({said}): "
                f"set model to a name it serves (GET {base_url.rstrip('/')}/models lists them) and base_url up to /v1")
    return f"the judge at {base_url!r} refused the call ({said}): check {FIELD}.model={model!r} and the server"


def served_models(payload: Any) -> list[str]:
    """The model names of a ``GET /models`` answer (``{"data": [{"id": ...}, ...]}``)."""
    data = payload.get("data") if isinstance(payload, dict) else None
    return [str(m["id"]) for m in data or () if isinstance(m, dict) and "id" in m]


def chat_body(model: str, prompt: str, max_tokens: int, extra_body: dict[str, Any] | None) -> dict[str, Any]:
    """One greedy chat completion request of the judge: ``extra_body``'s fields, then the judge's own."""
    return {**(extra_body or {}), "model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0.0}


def check_endpoint(base_url: str, model: str, api_key_env: str | None, headers: dict[str, str],
                   timeout: float, extra_body: dict[str, Any] | None = None) -> None:
    """The check at start: the endpoint answers, serves ``model``, and completes one token of a chat with it (the
    request carrying ``extra_body``, as every call of the judge does).

    Raises:
        RuntimeError: naming the setting behind the failure (``base_url``, ``model`` with the served names,
            ``api_key_env``, or the server's missing chat template).
    """
    import httpx

    root = base_url.rstrip("/")
    try:
        listed = httpx.get(root + "/models", headers=headers, timeout=timeout)
        if listed.status_code < 400:
            served = served_models(listed.json())
            if model not in served:
                raise RuntimeError(f"{FIELD}.model={model!r} is not served at {base_url!r}; it serves: "
                                   f"{', '.join(served) or 'nothing'}: set model to one of them (or start the server "
                                   f"with --served-model-name {model})")
            answered = httpx.post(root + "/chat/completions", json=chat_body(model, PROBE, 1, extra_body),
                                  headers=headers, timeout=timeout)
    except (httpx.HTTPError, ValueError) as error:
        raise RuntimeError(f"the judge at {FIELD}.base_url={base_url!r} does not answer ({type(error).__name__}: "
                           f"{error}): start the server (e.g. `vllm serve <model> --served-model-name judge`) or "
                           "point base_url at it") from error
    failed = listed if listed.status_code >= 400 else answered
    if failed.status_code >= 400:
        raise RuntimeError(refusal(failed.status_code, failed.text, model, base_url, api_key_env))
