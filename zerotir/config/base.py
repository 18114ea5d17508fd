"""The model a run starts from and how it is loaded: ``model.base``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zerotir.config.checks import check_choice
from zerotir.config.lora import LoraConfig

Dtype = Literal["float32", "bfloat16", "float16"]


@dataclass(frozen=True)
class BaseModelConfig:
    """The base model (``model.base``): the actor, the reference and the critic all start from it, and the data
    module's tokenizer is its tokenizer (``--model.base.path`` also sets ``data.tokenizer``)."""

    path: str
    """HF model folder or hub id of the base model (a hub id must be in the local cache when offline)."""
    dtype: Dtype = "float32"
    """Parameter dtype of the models: float32, bfloat16 or float16 (half precision trains only under DeepSpeed, whose
    fp32 master weights take the optimizer step)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (actor and critic)."""
    attn_implementation: str | None = None
    """The attention kernel passed to from_pretrained (zerotir.models.check_attention, docs/scale.md); null:
    transformers' default (sdpa where torch has it)."""
    lora: LoraConfig | None = None
    """Low-rank adapters on the actor (``zerotir.config.lora``, docs/lora.md); null: full fine-tuning."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("model.base.path is empty: name a HF model folder or a hub id")
        check_choice("base", "dtype", self.dtype, Dtype)
        if isinstance(self.lora, dict):  # a plain dict (a checkpoint's hyperparameters) becomes the typed group
            object.__setattr__(self, "lora", LoraConfig(**self.lora))
