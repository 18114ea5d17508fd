"""Tests of the staged toy-base build: a finished pretraining outlives a failed or interrupted build, the vLLM base
is the shipped one widened, and every stage says what it does."""

import dataclasses
import io
import json
from pathlib import Path

import pytest

from zerotir.cli.console import StepDisplay
from zerotir.toy import pretrain, worlds
from zerotir.toy.base_folder import verify_checksums
from zerotir.toy.base_stats import PROGRESS_EVERY, ReportingEngine
from zerotir.toy.pretrain import PretrainSettings, ensure_toy_base, read_info
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

REPO = Path(__file__).resolve().parents[2]
SETTINGS = dict(steps=4, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, heldout_n=16, eval_n=4)


@pytest.fixture
def stages(monkeypatch):
    """A pretraining that saves a random tiny model (what is kept is the point, not training), and a measurement;
    each counts its calls and does what ``plan`` says (a value, or an exception to raise)."""
    calls = {"pretrain": 0, "measure": 0}
    plan = {"pretrain": {"steps_done": 4}, "measure": {"code_rate": 0.1}}

    def run(name, value):
        calls[name] += 1
        if isinstance(plan[name], BaseException):
            raise plan[name]
        return value

    def fake_pretrain(s, out_dir, show_progress):
        build_tiny_model(build_byte_tokenizer(), save_dir=out_dir, hidden_size=16, num_layers=1, num_heads=2)
        return run("pretrain", {**plan["pretrain"], "steps_done": s.steps})

    monkeypatch.setattr(pretrain, "pretrain", fake_pretrain)
    world = worlds.WORLDS["products"]
    monkeypatch.setitem(worlds.WORLDS, "products",
                        dataclasses.replace(world, measure=lambda path, s, show: run("measure", plan["measure"])))
    return calls, plan


def test_an_interrupted_build_keeps_the_finished_pretraining_and_a_rerun_starts_from_it(tmp_path, stages, capsys):
    calls, plan = stages
    plan["measure"] = KeyboardInterrupt()  # Ctrl-C (SIGTERM unwinds the same way) in the statistics
    with pytest.raises(KeyboardInterrupt):
        ensure_toy_base(tmp_path / "base", **SETTINGS)
    kept = tmp_path / ".base.pretrained"
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept.name]  # no base, no temporary folder
    verify_checksums(kept)
    assert (kept / "model.safetensors").is_file() and read_info(kept)["record"] == {"steps_done": 4}
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("toy-base:")]
    assert [line.split(" (")[0].split(";")[0] for line in lines] == [
        f"toy-base: pretraining {tmp_path / 'base'}", "toy-base: pretraining done",
        "toy-base: measuring the base on 4 held-out questions"]
    assert str(kept) in lines[1]

    plan["pretrain"], plan["measure"] = AssertionError("pretrained again"), {"code_rate": 0.1}
    ensure_toy_base(tmp_path / "base", **SETTINGS)
    assert calls == {"pretrain": 1, "measure": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]  # the kept pretraining is gone once used
    verify_checksums(tmp_path / "base")
    assert read_info(tmp_path / "base")["record"] == {"steps_done": 4, "base_stats": {"code_rate": 0.1}}
    err = capsys.readouterr().err
    assert f"starting from the finished pretraining kept in {kept}" in err and "base is complete" in err


def test_a_failure_after_the_statistics_keeps_them_too(tmp_path, stages, monkeypatch):
    calls, _ = stages
    with monkeypatch.context() as m, pytest.raises(OSError, match="disk full"):
        m.setattr("zerotir.toy.build._copy_model", lambda src, dst: (_ for _ in ()).throw(OSError("disk full")))
        ensure_toy_base(tmp_path / "base", show_progress=False, **SETTINGS)
    ensure_toy_base(tmp_path / "base", show_progress=False, **SETTINGS)
    assert calls == {"pretrain": 1, "measure": 1}


def test_a_kept_pretraining_of_other_settings_is_replaced(tmp_path, stages):
    calls, plan = stages
    plan["measure"] = RuntimeError("sandbox down")
    with pytest.raises(RuntimeError):
        ensure_toy_base(tmp_path / "base", show_progress=False, **SETTINGS)
    plan["measure"] = {}
    ensure_toy_base(tmp_path / "base", show_progress=False, **{**SETTINGS, "steps": 3})
    assert calls["pretrain"] == 2 and read_info(tmp_path / "base")["record"]["steps_done"] == 3


def test_the_vllm_base_is_the_shipped_one_widened_without_pretraining(tmp_path, stages, capsys):
    calls, _ = stages
    out = ensure_toy_base(tmp_path / "vllm", serve_head_dim=32)
    assert calls == {"pretrain": 0, "measure": 0}
    verify_checksums(out)
    config = json.loads((out / "config.json").read_text())
    assert (config["num_attention_heads"], config["head_dim"], config["hidden_size"]) == (8, 32, 128)
    info, shipped = read_info(out), read_info(REPO / "data" / "toy_base")
    assert info["settings"] == PretrainSettings(serve_head_dim=32).identity()
    assert info["record"]["base_stats"] == shipped["record"]["base_stats"]
    widened = info["record"]["heads_widened"]
    assert widened["from"] == "data/toy_base" and widened["from_sha256sums"] == (
        REPO / "data" / "toy_base" / "SHA256SUMS").read_text().splitlines()
    assert "the shipped data/toy_base is this pretraining" in capsys.readouterr().err
    assert ensure_toy_base(out, serve_head_dim=32) == out and calls["pretrain"] == 0  # reused as it is


def test_serve_head_dim_must_be_a_multiple_of_the_pretrained_head():
    with pytest.raises(ValueError, match=r"serve_head_dim=24: must be 0 .* a multiple of the pretrained head size 16"):
        PretrainSettings(serve_head_dim=24)


class _Idle:
    """An engine with one request that runs for ever."""

    num_running, context_length = 1, 64

    def step(self):
        return []


def test_the_base_statistics_report_a_line_per_bounded_number_of_engine_steps():
    stream, now = io.StringIO(), [0.0]
    display = StepDisplay("base stats", stream=stream, terminal=False, every=PROGRESS_EVERY, clock=lambda: now[0])
    engine = ReportingEngine(_Idle(), display)  # the clock never moves: only the step count can print
    for _ in range(3 * PROGRESS_EVERY + 1):
        engine.step()
    lines = stream.getvalue().splitlines()
    assert [line.split(" |")[0] for line in lines] == [f"base stats {k * PROGRESS_EVERY}" for k in (1, 2, 3)]
    assert engine.num_running == 1  # the rest of the protocol is the engine's
