"""The tests' tiny model folders, built one way: random Llamas with the byte tokenizer, in seconds on a CPU.

``save_tiny_model`` is the suite's model folder (``tiny_dir`` in tests/conftest.py, and the stand-in for a toy base
in the command line's tests); ``vllm_sized_model`` is the smallest shape vLLM's CPU attention runs (head size 32:
hidden 64 over 2 heads; it has no kernel for 16), for the tests that load one folder in both engines.
"""

from __future__ import annotations

from pathlib import Path

from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer


def save_tiny_model(path: str | Path) -> Path:
    """A tiny random Llama (hidden 32, 2 layers, 2 heads) and the byte tokenizer saved in ``path``; returns it."""
    build_tiny_model(build_byte_tokenizer(), save_dir=path, hidden_size=32, num_layers=2, num_heads=2)
    return Path(path)


def vllm_sized_model(tokenizer: PreTrainedTokenizerBase, max_len: int, save_dir: str | Path | None = None,
                     seed: int = 0) -> LlamaForCausalLM:
    """A random Llama vLLM's CPU backend can serve (hidden 64, 2 layers, 2 heads of 32), of context ``max_len``;
    saved with ``tokenizer`` in ``save_dir`` when given."""
    return build_tiny_model(tokenizer, save_dir=save_dir, seed=seed, hidden_size=64, num_layers=2, num_heads=2,
                            max_position_embeddings=max_len)
