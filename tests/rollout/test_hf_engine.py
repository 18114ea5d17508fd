"""HFEngine on a tiny random Llama, checked against a plain full-sequence forward (no cache, one row at a time):
plain sampling (``engine.generate`` over the protocol) and the protocol itself (submit / step / release)."""

from __future__ import annotations

import pytest
import torch

from zerotir.rollout.engine import RolloutEngine, SamplingParams, generate
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()
TEXTS = ["Hello", "What is 2+3? Let me think about it", "x"]
PROMPTS = [TOK.encode(t) for t in TEXTS]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(TOK, hidden_size=32, num_layers=2, num_heads=4, seed=0).eval()


@pytest.fixture()
def engine(model):
    return HFEngine(model, TOK, max_batch_size=8)


@torch.inference_mode()
def reference_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy decoding by recomputing the whole sequence at each step: the slow, obviously right way."""
    ids, out, lps = list(prompt), [], []
    for _ in range(steps):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        tok = int(logits.argmax())
        out.append(tok)
        lps.append(float(torch.log_softmax(logits, -1)[tok]))
        ids.append(tok)
        if tok == TOK.eos_token_id:
            break
    return out, lps


def ascii_stop(ids: list[int], length: int, start: int = 0) -> str:
    """A stop string of ``length`` single-byte (ASCII) tokens of ``ids`` from ``start`` on: it decodes the same
    whatever bytes surround it, so where it first appears is unambiguous."""
    for i in range(start, len(ids) - length + 1):
        if all(3 <= t < 3 + 128 for t in ids[i : i + length]):
            return TOK.decode(ids[i : i + length])
    raise AssertionError("no ASCII window in the greedy continuation; pick another seed")


def first_completion(ids: list[int], stop: str) -> int | None:
    """Number of tokens after which ``stop`` first appears in the decoded text, or None."""
    return next((i + 1 for i in range(len(ids)) if stop in TOK.decode(ids[: i + 1])), None)


@torch.inference_mode()
def sequence_logprobs(model, prompt: list[int], sampled: list[int], temperature: float) -> list[float]:
    logits = model(torch.tensor([prompt + sampled])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(sampled)]


def test_is_a_rollout_engine(engine):
    assert isinstance(engine, RolloutEngine)


def test_greedy_matches_full_recompute_in_a_ragged_batch(engine, model):
    out = generate(engine, PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=40))
    for prompt, samples in zip(PROMPTS, out):
        want_ids, want_lps = reference_greedy(model, prompt, 40)
        assert samples[0].token_ids == want_ids
        assert samples[0].logprobs == pytest.approx(want_lps, abs=1e-4)
        assert samples[0].finish_reason == "length"


def test_greedy_is_deterministic_and_batch_independent(engine):
    params = SamplingParams(temperature=0.0, max_new_tokens=30)
    together = generate(engine, PROMPTS, params)
    alone = [generate(engine, [p], params)[0] for p in PROMPTS]
    again = generate(engine, PROMPTS, params)
    assert [s[0].token_ids for s in together] == [s[0].token_ids for s in alone] == [s[0].token_ids for s in again]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_those_of_the_sampling_distribution(engine, model, temperature):
    out = generate(engine, PROMPTS[:2], SamplingParams(n=3, temperature=temperature, max_new_tokens=25, seed=3))
    for prompt, samples in zip(PROMPTS, out):
        assert len(samples) == 3
        for s in samples:
            assert s.logprobs == pytest.approx(sequence_logprobs(model, prompt, s.token_ids, temperature), abs=1e-4)


def test_seeded_sampling_repeats_and_seeds_differ(engine):
    def ids(seed):
        out = generate(engine, PROMPTS, SamplingParams(n=2, temperature=1.0, max_new_tokens=20, seed=seed))
        return [s.token_ids for samples in out for s in samples]

    assert ids(1) == ids(1)
    assert ids(1) != ids(2)


def test_tiny_top_p_is_greedy(engine):
    greedy = generate(engine, PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=15))
    nucleus = generate(engine, PROMPTS, SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=15, seed=0))
    assert [s[0].token_ids for s in nucleus] == [s[0].token_ids for s in greedy]
    assert all(lp == 0.0 for s in nucleus for lp in s[0].logprobs)  # the nucleus holds one token: p = 1


def test_stop_string_ends_the_row_right_after_the_completing_token(engine, model):
    full, _ = reference_greedy(model, PROMPTS[1], 30)
    stop = ascii_stop(full, 3, start=4)
    out = generate(engine, [PROMPTS[1]], SamplingParams(temperature=0.0, max_new_tokens=30, stop=[stop]))
    s = out[0][0]
    assert s.finish_reason == "stop" and s.stop_str == stop
    assert s.token_ids == full[: first_completion(full, stop)] and len(s.token_ids) < 30


def test_eos_ends_the_row_and_is_kept(engine, model):
    full, _ = reference_greedy(model, PROMPTS[0], 10)
    engine.eos_ids = {full[3]}
    s = generate(engine, [PROMPTS[0]], SamplingParams(temperature=0.0, max_new_tokens=10))[0][0]
    first = full.index(full[3])
    assert s.finish_reason == "eos" and s.token_ids == full[: first + 1]


def test_rows_finish_independently(engine, model):
    refs = [reference_greedy(model, p, 40)[0] for p in PROMPTS]
    stop = ascii_stop(refs[1], 2, start=10)  # ends row 1 around token 12; the other rows run to the limit
    out = generate(engine, PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=40, stop=[stop]))
    lengths = []
    for ref, samples in zip(refs, out):
        s = samples[0]
        ends = first_completion(ref, stop)
        assert s.token_ids == ref[: ends or 40]
        assert s.finish_reason == ("stop" if ends else "length")
        lengths.append(len(s.token_ids))
    assert len(set(lengths)) > 1


def test_more_rows_than_the_batch_size(model):
    engine = HFEngine(model, TOK, max_batch_size=2)
    out = generate(engine, PROMPTS, SamplingParams(n=2, temperature=0.0, max_new_tokens=12))
    assert [len(s) for s in out] == [2, 2, 2]
    for prompt, samples in zip(PROMPTS, out):
        want = reference_greedy(model, prompt, 12)[0]
        assert [s.token_ids for s in samples] == [want, want]


def test_a_finished_request_continues_from_its_ids_feeding_only_the_new_ones(model, monkeypatch):
    """Submit, step until it stops, resubmit with the sampled ids + an injected block: the continuation is what a
    fresh request of the whole ids decodes, and the forward of the continuation fed only the new ids."""
    engine = HFEngine(model, TOK)
    full, _ = reference_greedy(model, PROMPTS[1], 20)
    stop = ascii_stop(full, 2)
    engine.submit("a", PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=20, stop=[stop]))
    done = []
    while engine.num_running:
        done += engine.step()
    (key, first), = done
    assert key == "a" and first.finish_reason == "stop" and first.token_ids == full[: first_completion(full, stop)]
    injected = TOK.encode("\n```output\n42\n```\n")
    ids = PROMPTS[1] + first.token_ids + injected
    want = reference_greedy(model, ids, 10)[0]
    widths = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: widths.append(k["input_ids"].shape[1]) or forward(*a, **k))
    engine.submit("a", ids, SamplingParams(temperature=0.0, max_new_tokens=10))
    got = []
    while engine.num_running:
        got += engine.step()
    assert widths[0] == len(injected) + 1  # the last sampled id (not fed yet) and the injected block
    assert got[0][1].token_ids == want
    engine.release("a")
    assert engine.num_running == 0


def test_each_request_samples_with_its_own_settings(engine, model):
    """A greedy request beside a sampled one decodes as it would alone, and the sampled one draws as it would alone
    (the session's generator, seeded by its first request, gives the greedy row no draw)."""
    sampled = SamplingParams(temperature=1.0, max_new_tokens=6, seed=7)
    alone = generate(engine, [PROMPTS[0]], sampled)[0][0].token_ids
    engine.submit("s", PROMPTS[0], sampled)
    engine.submit("g", PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=6))
    with pytest.raises(ValueError, match="still running"):
        engine.submit("g", PROMPTS[1], SamplingParams(temperature=0.0))
    got = {}
    while engine.num_running:
        got.update(engine.step())
    assert got["g"].token_ids == reference_greedy(model, PROMPTS[1], 6)[0]
    assert got["s"].token_ids == alone
    engine.release("s")
    engine.release("g")


