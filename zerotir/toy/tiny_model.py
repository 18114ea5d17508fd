"""Tiny random-init causal LMs for tests and the toy world (never downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase


def tiny_llama_config(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    rope_theta: float = 10000.0,
    tie_word_embeddings: bool = False,
) -> LlamaConfig:
    """A small Llama config whose vocabulary and special ids match ``tokenizer``; ``head_dim`` None = hidden_size /
    num_heads."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim or hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_word_embeddings,
        rope_theta=rope_theta,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, save_dir: str | Path | None = None, seed: int = 0, **config_kwargs
) -> LlamaForCausalLM:
    """A random-init tiny Llama (float32). If ``save_dir`` is given, model and tokenizer are saved there so that
    both rollout engines (transformers, vLLM) and the trainer can load the folder."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(tokenizer, **config_kwargs))
    if save_dir is not None:
        model.save_pretrained(str(save_dir))
        tokenizer.save_pretrained(str(save_dir))
    return model
