"""The numbers of the scaling report: the fitted law, R^2, the correlation table and the call shares.

Pure functions on numpy arrays and pandas series, with no TensorBoard or matplotlib import, so the tests can check
each on hand-worked values. ``zerotir.scaling.report`` reads the logs and calls these.

The law. Accuracy and code proportion of an RL run start at a base level, rise (often slowly first, then steeply, as
tool use takes hold) and saturate below 1. We fit the four-parameter log-logistic curve, a logistic in log-steps::

    y(s) = lo + (hi - lo) / (1 + (m / (s + 1)) ** k)
         = lo + (hi - lo) * sigmoid(k * (ln(s + 1) - ln m))

``lo`` is the level before training, ``hi`` the plateau, ``m`` the step (+1) where the curve is half-way from lo to
hi and ``k > 0`` the steepness. We chose it over the saturating power law ``a - b * (s + s0) ** -c`` because it
contains that law's two regimes: early on ``y - lo ~ (hi - lo) * ((s + 1) / m) ** k`` (a power-law rise) and late
``hi - y ~ (hi - lo) * (m / (s + 1)) ** k`` (a power-law approach to the plateau); with ``k > 1`` it also has the S
shape of a run where reward stays near 0 until the model first succeeds with code, which the concave power law cannot
follow. ``s + 1`` keeps step 0 on the log axis. ``hi < lo`` describes a falling curve. On short, noisy runs the fit
is bounded (lo and hi inside ``y_bounds``, m within 100x the step range, k in [0.05, 20]) and started from several
initial guesses, keeping the one with the least squared error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

LAW_NAME = "four-parameter log-logistic in steps (logistic in log-steps)"
LAW_FORMULA = "y(s) = lo + (hi - lo) / (1 + (m / (s + 1)) ** k)"
LAW_PARAMETERS = {
    "lo": "level before training (s -> 0)",
    "hi": "plateau (s -> infinity)",
    "m": "half-way point: the curve is at (lo + hi) / 2 when s + 1 = m",
    "k": "steepness; power-law exponent of the early rise and of the late approach to hi",
}
MIN_FIT_POINTS = 6  # 4 parameters plus at least 2 degrees of freedom, else R^2 means little
K_BOUNDS = (0.05, 20.0)
CALL_BUCKETS = ("0", "1", "2", "3plus")


def law(steps: np.ndarray, lo: float, hi: float, m: float, k: float) -> np.ndarray:
    """Evaluates the fitted law (see the module docstring) at ``steps``."""
    s1 = np.asarray(steps, dtype=float) + 1.0
    # (m / s1) ** k overflows for s1 << m; the limit is lo, which 1 / inf = 0 gives.
    with np.errstate(over="ignore"):
        return lo + (hi - lo) / (1.0 + (m / s1) ** k)


def r_squared(y: np.ndarray, y_hat: np.ndarray) -> float:
    """Coefficient of determination ``1 - SS_res / SS_tot``.

    Raises:
        ValueError: when the arrays differ in length, are empty, or ``y`` is constant (SS_tot = 0, R^2 undefined).
    """
    y, y_hat = np.asarray(y, dtype=float), np.asarray(y_hat, dtype=float)
    if y.shape != y_hat.shape or y.size == 0:
        raise ValueError(f"r_squared needs two non-empty arrays of one shape, got {y.shape} and {y_hat.shape}")
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0.0:
        raise ValueError("r_squared is undefined for a constant series (total sum of squares is 0)")
    return 1.0 - float(np.sum((y - y_hat) ** 2)) / ss_tot


@dataclass(frozen=True)
class LawFit:
    """Result of :func:`fit_law`: the parameters, their standard errors (None where not finite) and R^2."""

    lo: float
    hi: float
    m: float
    k: float
    r2: float
    points: int
    stderr: dict[str, float | None]

    def predict(self, steps: np.ndarray) -> np.ndarray:
        """The fitted curve at ``steps``."""
        return law(steps, self.lo, self.hi, self.m, self.k)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"lo": self.lo, "hi": self.hi, "m": self.m, "k": self.k, "r2": self.r2, "points": self.points,
                "stderr": self.stderr}


def _initial_guesses(s: np.ndarray, y: np.ndarray, y_bounds: tuple[float, float]) -> list[tuple[float, ...]]:
    """Starts for the fit: lo and hi from the first and last tenth, several half-way points and steepnesses."""
    edge = max(1, len(y) // 10)
    lo0, hi0 = (float(np.clip(np.mean(part), *y_bounds)) for part in (y[:edge], y[-edge:]))
    s1 = s + 1.0
    # First step at which the series has moved half-way from lo0 to hi0.
    moved = np.abs(y - lo0) >= 0.5 * abs(hi0 - lo0)
    cross = float(s1[np.argmax(moved)]) if moved.any() else float(np.median(s1))
    span = (float(s1.min()), float(s1.max()))
    m_starts = {cross, math.sqrt(span[0] * span[1]), 0.5 * (span[0] + span[1])}
    return [(lo0, hi0, math.log(m0), k0) for m0 in sorted(m_starts) for k0 in (0.7, 2.0, 5.0)]


def fit_law(steps: np.ndarray, values: np.ndarray, y_bounds: tuple[float, float] = (0.0, 1.0)) -> LawFit:
    """Least-squares fit of the law in the module docstring, with scipy's ``curve_fit`` (trust-region, bounded).

    Args:
        steps: training steps (>= 0), one per value.
        values: the metric at those steps.
        y_bounds: bounds for ``lo`` and ``hi``; (0, 1) for shares such as accuracy and code proportion.

    Raises:
        ValueError: fewer than ``MIN_FIT_POINTS`` finite points, negative steps, or a constant series.
        RuntimeError: no start converged.
    """
    from scipy.optimize import curve_fit  # heavy import, only where fitting happens

    s, y = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    keep = np.isfinite(s) & np.isfinite(y)
    s, y = s[keep], y[keep]
    if len(s) < MIN_FIT_POINTS:
        raise ValueError(f"need at least {MIN_FIT_POINTS} logged steps to fit the law, got {len(s)}")
    if s.min() < 0:
        raise ValueError(f"steps must be >= 0, got {s.min()}")
    if np.ptp(y) == 0.0:
        raise ValueError(f"the series is constant ({y[0]:g}); there is no curve to fit")
    order = np.argsort(s)
    s, y = s[order], y[order]

    # m is fitted as ln m: it ranges over orders of magnitude, and a log scale keeps the trust region well conditioned.
    def log_m_law(x: np.ndarray, lo: float, hi: float, log_m: float, k: float) -> np.ndarray:
        return law(x, lo, hi, math.exp(log_m), k)

    s1_max = float(s.max()) + 1.0
    lower = [y_bounds[0], y_bounds[0], math.log(0.1), K_BOUNDS[0]]
    upper = [y_bounds[1], y_bounds[1], math.log(100.0 * s1_max), K_BOUNDS[1]]
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for p0 in _initial_guesses(s, y, y_bounds):
        p0 = np.clip(p0, np.add(lower, 1e-9), np.subtract(upper, 1e-9))
        try:
            popt, pcov = curve_fit(log_m_law, s, y, p0=p0, bounds=(lower, upper), maxfev=5000)
        except (RuntimeError, ValueError):
            continue  # this start did not converge; others may
        sse = float(np.sum((log_m_law(s, *popt) - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, popt, pcov)
    if best is None:
        raise RuntimeError(f"the law did not converge from any initial guess on {len(s)} points")
    _, popt, pcov = best
    lo, hi, log_m, k = (float(v) for v in popt)
    m = math.exp(log_m)
    se = [math.sqrt(v) if np.isfinite(v) and v >= 0 else None for v in np.diag(pcov)]
    # Delta method: se(m) = m * se(ln m).
    stderr = {"lo": se[0], "hi": se[1], "m": None if se[2] is None else m * se[2], "k": se[3]}
    r2 = r_squared(y, law(s, lo, hi, m, k))
    return LawFit(lo=lo, hi=hi, m=m, k=k, r2=r2, points=len(s), stderr=stderr)


def correlation_table(columns: dict[str, pd.Series], steps_column: str | None = "steps") -> pd.DataFrame:
    """Pearson correlations between series indexed by step, over the steps where all of them were logged.

    Args:
        columns: name -> series (index = step).
        steps_column: name of a first column holding the step itself (so "steps" correlates with each metric);
            None for none.

    Raises:
        ValueError: fewer than 3 common steps.
    """
    frame = pd.DataFrame(columns).dropna()
    if steps_column is not None:
        frame.insert(0, steps_column, frame.index.to_numpy(dtype=float))
    if len(frame) < 3:
        raise ValueError(f"need at least 3 steps where {sorted(columns)} were all logged, got {len(frame)}")
    return frame.corr(method="pearson")


def call_shares(counts: dict[str, pd.Series], last_n: int | None = None) -> dict:
    """Share of correct trajectories by number of tool calls, from per-step counts summed over the steps.

    Args:
        counts: bucket ("0", "1", "2", "3plus") -> series of per-step counts indexed by step.
        last_n: sum only the last ``last_n`` logged steps (of the union of the buckets' steps); None sums all.

    Returns:
        ``{"steps": [first, last] or None, "total": int, "counts": {bucket: int}, "shares": {bucket: float | None}}``;
        the shares are None when no correct trajectory was counted.
    """
    if last_n is not None and last_n < 1:
        raise ValueError(f"last_n must be >= 1 or None, got {last_n}")
    all_steps = sorted(set().union(*(set(series.index) for series in counts.values()))) if counts else []
    chosen = all_steps if last_n is None else all_steps[-last_n:]
    totals = {bucket: int(round(float(counts[bucket].reindex(chosen).fillna(0).sum()))) if bucket in counts else 0
              for bucket in CALL_BUCKETS}
    total = sum(totals.values())
    shares = {bucket: (n / total if total else None) for bucket, n in totals.items()}
    span = [int(chosen[0]), int(chosen[-1])] if chosen else None
    return {"steps": span, "total": total, "counts": totals, "shares": shares}
