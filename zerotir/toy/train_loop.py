"""The toy-base optimizer loop: AdamW on packed rows with a warmup-stable-decay schedule whose decay starts when the
copy probe passes (or when the step cap or the time budget says it must).

Why this schedule: the skills the base needs (restating the question, writing it into ``print(...)``, copying the
tool output into the box) arrive as a sudden transition whose step varies with the seed. A high learning rate until
it has happened brings it on sooner; a short decay then consolidates it. Waiting for the probe instead of a fixed
step count makes every seed give a usable base, in as few steps as that seed needs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

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
    minutes: float
    probe_every: int
    probe_threshold: float
    show_progress: bool = True


@dataclass
class LoopRecord:
    """What happened: per-step losses, trained (non-pad) tokens, seconds, probe results ``(step, result)``."""

    losses: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    probes: list[tuple[int, dict[str, float]]] = field(default_factory=list)


def _columns() -> tuple:
    return (TextColumn("toy-base"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn())


def train(model: torch.nn.Module, batches: Iterable[torch.Tensor], sched: Schedule, cfg: LoopSettings,
          probe: ProbeSet | None) -> LoopRecord:
    """Run the loop until ``sched.end`` or the time budget; ``sched`` is updated in place (its decay start)."""
    opt = torch.optim.AdamW(model.parameters(), lr=sched.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rec, start = LoopRecord(), time.monotonic()
    budget = 60 * cfg.minutes
    rows = iter(batches)
    with Progress(*_columns(), disable=not cfg.show_progress) as progress:
        task = progress.add_task("pretrain", total=sched.end, loss="-")
        step = 0
        while step < sched.end:
            elapsed = time.monotonic() - start
            if elapsed > budget:
                log.warning("toy-base: time budget of %.1f min reached at step %d", cfg.minutes, step)
                break
            # Leave room for the decay inside the budget: a base stopped at the peak learning rate copies badly.
            if step and elapsed + sched.decay_steps * elapsed / step > budget:
                sched.start_decay(step, "time")
            batch = next(rows)
            rec.losses.append(_step(model, opt, batch, sched.lr_at(step), cfg.pad_id))
            rec.tokens += int((batch != cfg.pad_id).sum())
            done = step + 1
            if probe is not None and done < sched.decay_start and done % cfg.probe_every == 0:
                result = run_probe(model, probe)
                rec.probes.append((done, result))
                log.info("toy-base: step %d copy probe %s (%.0f s)", done, result, time.monotonic() - start)
                if result["both"] >= cfg.probe_threshold:
                    sched.start_decay(done, "probe")
                    log.info("toy-base: copy probe passed at step %d (%s); decaying until %d", done, result, sched.end)
            recent = sum(rec.losses[-20:]) / len(rec.losses[-20:])
            progress.update(task, completed=done, total=sched.end, loss=f"{recent:.3f}")
            if not cfg.show_progress and done % 100 == 0:
                log.info("toy-base: step %d/%d loss %.3f (%.0f s)", done, sched.end, recent, elapsed)
            step = done
    rec.seconds = time.monotonic() - start
    return rec


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
