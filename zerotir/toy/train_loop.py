"""The toy-base optimizer loop: AdamW on packed rows with a warmup-stable-decay schedule whose decay starts when the
copy probe passes (or at the step cap's last ``decay_steps``).

Why this schedule: the skills the base needs (restating the question, writing it into ``print(...)``, copying the
tool output into the box) arrive as a sudden transition whose step varies with the seed. A high learning rate until
it has happened brings it on sooner; a short decay then consolidates it. Waiting for the probe instead of a fixed
step count makes every seed give a usable base, in as few steps as that seed needs.

The schedule depends on steps and the probe only, never on wall time: a slow or loaded machine takes longer and
builds the same base (a budget in minutes once moved the decay earlier when the first steps were slow, and a loaded
machine then built a base that had not learned to copy).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from zerotir.cli.console import StepDisplay
from zerotir.toy.probe import ProbeSet, run_probe

log = logging.getLogger(__name__)


@dataclass
class Schedule:
    """Learning rate per step: linear warmup, ``lr`` held, then a linear decay to ``lr / 10`` over ``decay_steps``.

    ``decay_start`` is where the decay begins; it starts at the latest possible step (``max_steps - decay_steps``) and
    moves earlier when :meth:`start_decay` is called. Training ends at ``decay_start + decay_steps``.
    """

    lr: float
    warmup_steps: int
    decay_steps: int
    max_steps: int
    decay_start: int = -1
    decay_reason: str = "max_steps"

    def __post_init__(self) -> None:
        if self.decay_start < 0:
            self.decay_start = max(0, self.max_steps - self.decay_steps)

    @property
    def end(self) -> int:
        return min(self.max_steps, self.decay_start + self.decay_steps)

    def start_decay(self, step: int, reason: str) -> None:
        """Begin the decay at ``step`` (no effect once the decay has begun)."""
        if step < self.decay_start:
            self.decay_start, self.decay_reason = step, reason

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if step < self.decay_start:
            return self.lr
        left = max(0, self.end - step) / max(1, self.end - self.decay_start)
        return self.lr * (0.1 + 0.9 * left)


@dataclass
class LoopSettings:
    """The loop's knobs (a subset of ``PretrainSettings``)."""

    pad_id: int
    probe_every: int
    probe_threshold: float
    show_progress: bool = True
    minutes: float = 0.0  # wall-time limit, 0 = none: reaching it raises TimeLimitReached, it never moves the decay


class TimeLimitReached(ValueError):
    """The build reached ``toy_base.minutes`` before its schedule ended (a base cut by the clock is not written)."""


@dataclass
class LoopRecord:
    """What happened: per-step losses, trained (non-pad) tokens, seconds, probe results ``(step, result)``."""

    losses: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    probes: list[tuple[int, dict[str, float]]] = field(default_factory=list)


class _Progress:
    """What a person sees of the loop: ``zerotir.cli.console.StepDisplay`` (a live bar in a terminal, a line per 100
    steps and at least one per 8 s in a log, each probe result on a line of its own), or, with ``show_progress``
    off, log messages (the probes, and every 100 steps)."""

    def __init__(self, show: bool) -> None:
        self.display = StepDisplay("toy-base", every=100, quiet_s=8.0) if show else None

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.display is not None:
            self.display.close()

    def note(self, text: str) -> None:
        if self.display is not None:
            self.display.line(text)
        else:
            log.info(text)

    def step(self, done: int, total: int, loss: float) -> None:
        if self.display is not None:
            self.display.update(done, total, {"loss": f"{loss:.3f}"})
        elif done % 100 == 0:
            log.info("toy-base: step %d/%d loss %.3f", done, total, loss)


def _probe_text(result: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in result.items())


def train(model: torch.nn.Module, batches: Iterable[torch.Tensor], sched: Schedule, cfg: LoopSettings,
          probe: ProbeSet | None) -> LoopRecord:
    """Run the loop until ``sched.end``; ``sched`` is updated in place (its decay start, when the probe passes)."""
    opt = torch.optim.AdamW(model.parameters(), lr=sched.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rec, start = LoopRecord(), time.monotonic()
    rows = iter(batches)
    with _Progress(cfg.show_progress) as progress:
        step = 0
        while step < sched.end:
            _check_limit(cfg.minutes, time.monotonic() - start, step, sched)
            batch = next(rows)
            rec.losses.append(_step(model, opt, batch, sched.lr_at(step), cfg.pad_id))
            rec.tokens += int((batch != cfg.pad_id).sum())
            done = step + 1
            if probe is not None and done < sched.decay_start and done % cfg.probe_every == 0:
                result = run_probe(model, probe)
                rec.probes.append((done, result))
                progress.note(f"toy-base: step {done} copy probe {_probe_text(result)} "
                              f"(pass at both >= {cfg.probe_threshold})")
                if result["both"] >= cfg.probe_threshold:
                    sched.start_decay(done, "probe")
                    progress.note(f"toy-base: copy probe passed at step {done}; decaying until step {sched.end}")
            recent = sum(rec.losses[-20:]) / len(rec.losses[-20:])
            progress.step(done, sched.end, recent)
            step = done
    rec.seconds = time.monotonic() - start
    return rec


def _check_limit(minutes: float, elapsed: float, step: int, sched: Schedule) -> None:
    """Raise :class:`TimeLimitReached` once ``elapsed`` seconds pass ``minutes`` (0: no limit); the schedule itself
    never reads the clock."""
    if minutes and elapsed > 60 * minutes:
        where = "decaying after the copy probe passed" if sched.decay_reason == "probe" else "before the decay"
        raise TimeLimitReached(
            f"toy-base: reached toy_base.minutes={minutes:g} (--minutes of `python -m zerotir toy-base`) at step "
            f"{step} of {sched.end}, {where}; a base cut by the clock would depend on the machine's load, so none "
            "is written. Raise toy_base.minutes, or set it to 0 (no limit)")


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor, lr: float, pad_id: int) -> float:
    """One optimizer step on a packed batch (loss on every real token); returns the loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    real = batch != pad_id
    loss = model(input_ids=batch, labels=batch.masked_fill(~real, -100)).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()
