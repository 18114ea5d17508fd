"""Decode attention split by row width: the plan's cost model (hand-worked) and the session's results with it."""

from __future__ import annotations

import pytest

from zerotir.rollout import hf_session
from zerotir.rollout.engine import SamplingParams, generate
from zerotir.rollout.hf_engine import HFEngine
from zerotir.rollout.ragged_attention import row_cost_cells, split_width
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()

pytestmark = pytest.mark.usefixtures("one_thread")


def test_equal_widths_are_never_split():
    assert split_width([10, 10, 10, 10], row_cost=0) is None
    assert split_width([50], row_cost=0) is None
    assert split_width([], row_cost=0) is None


def test_one_wide_row_is_attended_apart_when_the_padding_saved_pays_for_its_call():
    widths = [10] * 8 + [100]
    # Unsplit: 9 rows x 100 = 900 cells. Split at 10: 9 x 10, plus the wide row's own 100 columns and its call.
    assert split_width(widths, row_cost=0) == 10  # 190 < 900
    assert split_width(widths, row_cost=709) == 10  # 899 < 900
    assert split_width(widths, row_cost=710) is None  # 900 is not cheaper than 900: keep one call


def test_the_main_width_is_the_cheapest_cut():
    widths = [200, 50, 50, 50, 10, 10, 10, 10]  # unsplit: 8 x 200 = 1600
    # One row apart: 8 x 50 + 200 + c; four apart: 8 x 10 + 350 + 4c.
    assert split_width(widths, row_cost=0) == 10  # 430 < 600
    assert split_width(widths, row_cost=100) == 50  # 700 < 830
    widths = [100, 60, 10, 10, 10, 10, 10, 10]  # unsplit: 800
    assert split_width(widths, row_cost=200) == 10  # two apart: 80 + 160 + 400 = 640 < 780 (one apart)
    assert split_width(widths, row_cost=300) is None  # 880 and 840: both dearer than 800


def test_a_row_call_costs_fewer_cells_the_bigger_the_heads():
    assert row_cost_cells(4, 16) == 841  # 14 us / (0.00026 us x 64)
    assert row_cost_cells(4, 32) == row_cost_cells(2, 64) == 421  # 14 / (0.00026 x 128) = 420.7
    assert row_cost_cells(10**6, 10**6) == 1


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request):
    m = build_tiny_model(TOK, hidden_size=32, num_layers=2, seed=0).eval()
    m.config._attn_implementation = request.param
    return m


def test_rows_attended_apart_decode_what_each_row_decodes_alone(model, monkeypatch):
    """One long prompt among short ones: with every split taken (cost 0), the long row's attention runs apart on
    sdpa; tokens and log-probs equal ``generate``'s, and the model's attention setting is restored."""
    monkeypatch.setattr(hf_session, "split_width", lambda widths, row_cost: split_width(widths, row_cost=0))
    plans = []
    real_plan = hf_session.DecodeSession._plan
    monkeypatch.setattr(hf_session.DecodeSession, "_plan", lambda self, *a: plans.append(a) or real_plan(self, *a))
    engine = HFEngine(model, TOK)
    prompts = [TOK.encode("x" * 150 + " long"), *(TOK.encode(t) for t in ("Hi", "2+3?", "ab", "Why", "z", "ok", "no"))]
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    want = [generate(engine, [p], params)[0] for p in prompts]  # one row each: nothing to split
    assert not plans
    attention = model.config._attn_implementation
    with hf_session.DecodeSession(engine, params.seed) as session:
        for i, p in enumerate(prompts):
            session.add(i, p, params)
        got = {}
        while session.num_running:
            got.update(session.step(4))
    assert model.config._attn_implementation == attention
    assert (len(plans) > 0) == (attention == "sdpa")  # split on sdpa; eager attention is never split
    for i in range(len(prompts)):
        assert got[i].token_ids == want[i][0].token_ids
        assert max(abs(a - b) for a, b in zip(got[i].logprobs, want[i][0].logprobs)) < 1e-4