def test_update_weights_loads_another_model_and_drops_parked_requests():
    a = build_tiny_model(TOK, hidden_size=32, num_layers=2, seed=0)
    b = build_tiny_model(TOK, hidden_size=32, num_layers=2, seed=1)
    engine = HFEngine(a, TOK)
    engine.submit("parked", PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=3))
    while engine.num_running:
        engine.step()
    engine.update_weights((name, t.clone()) for name, t in b.state_dict().items())
    # its keys / values were computed by model a: a resubmission recomputes all its ids with model b
    ids = PROMPTS[1] + reference_greedy(a, PROMPTS[1], 3)[0]
    engine.submit("parked", ids, SamplingParams(temperature=0.0, max_new_tokens=5))
    out = []
    while engine.num_running:
        out += engine.step()
    engine.release("parked")
    assert out[0][1].token_ids == reference_greedy(b, ids, 5)[0]
    got = generate(engine, PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12))
    assert [s[0].token_ids for s in got] == [reference_greedy(b, p, 12)[0] for p in PROMPTS]
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights({"lm_head.weight": torch.zeros(3, 3)})


def test_loads_a_saved_folder(tmp_path, model):
    model.save_pretrained(tmp_path)
    TOK.save_pretrained(tmp_path)
    engine = HFEngine(str(tmp_path))
    out = generate(engine, [PROMPTS[0]], SamplingParams(temperature=0.0, max_new_tokens=10))
    assert out[0][0].token_ids == reference_greedy(model, PROMPTS[0], 10)[0]


