"""Reading runs for the scaling report: which folders hold TensorBoard event files, their scalars as pandas series,
the Figure-4 panels and fitted tags, and TensorBoard's smoothing. Shared by the analysis (``report``) and the
figures (``render``), so neither imports the other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from zerotir import metric_names as mn
from zerotir.scaling import fit as sf

# (key, tag, title) of the paper's Figure 4 panels, in the paper's order. The paper's model has one tool, python, so
# its "code" quantities are here the calls to any tool.
PANELS = (
    ("repeat_score", mn.REPEAT_SCORE, "avg repeat score"),
    ("response_length", mn.RESPONSE_LENGTH, "avg response length (tokens)"),
    ("raw_reward", mn.REWARD_MEAN, "raw reward avg"),
    ("calls_per_response", mn.CALLS_PER_RESPONSE, "tool calls per response (paper: code count avg)"),
    ("tool_in_correct", mn.TOOL_IN_CORRECT, "tool in correct (paper: code in correct)"),
    ("tool_call_rate", mn.TOOL_CALL_RATE, "tool-call proportion (paper: code proportion)"),
)
FITTED = (("accuracy", mn.ACCURACY, "accuracy"), ("tool_call_rate", mn.TOOL_CALL_RATE, "tool-call proportion"))
CORRELATED = (("tool_call_rate", mn.TOOL_CALL_RATE), ("response_length", mn.RESPONSE_LENGTH), ("accuracy", mn.ACCURACY))
CALL_TAGS = dict(zip(sf.CALL_BUCKETS, mn.CORRECT_BY_CALLS))
EVENT_PREFIX = "events.out.tfevents."


class ScalingInputError(ValueError):
    """A log directory that does not exist or holds no TensorBoard event file, or a bad option."""


@dataclass
class Run:
    """The scalars of one run: tag -> series of values indexed by step (the last value wins on a step logged twice)."""

    name: str
    path: Path
    scalars: dict[str, pd.Series] = field(default_factory=dict)

    def get(self, tag: str) -> pd.Series | None:
        """The series of ``tag``, or None when the run never logged it."""
        return self.scalars.get(tag)


TB_FOLDER = "tensorboard"  # where zerotir's CLI writes a run's events: <trainer.default_root_dir>/tensorboard


def _run_name(run_dir: Path, logdir: Path) -> str:
    """The run a log folder belongs to: its path relative to the logdir, without zerotir's ``tensorboard`` folder
    (``runs/toy_cpu/tensorboard`` is the run ``toy_cpu``); a lone Lightning ``version_N`` keeps its parent
    (``ppo/version_0``)."""
    parts = list(run_dir.relative_to(logdir).parts) if run_dir != logdir else []
    if parts and parts[-1] == TB_FOLDER:
        parts.pop()
    if not parts:  # the logdir is the run (or its tensorboard folder)
        run = (run_dir.parent if run_dir.name == TB_FOLDER else run_dir).resolve()
        parts, run_dir = [run.name], run
    name = "/".join(parts)
    if len(parts) == 1 and name.startswith("version_") and run_dir.parent.name:
        name = f"{run_dir.parent.name}/{name}"
    return name


def split_label(logdir: str | os.PathLike) -> tuple[str | None, Path]:
    """``LABEL=PATH`` -> (LABEL, PATH); a plain path (or an existing path that contains '=') -> (None, path)."""
    text = str(logdir)
    head, sep, tail = text.partition("=")
    if sep and head and "/" not in head and not Path(text).exists():
        return head, Path(tail).expanduser()
    return None, Path(text).expanduser()


def discover_runs(logdir: str | os.PathLike) -> list[tuple[str, Path]]:
    """Run directories under ``logdir``: itself if it holds event files, else every folder below that does.

    Args:
        logdir: a run's TensorBoard directory or a parent of several; ``LABEL=PATH`` names a single run LABEL in
            the legend.

    Raises:
        ScalingInputError: the path does not exist or no event file lies under it.
    """
    label, root = split_label(logdir)
    if not root.is_dir():
        raise ScalingInputError(f"--logdir {root}: no such directory")
    found = sorted({Path(d) for d, _, files in os.walk(root) if any(f.startswith(EVENT_PREFIX) for f in files)})
    if not found:
        raise ScalingInputError(f"--logdir {root}: no TensorBoard event file ({EVENT_PREFIX}*) in it or below it; "
                                "point it at a run's log folder (e.g. lightning_logs/version_0) or their parent")
    if label is not None:
        if len(found) > 1:
            raise ScalingInputError(f"--logdir {label}={root}: a label names one run, but {len(found)} run folders lie "
                                    "below it; label each run folder separately")
        return [(label, found[0])]
    return [(_run_name(d, root), d) for d in found]


def load_run(name: str, path: Path) -> Run:
    """Reads every scalar of the event files in ``path`` (all of them: size guidance 0)."""
    # Heavy imports, only when reading logs.
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    acc = ea.EventAccumulator(str(path), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    run = Run(name=name, path=path)
    for tag in acc.Tags()[ea.SCALARS]:
        events = acc.Scalars(tag)
        run.scalars[tag] = _series([e.step for e in events], [e.value for e in events])
    # Writers of the tf.summary v2 format (and tensorboard.summary.Writer) store scalars as scalars-plugin tensors.
    for tag in acc.Tags().get(ea.TENSORS, []):
        if tag in run.scalars or acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue
        events = acc.Tensors(tag)
        run.scalars[tag] = _series([e.step for e in events],
                                   [float(tensor_util.make_ndarray(e.tensor_proto)) for e in events])
    return run


def _series(steps: list[int], values: list[float]) -> pd.Series:
    series = pd.Series(values, index=pd.Index(steps, name="step"), dtype=float)
    # A resumed run logs some steps twice; its later value is the one the run continued from.
    return series[~series.index.duplicated(keep="last")].sort_index()


def load_runs(logdirs: list[str]) -> list[Run]:
    """Discovers and reads the runs of several logdirs; names that collide get their logdir's name in front."""
    located = [(name, path, split_label(d)[1].name) for d in logdirs for name, path in discover_runs(d)]
    names = [name for name, _, _ in located]
    runs = []
    for name, path, parent in located:
        unique = name if names.count(name) == 1 else f"{parent}:{name}"
        runs.append(load_run(unique, path))
    return runs


def smooth(series: pd.Series, weight: float) -> pd.Series:
    """TensorBoard's smoothing: the debiased exponential moving average with ``weight`` in [0, 1) (0 = none)."""
    if weight == 0.0:
        return series
    return series.ewm(alpha=1.0 - weight, adjust=True).mean()
