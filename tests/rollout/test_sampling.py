"""Token choice and stop-string matching (zerotir.rollout.sampling), with hand-worked values."""

from __future__ import annotations

import pytest
import torch

from zerotir.rollout.sampling import StopMatcher, ended_rows, sample_rows, sample_tokens
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def test_greedy_is_argmax_with_raw_logprobs():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0]])
    tokens, logps = sample_tokens(logits, 0.0, 1.0, None)
    assert tokens.tolist() == [1, 2]
    assert logps.tolist() == pytest.approx(torch.log_softmax(logits, -1)[[0, 1], [1, 2]].tolist())


def test_greedy_ties_pick_the_first_index():
    tokens, _ = sample_tokens(torch.tensor([[2.0, 2.0, 1.0]]), 0.0, 1.0, None)
    assert tokens.tolist() == [0]


def test_sampling_follows_the_tempered_distribution():
    # logits log(0.2), log(0.8): at temperature 1 token 1 comes 80% of the time, with log-prob log(0.8)
    logits = torch.log(torch.tensor([[0.2, 0.8]])).expand(20000, 2)
    gen = torch.Generator().manual_seed(0)
    tokens, logps = sample_tokens(logits, 1.0, 1.0, gen)
    assert tokens.float().mean().item() == pytest.approx(0.8, abs=0.01)
    assert logps[tokens == 1][0].item() == pytest.approx(torch.log(torch.tensor(0.8)).item(), abs=1e-6)
    # temperature 0.5 squares the odds: 0.04 : 0.64 -> p(1) = 0.64 / 0.68
    tokens, _ = sample_tokens(logits, 0.5, 1.0, gen)
    assert tokens.float().mean().item() == pytest.approx(0.64 / 0.68, abs=0.01)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    # probabilities 0.5, 0.3, 0.2: top_p 0.6 keeps {0, 1}, renormalised to 0.625 / 0.375
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).expand(4000, 3)
    tokens, logps = sample_tokens(logits, 1.0, 0.6, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 1}
    assert tokens.float().mean().item() == pytest.approx(0.375, abs=0.03)
    want = torch.log(torch.tensor([0.625, 0.375]))[tokens]
    assert torch.allclose(logps, want, atol=1e-5)


def test_same_seed_same_draws():
    logits = torch.randn(8, 50)
    a = sample_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(3))[0]
    b = sample_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(3))[0]
    assert torch.equal(a, b)


def test_each_row_samples_with_its_own_settings():
    """Rows 0 and 2 greedy, 1 and 3 at temperature 1: the greedy rows take their argmax (with the raw
    log-prob), the sampled ones draw exactly as the two of them alone would, from the same generator."""
    logits = torch.tensor([[0.0, 3.0, 1.0], [1.0, 1.0, 1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    samplers = [(0.0, 1.0), (1.0, 1.0), (0.0, 1.0), (1.0, 1.0)]
    tokens, logps = sample_rows(logits, samplers, torch.Generator().manual_seed(4))
    alone, alone_lp = sample_tokens(logits[[1, 3]], 1.0, 1.0, torch.Generator().manual_seed(4))
    assert tokens[[0, 2]].tolist() == [1, 0] and torch.equal(tokens[[1, 3]], alone)
    raw = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(logps[[0, 2]], torch.stack([raw[0, 1], raw[2, 0]]))
    assert torch.allclose(logps[[1, 3]], alone_lp)


def test_rows_of_one_sampler_draw_as_one_batch():
    logits = torch.randn(6, 40)
    one = sample_rows(logits, [(0.7, 0.9)] * 6, torch.Generator().manual_seed(2))
    assert all(torch.equal(a, b) for a, b in zip(one, sample_tokens(logits, 0.7, 0.9, torch.Generator().manual_seed(2))))


def test_stop_matcher_finds_the_first_listed_stop_in_the_tail():
    m = StopMatcher(TOK, ["```python", "</answer>"], len(TOK))
    assert m.window == 9 + 2
    tails = [ids("x = 1\n```python")[-m.window :], ids("done</answer>")[-m.window :], ids("```pyth")]
    assert m.match(tails) == ["```python", "</answer>", None]


def test_only_tokens_holding_a_stops_last_character_are_candidates():
    m = StopMatcher(TOK, ["```python", "```"], len(TOK))
    assert m.candidate[ids("n")[0]] and m.candidate[ids("`")[0]]
    assert not m.candidate[ids("a")[0]] and not m.candidate[ids("p")[0]]
    assert m.candidate[ids("é")[0]]  # a lone UTF-8 lead byte decodes to U+FFFD: kept to be safe
    assert not m.candidate[TOK.eos_token_id]  # a special token adds no text
    assert StopMatcher(TOK, ["\n"], len(TOK)).candidate == [True] * len(TOK)  # whitespace: no filter
    assert StopMatcher(TOK, ["x"], len(TOK) + 5).candidate[-5:] == [True] * 5  # ids past the tokenizer


def test_ended_rows_names_eos_stop_and_length_per_row():
    m = StopMatcher(TOK, ["```"], len(TOK))
    eos = TOK.eos_token_id
    rows = [
        ("eos", ids("ab") + [eos], m, 10),  # EOS wins even where a stop could end
        ("stop", ids("x ```"), m, 5),  # the stop completes exactly at the limit: "stop", not "length"
        ("length", ids("abcd"), m, 4),  # not a candidate id, at its limit
        ("running", ids("ab`"), m, 10),  # a candidate, no stop yet, under its limit
        ("limit after check", ids("a``"), m, 3),  # a candidate without a stop, at its limit
        ("no matcher", ids("```"), None, 10),
    ]
    got = {key: (reason, stop) for key, reason, stop in ended_rows(rows, {eos})}
    assert got == {"eos": ("eos", None), "stop": ("stop", "```"), "length": ("length", None),
                   "limit after check": ("length", None)}
