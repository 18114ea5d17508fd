"""Runs grouped by a setting: by model size, call budget, algorithm or any config key, for the sweeps
of ``benchmarks/toy_findings.py`` and ``python -m zerotir scaling --group-by KEY``.

A run's settings are read from the ``config.yaml`` the CLI saves beside its TensorBoard events. ``KEY`` is a dotted
config key (``model.tool.max_tool_calls``, ``model.rl.algorithm``) or ``params``: the policy's parameter count,
counted from the model folder's ``config.json`` on the meta device (no weights loaded).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from zerotir import metric_names as mn
from zerotir.scaling import fit as sf
from zerotir.scaling import laws
from zerotir.scaling.runs import Run, ScalingInputError

PARAMS_KEY = "params"
CONFIG_FILE = "config.yaml"


def run_config(run: Run) -> dict:
    """The config the CLI saved for ``run`` (beside its events, or one folder up)."""
    for folder in (run.path, run.path.parent):
        path = folder / CONFIG_FILE
        if path.is_file():
            return yaml.safe_load(path.read_text()) or {}
    raise ScalingInputError(f"run {run.name}: no {CONFIG_FILE} in {run.path} or its parent; --group-by reads the "
                            "config the CLI saves with each run")


def config_value(config: dict, key: str) -> object:
    """The value at dotted ``key`` of a nested config; a missing part is an error naming it."""
    node: object = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ScalingInputError(f"--group-by {key}: the run's config has no {part!r} there")
        node = node[part]
    return node


def param_count(model_path: str | Path) -> int:
    """Parameters of the model in ``model_path`` (built from its config on the meta device: no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def group_value(run: Run, key: str) -> object:
    """The value ``run`` has for ``key`` (see the module docstring)."""
    config = run_config(run)
    if key == PARAMS_KEY:
        return param_count(config_value(config, "model.base.path"))
    return config_value(config, key)


def final_mean(run: Run, tag: str, last_n: int) -> float | None:
    series = run.get(tag)
    return None if series is None or series.empty else float(series.iloc[-last_n:].mean())


def analyse_groups(runs: list[Run], key: str, last_n: int = 5, fraction: float = 0.8) -> dict:
    """Per value of ``key``: its runs, final rollout accuracy and calls per response (mean of the last ``last_n``
    steps), steps to ``fraction`` of the accuracy plateau (``laws.steps_to_fraction``), each averaged over the runs;
    with ``key == "params"`` also the closed form of ``laws.CLOSED_FORM`` fitted across all runs against the
    per-run law."""
    values = {run.name: group_value(run, key) for run in runs}
    groups: dict[str, dict] = {}
    for value in sorted(set(values.values()), key=lambda v: (isinstance(v, str), v)):
        members = [run for run in runs if values[run.name] == value]
        rows = []
        for run in members:
            acc = run.get(mn.ACCURACY)
            reach = laws.steps_to_fraction(acc, fraction) if acc is not None and len(acc) >= 8 else None
            rows.append({"run": run.name, "final_accuracy": final_mean(run, mn.ACCURACY, last_n),
                         "calls_per_response": final_mean(run, mn.CALLS_PER_RESPONSE, last_n),
                         "steps_to_fraction": None if reach is None else reach["step"]})
        groups[str(value)] = {"value": value, "runs": rows, **{
            name: _mean([r[name] for r in rows]) for name in ("final_accuracy", "calls_per_response",
                                                              "steps_to_fraction")}}
    out = {"key": key, "last_n": last_n, "fraction": fraction, "groups": groups}
    if key == PARAMS_KEY:
        out["closed_form"] = closed_form_vs_law(runs, values)
    return out


def _mean(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def closed_form_vs_law(runs: list[Run], params: dict[str, object]) -> dict:
    """:data:`laws.CLOSED_FORM` fitted on every (run, step) point against the log-logistic fitted per run: R^2 of
    each on the same points (the law has 4 parameters per run, the closed form 3 in all)."""
    n, t, length, y, law_pred = [], [], [], [], []
    notes = []
    for run in runs:
        acc, resp = run.get(mn.ACCURACY), run.get(mn.RESPONSE_LENGTH)
        if acc is None or resp is None:
            notes.append(f"{run.name}: accuracy or response length not logged; left out")
            continue
        both = acc.to_frame("acc").join(resp.to_frame("len"), how="inner")
        try:
            law = sf.fit_law(both.index.to_numpy(), both["acc"].to_numpy())
        except (ValueError, RuntimeError) as err:
            notes.append(f"{run.name}: law not fitted ({err}); left out")
            continue
        steps = both.index.to_numpy(dtype=float)
        n += [float(params[run.name])] * len(both)
        t += list(steps)
        length += list(both["len"].to_numpy())
        y += list(both["acc"].to_numpy())
        law_pred += list(law.predict(steps))
    result: dict = {"formula": laws.CLOSED_FORM, "notes": notes}
    try:
        result["fit"] = laws.fit_closed_form(np.array(n), np.array(t), np.array(length), np.array(y))
        result["law_r2"] = sf.r_squared(np.array(y), np.array(law_pred))
    except (ValueError, RuntimeError) as err:
        result["error"] = str(err)
    return result
