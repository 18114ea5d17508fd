"""HFEngine's continuous-batching session: rows decoded together, leaving and rejoining, decode what each row decodes
alone (its own session of one row; ``test_hf_engine`` checks that against a full recompute)."""

from __future__ import annotations

import pytest
import torch

from zerotir.rollout.engine import SamplingParams, generate, per_prompt_params
from zerotir.rollout.hf_engine import HFEngine
from zerotir.rollout.hf_session import DecodeSession
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=30)
PROMPTS = [TOK.encode("Hello"), TOK.encode("What is 2+3?"), TOK.encode("x"), TOK.encode("A longer prompt here.")]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request):
    m = build_tiny_model(TOK, hidden_size=32, num_layers=2, seed=0).eval()
    m.config._attn_implementation = request.param
    return m


def drain(session, max_steps: int = 3, release: bool = False, max_slots: int | None = None) -> dict:
    """Step until nothing runs; the last sample of every key (``release``: free each finished row's slot; with
    ``max_slots``, check the batch never holds more slots)."""
    out = {}
    while session.num_running:
        assert max_slots is None or len(session.slots) <= max_slots
        for key, sample in session.step(max_steps):
            out[key] = sample
            if release:
                session.release(key)
    return out


def alone(engine, prompts, params):
    """What each prompt decodes on its own: one ``generate`` (one session of one row) per prompt."""
    return [generate(engine, [p], prm)[0] for p, prm in zip(prompts, per_prompt_params(prompts, params))]


def open_session(engine, params) -> DecodeSession:
    return DecodeSession(engine, params.seed)


def assert_same(want, got) -> None:
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
    assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4)


def test_session_decodes_what_generate_decodes(model):
    engine = HFEngine(model, TOK)
    want = alone(engine, PROMPTS, GREEDY)
    with open_session(engine, GREEDY) as session:
        for i, p in enumerate(PROMPTS):
            session.add(i, p, GREEDY)
        got = drain(session)
    for i in range(len(PROMPTS)):
        assert_same(want[i][0], got[i])


def test_rows_with_their_own_limits_and_stops_finish_on_their_own(model):
    engine = HFEngine(model, TOK)
    ref = alone(engine, [PROMPTS[0]], GREEDY)[0][0].token_ids
    stop = TOK.decode(ref[5:7])  # a stop string the model will write
    plist = [SamplingParams(temperature=0.0, max_new_tokens=4), SamplingParams(temperature=0.0, stop=[stop]),
             SamplingParams(temperature=0.0, max_new_tokens=12)]
    want = alone(engine, PROMPTS[:1] * 3, plist)
    with open_session(engine, GREEDY) as session:
        for i, p in enumerate(plist):
            session.add(i, PROMPTS[0], p)
        got = drain(session, max_steps=1)
    assert [got[i].finish_reason for i in range(3)] == ["length", "stop", "length"] and got[1].stop_str == stop
    for i in range(3):
        assert_same(want[i][0], got[i])


def test_a_parked_row_continues_with_injected_tokens_as_if_prefilled_whole(model):
    """Rows stop at different steps, get tokens appended (an injected tool output) and go on, each feeding only the
    new tokens into its own columns; the result equals generating from the whole context."""
    engine = HFEngine(model, TOK)
    injected = TOK.encode("<o>7</o>", add_special_tokens=False)
    with open_session(engine, GREEDY) as session:
        for i, p in enumerate(PROMPTS):
            session.add(i, p, SamplingParams(temperature=0.0, max_new_tokens=3 + 4 * i))
        first = drain(session, max_steps=1)
        contexts = [PROMPTS[i] + first[i].token_ids + injected * (i + 1) for i in range(len(PROMPTS))]
        fed_before = [len(session.slots[session.index[i]].fed) for i in range(len(PROMPTS))]
        for i, ctx in enumerate(contexts):
            session.add(i, ctx, GREEDY)
        # Only the new ids are pending: the parked row's keys / values were kept.
        assert [len(session.slots[session.index[i]].pending) for i in range(4)] == [
            len(c) - f for c, f in zip(contexts, fed_before)]
        got = drain(session)
    want = alone(engine, contexts, GREEDY)
    for i in range(len(PROMPTS)):
        assert_same(want[i][0], got[i])


def test_more_rows_than_the_batch_queue_and_reuse_freed_slots(model):
    engine = HFEngine(model, TOK, max_batch_size=2)
    prompts = PROMPTS * 2
    plist = [SamplingParams(temperature=0.0, max_new_tokens=5 + 3 * i) for i in range(len(prompts))]
    want = alone(engine, prompts, plist)
    with open_session(engine, GREEDY) as session:
        for i, p in enumerate(plist):
            session.add(i, prompts[i], p)
        got = drain(session, max_steps=2, release=True, max_slots=2)
    for i in range(len(prompts)):
        assert_same(want[i][0], got[i])


def test_released_rows_are_dropped_from_the_batch_and_the_rest_goes_on(model):
    engine = HFEngine(model, TOK)
    prompts = PROMPTS * 2
    plist = [SamplingParams(temperature=0.0, max_new_tokens=2 if i < 6 else 25) for i in range(len(prompts))]
    want = alone(engine, prompts, plist)
    with open_session(engine, GREEDY) as session:
        for i, p in enumerate(plist):
            session.add(i, prompts[i], p)
        got = drain(session, max_steps=1, release=True)
        assert len(session.slots) < len(prompts)  # compacted once an eighth of the slots were free
    for i in range(len(prompts)):
        assert_same(want[i][0], got[i])


