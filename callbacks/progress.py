"""The progress of a ZeroTIR run as a person reads it: RL step k of N with its reward and tool use.

Lightning's bars describe the training loop by epoch ("Epoch 0/-2" for a run bounded by ``trainer.max_steps``) and
by batches of the current epoch (``14/3`` right after a resume), show only what was logged to the bar, and, without
a terminal, print once at the end. A ZeroTIR run's prompt stream has no epochs that mean anything to its user: one
RL step is one training batch, and what the user watches is whether the reward and the tool use go up.

This bar counts RL steps from each step's ``StepResult`` (``outputs["step"]``), so a resumed run goes on from its
checkpoint's step, and the ETA is measured on this process's steps (``zerotir.cli.console.StepDisplay``). In a terminal
it is a live bar, ended before a validation (whose report then prints on lines of its own); without one (a pipe,
``nohup``, CI) it prints one line per RL step and per evaluation batch. Reward and tool use (the share of responses
that called a tool) are rank 0's trajectories; with several tools, each tool's share follows, the configured ones
(``tools``) and any other called so far shown every step, 0% when not called. The CLI adds this bar, given the
run's tools, unless the config names another progress bar or turns the bar off.
"""

from __future__ import annotations

from typing import Any, TextIO

from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from lightning.pytorch.trainer.states import TrainerFn

from zerotir.cli.console import StepDisplay, percent
from zerotir.rl.step import StepResult


def rl_step_description(max_steps: int | None) -> str:
    """``"RL steps"``, with the bound when the run has one (``max_steps`` of -1 means none)."""
    return "RL steps" if max_steps is None or max_steps < 0 else f"RL steps (of {max_steps})"


def rl_step_total(max_steps: int, global_step: int, rl_step: int) -> int | None:
    """The RL step the run ends at: ``max_steps`` counts optimizer steps, of which each RL step makes
    ``global_step / rl_step`` (``ppo_epochs * num_mini_batches``; see ``zerotir.module``). None: no bound."""
    if max_steps is None or max_steps < 0:
        return None
    if global_step <= 0 or rl_step <= 0:
        return max_steps
    return max_steps * rl_step // global_step


def with_called_tools(tools: list[str], rollout: Any) -> list[str]:
    """``tools`` followed by any other tool name that a call of ``rollout`` (``Trajectories``) went to."""
    return list(dict.fromkeys([*tools, *(call.tool for row in rollout.tool_calls for call in row if call.tool)]))


def step_fields(result: StepResult, tools: list[str] | None = None) -> dict[str, str]:
    """What the bar shows of a step: mean reward, the share of responses that called a tool, and with more than one
    tool (``tools``, and any other the step called) each one's share of the responses that called it."""
    rollout = result.rollout
    if len(rollout) == 0:
        return {}
    fields = {"reward": f"{float(rollout.rewards.float().mean()):.2f}",
              "tool use": percent(float((rollout.num_calls > 0).float().mean()))}
    names = with_called_tools(list(tools or []), rollout)
    if len(names) > 1:
        rows = rollout.tool_calls
        fields.update({name: percent(sum(any(c.tool == name for c in row) for row in rows) / len(rows))
                       for name in names})
    return fields


class RLStepProgressBar(ProgressBar):
    """RL step k of N, reward and tool use: a live bar in a terminal, a line per step otherwise.

    Args:
        lines: True prints lines, False draws a live bar; default: lines unless ``stream`` is a terminal.
        stream: where the progress goes (default: stderr).
        tools: the names of the run's tools: with more than one, each is shown every step (0% when not called).
    """

    def __init__(self, lines: bool | None = None, stream: TextIO | None = None, tools: list[str] | None = None) -> None:
        super().__init__()
        self.tools = list(tools or [])  # grows with any other tool a step called (an MCP server's)
        self._enabled = True
        self._terminal = None if lines is None else not lines
        self._stream = stream
        self._train: StepDisplay | None = None
        self._eval: StepDisplay | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``LightningModule.print``: a line of its own, above a live bar."""
        display = self._eval or self._train
        if display is None or kwargs:
            super().print(*args, **kwargs)
        else:
            display.line(" ".join(str(a) for a in args))

    def _display(self, name: str) -> StepDisplay:
        return StepDisplay(name, stream=self._stream, terminal=self._terminal)

    # ----- training -----
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not self._enabled:
            return
        self._train = self._display("RL step")
        if trainer.global_step > 0:  # the RL step follows from the first step's result
            self._train.line(f"resumed after {trainer.global_step} optimizer steps; "
                             f"{rl_step_description(trainer.max_steps)}")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._train is None:
            return
        result = outputs["step"]
        total = rl_step_total(trainer.max_steps, trainer.global_step, result.rl_step)
        self.tools = with_called_tools(self.tools, result.rollout)
        self._train.update(result.rl_step, total, step_fields(result, self.tools))
        if total is not None and result.rl_step >= total:
            self._train.close()  # Lightning's "max_steps reached" line comes next, on a line of its own

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._train is not None:
            self._train.close()
            self._train = None

    # ----- validation and test: a line per batch, one display per run -----
    def _eval_start(self) -> None:
        if self._train is not None:
            self._train.close()  # the validation's output below the bar, not glued to it
        self._eval = None
        self.reset_dataloader_idx_tracker()

    def _eval_batch(self, name: str, batch_idx: int, dataloader_idx: int) -> None:
        if not self._enabled:
            return
        if self.has_dataloader_changed(dataloader_idx) or self._eval is None:  # one display per dataloader
            if self._eval is not None:
                self._eval.close()
            self._eval = self._display(f"{name} batch")
        total = (self.total_test_batches_current_dataloader if name == "test"
                 else self.total_val_batches_current_dataloader)
        self._eval.update(batch_idx + 1, None if total == float("inf") else int(total))

    def _eval_end(self) -> None:
        if self._eval is not None:
            self._eval.close()
            self._eval = None

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_start()

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        name = "validation" if trainer.state.fn == TrainerFn.FITTING else "validate"
        self._eval_batch(name, batch_idx, dataloader_idx)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._eval_end()

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_start()

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._eval_batch("test", batch_idx, dataloader_idx)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._eval_end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        for display in (self._train, self._eval):
            if display is not None:
                display.close()
