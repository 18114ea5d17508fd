"""Tests of the curve measurements (zerotir.scaling.laws) on hand-worked values."""

import numpy as np
import pandas as pd
import pytest

from zerotir.scaling import fit as sf
from zerotir.scaling import laws


def _series(values):
    return pd.Series(values, index=pd.Index(range(len(values)), name="step"), dtype=float)


def test_steps_to_fraction_hand_worked():
    s = _series([0.2, 0.2, 0.2, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7])
    out = laws.steps_to_fraction(s, 0.8, head=3, tail=5, smooth_weight=0.0)
    # start 0.2, plateau 0.7, threshold 0.2 + 0.8 * 0.5 = 0.6: first reached at step 4.
    assert out["start"] == pytest.approx(0.2) and out["plateau"] == pytest.approx(0.7)
    assert out["threshold"] == pytest.approx(0.6) and out["step"] == 4


def test_steps_to_fraction_of_a_given_plateau():
    s = _series([0.2, 0.2, 0.2, 0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7])
    # Plateau 1.0 given: threshold 0.2 + 0.8 * 0.8 = 0.84, never reached; plateau 0.45: threshold 0.4, step 3.
    assert laws.steps_to_fraction(s, 0.8, smooth_weight=0.0, plateau=1.0)["step"] is None
    assert laws.steps_to_fraction(s, 0.8, smooth_weight=0.0, plateau=0.45)["step"] == 3


def test_steps_to_fraction_of_a_falling_curve_is_none():
    s = _series([0.5] * 4 + [0.3] * 6)
    assert laws.steps_to_fraction(s, smooth_weight=0.0)["step"] is None
    with pytest.raises(ValueError, match="head \\+ tail"):
        laws.steps_to_fraction(_series([0.1] * 5))


def test_dip_hand_worked():
    s = _series([0.10, 0.10, 0.10, 0.05, 0.04, 0.06, 0.30, 0.60])
    out = laws.dip(s, head=3, smooth_weight=0.0)
    assert out["min_step"] == 4 and out["depth"] == pytest.approx(0.06) and out["dips"]


def test_a_monotone_rise_has_no_dip():
    out = laws.dip(_series([0.1, 0.1, 0.1, 0.12, 0.2, 0.3, 0.5, 0.7]), smooth_weight=0.0)
    assert not out["dips"] and out["depth"] < 0


def test_second_half_of_a_clean_law_is_predicted():
    steps = np.arange(40)
    s = pd.Series(sf.law(steps, 0.1, 0.9, 12.0, 3.0), index=steps, dtype=float)
    out = laws.predict_second_half(s)
    assert out["rmse"] < 0.02 and out["beats_naive"] and out["full_r2"] > 0.999


def test_closed_form_recovers_its_parameters():
    rng = np.random.default_rng(0)
    n = np.repeat([2e5, 8.5e5, 3e6], 30)
    t = np.tile(np.arange(30), 3).astype(float)
    length = rng.uniform(20, 60, n.size)
    y = laws.closed_form(np.log(n), t, length, 0.2, 0.5, 0.05)
    fit = laws.fit_closed_form(n, t, length, y)
    assert fit["a"] == pytest.approx(0.2, abs=1e-3) and fit["b"] == pytest.approx(0.5, abs=1e-3)
    assert fit["c"] == pytest.approx(0.05, abs=1e-4) and fit["r2"] > 0.9999
    # sigmoid(0) = 0.5: a hand-checkable point of the form.
    assert laws.closed_form(np.array([0.0]), np.array([0.0]), np.array([0.0]), 1, 1, 1)[0] == 0.5
