"""``benchmarks.hf_decode`` compares like with like: both arms decode the same rows to the same length, so the
tokens/s it prints are of the same work."""

from benchmarks.hf_decode import engine_arm, generate_arm
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer


def test_both_arms_decode_every_sample_to_the_full_length_with_eos_off():
    tok = build_byte_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0).eval()
    model.generation_config.eos_token_id = None
    engine = HFEngine(model, tok, max_batch_size=6, num_threads=1)
    engine.eos_ids = set()
    prompts = [tok.encode("Q: 1+1?\n"), tok.encode("Q: what is 12*3?\n"), tok.encode("Q: 7\n")]
    assert engine_arm(engine, prompts, samples=2, tokens=5, seed=0) == 3 * 2 * 5
    assert generate_arm(model, prompts, samples=2, tokens=5, pad_id=0, seed=0) == 3 * 2 * 5
