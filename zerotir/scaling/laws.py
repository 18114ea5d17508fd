"""Measurements on training curves beyond the fitted law: how fast a curve reaches its plateau, whether
it dips before it rises, whether the law fitted on the first half of a run predicts the second half, and a proposed
closed form across model sizes.

Pure functions on numpy arrays and pandas series (no TensorBoard, no matplotlib), checked on hand-worked values.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from zerotir.scaling import fit as sf
from zerotir.scaling.runs import smooth

CLOSED_FORM = "success = sigmoid(a * ln N + b * sqrt(T) - c * L)"


def steps_to_fraction(series: pd.Series, fraction: float = 0.8, head: int = 3, tail: int = 5,
                      smooth_weight: float = 0.6, plateau: float | None = None) -> dict:
    """First step at which the smoothed curve has covered ``fraction`` of the way from its start to its plateau.

    ``start`` is the mean of the first ``head`` values, ``plateau`` the mean of the last ``tail``; the threshold is
    ``start + fraction * (plateau - start)``. ``step`` is None when the curve never rises (plateau <= start).
    E.g. values 0.2, 0.2, 0.2, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7 (no smoothing, head 3, tail 5): start 0.2, plateau
    0.7, threshold 0.6, reached at index 4. ``plateau`` given (e.g. the best plateau of runs being compared, so a
    run that levels off low does not count as fast) replaces the run's own.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction={fraction}: must lie in (0, 1]")
    if len(series) < head + tail:
        raise ValueError(f"need at least head + tail = {head + tail} points, got {len(series)}")
    start = float(series.iloc[:head].mean())
    plateau = float(series.iloc[-tail:].mean()) if plateau is None else float(plateau)
    threshold = start + fraction * (plateau - start)
    curve = smooth(series, smooth_weight)
    step = None
    if plateau > start:
        reached = curve[curve >= threshold - 1e-12]
        step = int(reached.index[0]) if len(reached) else None
    return {"start": start, "plateau": plateau, "threshold": threshold, "step": step}


def dip(series: pd.Series, head: int = 3, smooth_weight: float = 0.6, min_depth: float = 0.03) -> dict:
    """Does the curve dip below its start before it rises? On the smoothed curve: the minimum before the maximum.

    ``start`` is the mean of the first ``head`` raw values; ``depth = start - min`` (the minimum taken after the
    first ``head`` steps and before the curve's maximum); ``dips`` when ``depth >= min_depth`` and the curve ends
    above its start. E.g. raw 0.10, 0.10, 0.10, 0.05, 0.04, 0.06, 0.30, 0.60 (no smoothing): start 0.10, minimum
    0.04 at index 4, depth 0.06: a dip.
    """
    if len(series) < head + 2:
        raise ValueError(f"need at least {head + 2} points, got {len(series)}")
    start = float(series.iloc[:head].mean())
    curve = smooth(series, smooth_weight)
    peak_at = int(np.argmax(curve.to_numpy()))
    window = curve.iloc[head:peak_at] if peak_at > head else curve.iloc[head:head]
    if window.empty:
        return {"start": start, "min": None, "min_step": None, "depth": 0.0, "dips": False,
                "end": float(curve.iloc[-1])}
    low_at = window.idxmin()
    depth = start - float(window.min())
    rises = float(curve.iloc[-1]) > start
    return {"start": start, "min": float(window.min()), "min_step": int(low_at), "depth": depth,
            "dips": bool(depth >= min_depth and rises), "end": float(curve.iloc[-1])}


def predict_second_half(series: pd.Series) -> dict:
    """Fit the law (``zerotir.scaling.fit``) on the first half of the steps and score its prediction of the second.

    Returns the RMSE of the prediction, the RMSE of the naive forecast (the mean of the last quarter of the first
    half held flat), whether the law beat it, and R^2 of the law fitted on the whole run. ``error`` explains a part
    that could not be computed (too few points, a constant half).
    """
    s, y = series.index.to_numpy(dtype=float), series.to_numpy(dtype=float)
    half = len(s) // 2
    out: dict = {"points": len(s), "split_step": float(s[half]) if len(s) else None}
    try:
        full = sf.fit_law(s, y)
        out["full_r2"] = full.r2
        out["full_fit"] = full.to_dict()
    except (ValueError, RuntimeError) as err:
        out["full_error"] = str(err)
    try:
        first = sf.fit_law(s[:half], y[:half])
    except (ValueError, RuntimeError) as err:
        out["error"] = str(err)
        return out
    pred = first.predict(s[half:])
    naive = float(np.mean(y[max(0, half - max(1, half // 4)):half]))
    out.update(first_half_fit=first.to_dict(), rmse=_rmse(y[half:], pred),
               naive_rmse=_rmse(y[half:], np.full(len(y) - half, naive)))
    out["beats_naive"] = out["rmse"] < out["naive_rmse"]
    return out


def _rmse(y: np.ndarray, y_hat: np.ndarray) -> float:
    return float(math.sqrt(np.mean((np.asarray(y) - np.asarray(y_hat)) ** 2)))


def closed_form(log_n: np.ndarray, steps: np.ndarray, length: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    """``sigmoid(a * ln N + b * sqrt(T) - c * L)`` at arrays of ln N, T and L."""
    z = a * np.asarray(log_n, float) + b * np.sqrt(np.asarray(steps, float)) - c * np.asarray(length, float)
    return 1.0 / (1.0 + np.exp(-z))


def fit_closed_form(params: np.ndarray, steps: np.ndarray, length: np.ndarray, success: np.ndarray) -> dict:
    """Least-squares fit of :data:`CLOSED_FORM` to points (N parameters, T steps, L response length, success rate).

    Returns ``a``, ``b``, ``c``, ``r2`` and ``points``. Raises ValueError on fewer than 4 points or a constant
    success.
    """
    from scipy.optimize import curve_fit

    n, t, ln, y = (np.asarray(v, float) for v in (params, steps, length, success))
    if len(y) < 4:
        raise ValueError(f"need at least 4 points to fit 3 parameters, got {len(y)}")
    if np.ptp(y) == 0:
        raise ValueError("success is constant; there is nothing to fit")
    log_n = np.log(n)

    def model(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
        return closed_form(x[0], x[1], x[2], a, b, c)

    x = np.vstack([log_n, t, ln])
    best = None
    for p0 in ((0.0, 0.1, 0.0), (-0.1, 0.3, 0.0), (0.1, 0.0, 0.01)):
        try:
            popt, _ = curve_fit(model, x, y, p0=p0, maxfev=20000)
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum((model(x, *popt) - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, popt)
    if best is None:
        raise RuntimeError("the closed form did not converge from any start")
    a, b, c = (float(v) for v in best[1])
    return {"a": a, "b": b, "c": c, "r2": sf.r_squared(y, model(x, a, b, c)), "points": int(len(y))}