def test_training_mode_and_threads_are_restored(model):
    engine = HFEngine(model, TOK)
    assert engine.num_threads == 1  # a tiny model on CPU decodes on one thread
    model.train()
    torch.set_num_threads(2)
    try:
        generate(engine, [PROMPTS[0]], SamplingParams(max_new_tokens=3))
        assert model.training and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
        model.eval()


@pytest.mark.parametrize("prompts, params, match", [
    ([[]], SamplingParams(), r"ids is empty"),
    ([[5, 999]], SamplingParams(), "outside"),
    ([[5]], SamplingParams(n=0), r"SamplingParams\.n=0: must be >= 1"),
    ([[5]], [SamplingParams(), SamplingParams()], "2 SamplingParams for 1 prompts"),
    ([[5]], SamplingParams(temperature=-1), "temperature"),
    ([[5]], SamplingParams(top_p=0), "top_p"),
    ([[5]], SamplingParams(max_new_tokens=0), "max_new_tokens"),
    ([[5]], SamplingParams(stop=[""]), "empty string"),
    ([[5] * 3000], SamplingParams(), "context"),
])
def test_bad_requests_are_named(engine, prompts, params, match):
    with pytest.raises(ValueError, match=match):
        generate(engine, prompts, params)


def test_needs_a_tokenizer(model):
    with pytest.raises(ValueError, match="tokenizer"):
        HFEngine(model)


def test_per_prompt_params(engine, model):
    refs = [reference_greedy(model, p, 30)[0] for p in PROMPTS]
    plist = [SamplingParams(temperature=0.0, max_new_tokens=k) for k in (5, 5, 30)]
    out = generate(engine, PROMPTS, plist)
    assert [s[0].token_ids for s in out] == [refs[0][:5], refs[1][:5], refs[2]]
    with pytest.raises(ValueError, match="one per prompt"):
        generate(engine, PROMPTS, plist[:2])


def test_refuses_an_attention_it_cannot_mask():
    flash = build_tiny_model(TOK, hidden_size=32, num_layers=1)
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="'flash_attention_2'.*attn_implementation='sdpa'"):
        HFEngine(flash, TOK)


def test_a_missing_model_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HFEngine(tmp_path / "nope")


def test_after_a_weight_update_no_request_is_served_keys_values_of_the_old_weights():
    """The invariant of a push into a running engine: a finished request resubmitted with its own sample, and a
    request running across the update, both decode from keys / values of the new weights only."""
    old, new = (build_tiny_model(TOK, hidden_size=32, num_layers=2, seed=s).eval() for s in (0, 1))
    engine = HFEngine(build_tiny_model(TOK, hidden_size=32, num_layers=2, seed=0).eval(), TOK, tokens_per_step=1)
    engine.eos_ids = set()  # a fixed number of tokens per request
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    engine.submit("own", PROMPTS[1], greedy)
    engine.submit("running", PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=12))
    done = {}
    while "own" not in done:
        done.update(engine.step())
    assert engine.num_running == 1  # "running" has sampled 4 tokens, like "own"
    engine.update_weights((name, t.clone()) for name, t in new.state_dict().items())
    ids = PROMPTS[1] + done["own"].token_ids
    engine.submit("own", ids, SamplingParams(temperature=0.0, max_new_tokens=6))
    while engine.num_running:
        done.update(engine.step())
    own, running = done["own"], done["running"]
    want, want_lps = reference_greedy(new, ids, 6)
    assert own.token_ids[: len(want)] == want and own.logprobs[: len(want)] == pytest.approx(want_lps, abs=1e-4)
    before = running.token_ids[:4]
    assert before == reference_greedy(old, PROMPTS[0], 4)[0]
    after, after_lps = reference_greedy(new, PROMPTS[0] + before, 8)
    assert running.token_ids[4 : 4 + len(after)] == after
    assert running.logprobs[4 : 4 + len(after)] == pytest.approx(after_lps, abs=1e-4)
