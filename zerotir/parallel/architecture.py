"""Decoder-only transformer shapes and their exact parameter counts (Llama / Mistral / Qwen2 / Qwen3 families).

The memory plan (``zerotir.parallel.memory_plan``) starts from these counts. They are exact for the supported HF model types
(a test checks them against ``numel`` of real transformers models) and the known Qwen2.5 base models come out at
0.494B / 7.62B / 32.76B parameters, as their model cards say.

Per layer (h = hidden, i = intermediate, q = heads x head_dim, kv = kv heads x head_dim):
    attention  h*q + 2*h*kv + q*h   (+ q + 2*kv biases on q/k/v for Qwen2, + h on o_proj for Llama's attention_bias)
               (+ 2 * head_dim for Qwen3's q_norm / k_norm)
    MLP        3*h*i  (gate, up, down; SwiGLU)  (+ 2*i + h with Llama's mlp_bias)
    norms      2*h    (RMSNorm weights before attention and before the MLP)
Model: layers x per-layer + V*h (embedding) + h (final norm) + V*h (LM head, unless tied to the embedding).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder-only causal LM.

    Args:
        name: a label for tables.
        num_layers: transformer blocks.
        hidden_size: model width h.
        intermediate_size: MLP width i (SwiGLU: gate, up and down projections).
        num_heads: attention (query) heads.
        num_kv_heads: key / value heads (grouped-query attention).
        vocab_size: embedding rows (= LM head outputs).
        tie_word_embeddings: the LM head shares the embedding matrix.
        head_dim: per-head width; default ``hidden_size // num_heads``.
        qkv_bias: biases on the q, k, v projections (Qwen2).
        o_bias: bias on the output projection (Llama with ``attention_bias``).
        mlp_bias: biases on the three MLP projections (Llama with ``mlp_bias``).
        qk_norm: RMSNorm weights on each query / key head (Qwen3).
    """

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "vocab_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{self.name}: {field}={value!r} must be a positive int")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"{self.name}: hidden_size={self.hidden_size} is not a multiple of num_heads="
                             f"{self.num_heads}; give head_dim explicitly")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads={self.num_heads} must be a multiple of num_kv_heads="
                             f"{self.num_kv_heads}")

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.dim_per_head

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.dim_per_head

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer block."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.q_dim, self.kv_dim
        attention = h * q + 2 * h * kv + q * h
        attention += (q + 2 * kv) if self.qkv_bias else 0
        attention += h if self.o_bias else 0
        attention += 2 * self.dim_per_head if self.qk_norm else 0
        mlp = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        return attention + mlp + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters of the causal LM (tied embeddings counted once)."""
        head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.num_layers * self.layer_params + self.embedding_params + self.hidden_size + head

    @property
    def critic_params(self) -> int:
        """The PPO critic: the backbone without the LM head, plus a scalar value head (h weights + 1 bias)."""
        backbone = self.num_layers * self.layer_params + self.embedding_params + self.hidden_size
        return backbone + self.hidden_size + 1

    def kv_cache_bytes_per_token(self, tensor_parallel: int = 1, dtype_bytes: int = 2) -> int:
        """KV-cache bytes of one token on one GPU of a tensor-parallel group (keys and values, every layer).

        KV heads are split over the group; with more GPUs than KV heads each GPU keeps a replica of one head.
        """
        heads_per_gpu = max(1, self.num_kv_heads // tensor_parallel)
        return 2 * self.num_layers * heads_per_gpu * self.dim_per_head * dtype_bytes


# Shapes from the models' config.json files on the hub (all Qwen2: q/k/v biases; the 0.5B ties its embeddings).
KNOWN: dict[str, Architecture] = {
    "qwen2.5-0.5b": Architecture("Qwen2.5-0.5B", 24, 896, 4864, 14, 2, 151936, True, qkv_bias=True),
    "qwen2.5-1.5b": Architecture("Qwen2.5-1.5B", 28, 1536, 8960, 12, 2, 151936, True, qkv_bias=True),
    "qwen2.5-7b": Architecture("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 152064, False, qkv_bias=True),
    "qwen2.5-32b": Architecture("Qwen2.5-32B", 64, 5120, 27648, 40, 8, 152064, False, qkv_bias=True),
}


def known_name(model: str) -> str | None:
    """The ``KNOWN`` key for a short name or hub id (``qwen2.5-7b``, ``Qwen/Qwen2.5-7B``); None if unknown."""
    key = model.rsplit("/", 1)[-1].lower()
    return key if key in KNOWN else None


def from_hf_config(config: Any, name: str | None = None) -> Architecture:
    """An ``Architecture`` from a transformers config object or a ``config.json`` dict.

    A dict is turned into the model type's config class first, so keys missing from the file take the library's
    defaults (e.g. ``tie_word_embeddings``).

    Raises:
        ValueError: a model type outside ``SUPPORTED_MODEL_TYPES`` (its parameter layout is not modelled here).
    """
    if isinstance(config, dict):
        from transformers import AutoConfig

        values = dict(config)
        model_type = values.pop("model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"config.json has model_type={model_type!r}; the memory plan models "
                             f"{SUPPORTED_MODEL_TYPES}. Describe the model with explicit numbers instead.")
        config = AutoConfig.for_model(model_type, **values)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type={model_type!r} is not one of {SUPPORTED_MODEL_TYPES}")
    attention_bias = bool(getattr(config, "attention_bias", False))
    return Architecture(
        name=name or getattr(config, "_name_or_path", "") or model_type,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_heads=config.num_attention_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        vocab_size=config.vocab_size,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        head_dim=getattr(config, "head_dim", None),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type in ("llama", "qwen3") and attention_bias,
        mlp_bias=model_type == "llama" and bool(getattr(config, "mlp_bias", False)),
        qk_norm=model_type == "qwen3",
    )


def resolve(model: str) -> Architecture:
    """An architecture from a known name / hub id (``KNOWN``), a ``config.json`` file, or a HF model folder.

    Raises:
        ValueError: none of those (the message lists the known names).
    """
    key = known_name(model)
    if key is not None:
        return KNOWN[key]
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        with path.open(encoding="utf-8") as f:
            return from_hf_config(json.load(f), name=path.parent.name or str(path))
    raise ValueError(f"model={model!r}: not a known architecture ({', '.join(KNOWN)}), nor a config.json file or a "
                     "HF model folder that has one")
