"""Suite-wide settings and fixtures: the tests never reach the network.

``HF_HUB_OFFLINE=1`` (inherited by the subprocesses the e2e tests start) makes a hub id that slipped into a test fail
at once instead of probing the hub; the tests of ``zerotir.models`` that check the online paths unset it themselves.
``tiny_dir`` and ``train_file`` are the scripted-rollout module tests' model folder and prompts
(``tests/scripted_source.py``). The files holding a ``slow`` test run first (``pytest_collection_modifyitems``): on
the suite's two workers (scripts/test.sh) a minute-long file met last would leave one worker alone at the end.
"""

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """The files with a test marked ``slow`` first, each file's tests in their order (the sort is stable)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama (hidden 32, 2 layers) saved with the byte tokenizer; tests only read it."""
    from zerotir.toy.tiny_model import build_tiny_model
    from zerotir.toy.tokenizer import build_byte_tokenizer

    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(build_byte_tokenizer(), save_dir=path, hidden_size=32, num_layers=2, num_heads=2)
    return path


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    """Six prompts ``q0``..``q5``, "i + i" with answer 2i."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [{"id": f"q{i}", "problem": f"{i} + {i}", "answer": str(2 * i)} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