def test_ids_that_do_not_extend_the_parked_row_start_it_afresh(model):
    engine = HFEngine(model, TOK)
    with open_session(engine, GREEDY) as session:
        session.add("a", PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=3))
        drain(session)
        session.add("a", PROMPTS[1], GREEDY)  # a different text: nothing of the parked row can be reused
        assert len(session.queue) == 1
        got = drain(session)
    assert_same(alone(engine, [PROMPTS[1]], GREEDY)[0][0], got["a"])


def test_bad_requests_are_refused_with_the_reason(model):
    engine = HFEngine(model, TOK)
    with open_session(engine, GREEDY) as session:
        with pytest.raises(ValueError, match="no ids"):
            session.add(0, [], GREEDY)
        session.add(0, PROMPTS[0], GREEDY)
        with pytest.raises(ValueError, match="still running"):
            session.add(0, PROMPTS[0], GREEDY)
        with pytest.raises(ValueError, match="context"):
            session.add(1, [5] * engine.context_length, GREEDY)


def test_sampling_is_reproducible_with_a_seed(model):
    engine = HFEngine(model, TOK)
    params = SamplingParams(temperature=1.0, max_new_tokens=20, seed=3)

    def run():
        with open_session(engine, params) as session:
            for i, p in enumerate(PROMPTS):
                session.add(i, p, params)
            return drain(session)

    a, b = run(), run()
    assert all(a[i].token_ids == b[i].token_ids for i in range(len(PROMPTS)))
    assert len({tuple(a[i].token_ids) for i in range(len(PROMPTS))}) > 1


def test_samples_of_one_prompt_share_its_prefill(model, monkeypatch):
    """n rows with the same prompt: one row per distinct prompt is prefilled, the others get copies of its keys /
    values; every row then decodes as ``generate`` does (greedy), and sampled rows still differ."""
    engine = HFEngine(model, TOK)
    prompts = [p for p in PROMPTS for _ in range(3)]
    want = alone(engine, prompts, GREEDY)
    prefill_rows = []
    forward = model.forward

    def spy(*args, **kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            prefill_rows.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    with open_session(engine, GREEDY) as session:
        for i, p in enumerate(prompts):
            session.add(i, p, GREEDY)
        got = drain(session)
    assert prefill_rows == [sum(len(p) > 1 for p in PROMPTS)]  # one-token prompts are decoded, not prefilled
    for i in range(len(prompts)):
        assert_same(want[i][0], got[i])
    sampled = SamplingParams(temperature=1.0, max_new_tokens=20, seed=0)
    with open_session(engine, sampled) as session:
        for i in range(3):
            session.add(i, PROMPTS[1], sampled)
        got = drain(session)
    assert len({tuple(got[i].token_ids) for i in range(3)}) > 1


def test_a_row_longer_than_the_cache_joins_a_running_batch(model):
    """The batch grows for a row that needs more columns than the cache holds (its rows were allocated for short
    ones): the old rows get the columns first, and both rows decode what each decodes alone."""
    engine = HFEngine(model, TOK)
    short, long = SamplingParams(temperature=0.0, max_new_tokens=4), SamplingParams(temperature=0.0, max_new_tokens=8)
    prompts, plist = [TOK.encode("Hi"), TOK.encode("x" * 40)], [short, long]
    want = alone(engine, prompts, plist)
    with open_session(engine, GREEDY) as session:
        session.add(0, prompts[0], short)
        got = {key: sample for key, sample in session.step(1)}
        session.add(1, prompts[1], long)  # row 0 still runs: a second slot is added
        got.update(drain(session, max_steps=1))
    for i in range(2):
        assert_same(want[i][0], got[i])


@pytest.mark.timeout(60)  # the failure this guards against is a hang
def test_parked_evictable_rows_give_their_slots_to_queued_rows_when_nothing_runs(model):
    """More rows than slots and none released (the tool loop's rounds keep a stopped row until the round ends): once
    no row runs, queued rows take the slots of parked evictable ones, and an evicted row added again with its sampled
    ids starts afresh and goes on as it would have. Rows not evictable keep their slots."""
    engine = HFEngine(model, TOK, max_batch_size=2)
    first = SamplingParams(temperature=0.0, max_new_tokens=4)
    with open_session(engine, GREEDY) as session:
        for i, p in enumerate(PROMPTS):
            session.add(i, p, first)
        kept = {}
        while len(kept) < 2:
            kept.update(session.step(3))
        assert session.step(3) == [] and sorted(session.index) == [0, 1] and len(session.queue) == 2
    first.evictable = True
    want = alone(engine, PROMPTS, GREEDY)
    with open_session(engine, GREEDY) as session:
        for i, p in enumerate(PROMPTS):
            session.add(i, p, first)
        got = drain(session, max_slots=2)
        assert sorted(got) == [0, 1, 2, 3] and sorted(session.index) == [2, 3]  # rows 0 and 1 gave up their slots
        for i, p in enumerate(PROMPTS):
            session.add(i, p + got[i].token_ids, SamplingParams(temperature=0.0, max_new_tokens=26, evictable=True))
        assert [s.key for s in session.queue] == [0, 1]
        rest = drain(session, max_slots=2)
    for i in range(len(PROMPTS)):
        assert got[i].finish_reason == "length" and got[i].token_ids + rest[i].token_ids == want[i][0].token_ids
        assert torch.allclose(torch.tensor(got[i].logprobs + rest[i].logprobs), torch.tensor(want[i][0].logprobs),
                              atol=1e-4)
