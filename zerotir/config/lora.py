"""LoRA fine-tuning of the base model: ``model.base.lora`` (null: full fine-tuning).

With adapters the actor is a ``peft.PeftModel`` whose base weights stay frozen; the reference policy is that same base
with the adapters disabled (no second copy), and the PPO critic either gets adapters of its own on a frozen base or
trains in full (``critic``). The value head always trains in full. How the run uses them: ``zerotir.lora``,
docs/lora.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from zerotir.config.checks import check_choice

LoraBias = Literal["none", "all", "lora_only"]
LoraCritic = Literal["adapters", "full"]


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on the actor (``model.base.lora``); the names are peft's ``LoraConfig`` fields."""

    rank: int = 16
    """The adapters' rank r (peft's ``r``)."""
    alpha: float = 32.0
    """peft's ``lora_alpha``: the update is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training (peft's ``lora_dropout``); in [0, 1)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"])
    """Module names (suffixes) that get adapters, or ["all-linear"] (every linear layer but the LM head)."""
    bias: LoraBias = "none"
    """Which biases train: none, all, or lora_only (peft's ``bias``)."""
    critic: LoraCritic = "adapters"
    """The PPO critic: ``adapters`` (adapters of its own on a frozen base, the value head in full) or ``full`` (the
    whole value model trains, as without LoRA)."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"model.base.lora.rank={self.rank}: must be >= 1 (e.g. 16)")
        if self.alpha <= 0:
            raise ValueError(f"model.base.lora.alpha={self.alpha}: must be > 0 (e.g. 2 x rank)")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.base.lora.dropout={self.dropout}: must be in [0, 1) (0: no dropout)")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ValueError(f"model.base.lora.target_modules={self.target_modules!r}: name at least one module "
                             "(e.g. [q_proj, v_proj]) or [all-linear]")
        if any(m in ("lm_head", "embed_tokens") for m in self.target_modules):
            raise ValueError(f"model.base.lora.target_modules={self.target_modules!r}: the embeddings and the LM head "
                             "take no adapters here (the chunked log-probs and the engines read the LM head's weight); "
                             "leave them out")
        check_choice("base.lora", "bias", self.bias, LoraBias)
        check_choice("base.lora", "critic", self.critic, LoraCritic)
