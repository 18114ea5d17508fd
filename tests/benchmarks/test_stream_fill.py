"""``benchmarks.stream_fill`` compares like with like: both arms roll out every sample of the same prompts on one
engine, and the requests it counts running at a step never exceed the room."""

from benchmarks.stream_fill import MeteredEngine, jobs, run_arm
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer


def test_both_arms_roll_out_every_sample_within_the_room():
    tok = build_byte_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0).eval()
    engine = HFEngine(model, tok, max_batch_size=4, num_threads=1)
    prompts = [tok.encode(f"Q: {i}\n") for i in range(4)]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=0)
    assert [(job.key, len(job.prompts), job.params.seed) for job in jobs(prompts, params, 2)] == [(0, 2, 0), (2, 2, 4)]
    for per_job, room in ((2, 0), (1, 4)):
        fill = run_arm(engine, tok, prompts, params, per_job, room)
        assert 0 < fill.tokens <= 4 * 2 * 6 and fill.steps > 0
        assert fill.running <= 4 * fill.steps  # never more than the room (a share of 2 prompts x 2 is 4)


def test_the_meter_counts_steps_and_the_requests_running_at_each():
    tok = build_byte_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0).eval()
    engine = HFEngine(model, tok, max_batch_size=2, num_threads=1, tokens_per_step=1)
    engine.eos_ids = set()
    metered = MeteredEngine(engine)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=3, seed=0)
    metered.submit("a", tok.encode("x"), params)
    metered.submit("b", tok.encode("y"), params)
    while metered.num_running:
        metered.step()
    assert (metered.steps, metered.running) == (3, 6)  # 2 requests x 3 tokens, one token a step
