"""Trackio as a Lightning logger: the scalars and the sampled trajectories of a run in a local dashboard.

Trackio (``pip install 'zerotir[traces]'``) is local-first: a run's data go to a SQLite file under ``TRACKIO_DIR``
(``~/.cache/huggingface/trackio`` by default; set the variable before the run to put them elsewhere) and
``trackio show`` opens the dashboard; no account, nothing sent anywhere. ``--trainer.logger`` takes it beside
TensorBoard (the default), CSV and W&B::

    --trainer.logger zerotir.rollout_log.trackio_logger.TrackioLogger --trainer.logger.project my-project \
        --trainer.logger.save_dir runs/my-run

Besides every scalar the run logs, the ``RolloutDumper`` hands it the best, the worst and a failed-execution
trajectory of each written step (``log_samples``), logged as Markdown under ``samples/<kind>`` (``val_samples/...``
for validation), as it does for TensorBoard's text panel. The run starts at the first thing logged (its
hyperparameters: the run's config) and ends with the fit.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from zerotir.rollout_log.render import markdown_sample


class TrackioLogger(Logger):
    """Log to a local Trackio project.

    Args:
        project: the Trackio project (a dashboard groups the runs of a project).
        name: the run's name (None: Trackio picks a readable one).
        group: a group of runs inside the project (None: none).
        save_dir: where the command line saves the run's ``config.yaml`` (Trackio's own data go under
            ``TRACKIO_DIR``).
    """

    def __init__(self, project: str = "zerotir", name: str | None = None, group: str | None = None,
                 save_dir: str = ".") -> None:
        super().__init__()
        self._save_dir = save_dir
        if not project or not isinstance(project, str):
            raise ValueError(f"TrackioLogger: project must be a non-empty name, got {project!r}")
        self._project, self._name, self._group = project, name, group
        self._config: dict[str, Any] = {}
        self._run: Any = None
        self._lock = threading.Lock()  # samples come from the rollout writer's thread, scalars from the trainer's

    @property
    def name(self) -> str:
        return self._project

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def version(self) -> str:
        return self._run.name if self._run is not None else (self._name or "")

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``trackio.Run`` (started here on first use)."""
        with self._lock:
            if self._run is None:
                try:
                    import trackio
                except ImportError as error:
                    raise ImportError("--trainer.logger TrackioLogger needs trackio: pip install 'zerotir[traces]' "
                                      "(or pip install trackio), or choose another logger") from error
                self._run = trackio.init(project=self._project, name=self._name, group=self._group,
                                         config=dict(self._config), embed=False, auto_log_gpu=False,
                                         auto_log_cpu=False)
            return self._run

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The run's config: given before the run starts, it is the run's Trackio config; later, added to it."""
        params = params if isinstance(params, Mapping) else vars(params)
        flat = _flatten(params)
        if self._run is None:
            self._config.update(flat)
        else:
            self._run.config.update(flat)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        values = {k: float(v) for k, v in metrics.items()}
        run = self.experiment
        with self._lock:
            run.log(values, step=step)

    @rank_zero_only
    def log_samples(self, prefix: str, step: int, picked: Mapping[str, dict[str, Any]]) -> None:
        """Log ``picked`` (kind -> rollout record, ``render.pick_samples``) as Markdown under ``<prefix>/<kind>``."""
        if not picked:
            return
        import trackio

        run = self.experiment
        texts = {f"{prefix}/{kind}": trackio.Markdown(markdown_sample(record, f"{kind}, step {step}"))
                 for kind, record in picked.items()}
        with self._lock:
            run.log(texts, step=step)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """End the run (its data flushed to the local database)."""
        with self._lock:
            run, self._run = self._run, None
        if run is not None:
            run.finish()


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config groups as dotted keys (``model.rl.algorithm``), values as JSON-safe scalars or text."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}."))
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out
