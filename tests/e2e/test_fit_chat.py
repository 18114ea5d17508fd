"""``fit`` with ``model.tool.format: chat`` on each engine: a tiny Qwen2 with a Qwen2.5-style chat template (built
in the test, ``tests.rollout.chat_model``) that memorised a transcript calling the calculator through the template's
tool turns, on prompts the data's chat template builds with the tools' schemas. Two RL steps run, the model calls the
tool in its rollouts and answers right (the tool turns it reads are the ones it memorised). When training starts, the run's own engine writes the memorised chat
and hermes transcripts through the loop token for token (``RoundTrips``: on vLLM, one engine start serves both)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import cli_args, read_scalars, run_cli
from lightning.pytorch import Callback

from tests.rollout.test_agent_loop_chat import CHAT_DOC, assert_round_trips, memorised_qwen2
from zerotir import metric_names as mn

pytestmark = [pytest.mark.slow]

VLLM = {"class_path": "zerotir.config.VLLMRollout",
        "init_args": {"dtype": "float32", "max_model_len": 512, "cpu_kv_cache_gib": 0.25}}


@pytest.fixture(scope="module")
def chat_base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat_qwen2_base")
    memorised_qwen2(folder)
    return folder


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    """The memorised question, as training and held-out rows."""
    folder = tmp_path_factory.mktemp("chat_data")
    rows = "".join(json.dumps({"id": f"q{i}", "problem": "2*3+1?", "answer": "7"}) + "\n" for i in range(8))
    (folder / "train.jsonl").write_text(rows)
    return {"train": folder / "train.jsonl", "heldout": folder / "train.jsonl"}


class RoundTrips(Callback):
    """When training starts (the engine holds the memorised base): the chat, hermes and fences formats round-trip on
    the run's engine (``assert_round_trips``); ``path`` is written after they did."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        assert_round_trips(pl_module.source.engine)
        with open(self.path, "w") as f:
            f.write(type(pl_module.source.engine).__name__)


def fit_chat(base, data, root, *extra: str) -> None:
    """Two RL steps with the chat format; the prompts are the template's with the tools, the model calls them."""
    cli = run_cli(cli_args(
        "fit", "tiny_cpu_grpo", base, data, root, "--trainer.max_steps", "2",
        "--trainer.limit_val_batches", "0", "--trainer.enable_checkpointing", "false",
        "--data.template", "chat", "--data.max_prompt_tokens", "320", "--model.sampling.max_response_tokens", "160",
        "--model.tool.format", "chat", "--model.tool.tools", json.dumps([{"class_path": "calculator"}]),
        "--trainer.callbacks+=tests.e2e.test_fit_chat.RoundTrips", "--trainer.callbacks.path", str(root / "trips"),
        *extra))
    assert cli.model.rl_steps_done == 2
    assert (root / "trips").read_text() == ("VLLMEngine" if extra else "HFEngine")
    assert [row["prompt_ids"] for row in cli.datamodule.train_rows] == [CHAT_DOC[0]] * 8  # the template + tools
    scalars = read_scalars(root / "tensorboard")
    assert [s for s, _ in scalars[mn.REWARD_MEAN]] == [1, 2]
    assert max(v for _, v in scalars[mn.REWARD_MEAN]) > 0  # it answered right after the tool turns
    assert sum(v for _, v in scalars[mn.tool_tag("calculator", "calls")]) > 0


def test_fit_with_the_chat_format_on_the_transformers_engine(chat_base, chat_data, tmp_path):
    fit_chat(chat_base, chat_data, tmp_path)


@pytest.mark.vllm
@pytest.mark.usefixtures("needs_vllm")
def test_fit_with_the_chat_format_on_vllm(chat_base, chat_data, tmp_path):
    fit_chat(chat_base, chat_data, tmp_path, "--model.rollout", json.dumps(VLLM))
