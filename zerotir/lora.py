"""LoRA RL (``model.base.lora``, docs/lora.md): the actor as a ``peft.PeftModel`` on its frozen base, the reference as
that same base with the adapters disabled, the PPO critic's own adapters, and the export of a run's adapters.

What lives where:

* the actor: ``add_adapters`` wraps the loaded causal LM with ``peft.get_peft_model``; only the adapters (and the
  biases ``bias`` names) train, so the optimizer holds nothing else (``trainable``). Its adapter tensors are
  ``peft.get_peft_model_state_dict(actor)``, its peft config ``actor.peft_config["default"]``.
* the reference: ``AdaptersOff(actor)``, each forward under ``actor.disable_adapter()``: the base model's log-probs
  with no second copy of its weights (the module keeps no ``ref_model`` then).
* the critic: ``model.base.lora.critic = adapters`` puts adapters of its own on the critic's backbone (a frozen copy
  of the base: the two models' adapters are trained by one backward each and peft switches one adapter per model
  at a time), the value head trains in full; ``full`` trains the whole value model as without LoRA.
* the rollout engine: each engine declares how a LoRA actor's weights reach it (``EngineWeights.adapter_path``):
  the transformers engine that wraps the actor generates with the adapters on, in place; an engine with weights of
  its own takes the adapter tensors only (vLLM started with ``lora_rank``, an engine host's transformers copy); one
  that takes no adapters gets the merged weights (``zerotir.parallel.weight_sync.merged_lora_bucket``).
  ``is_adapted`` is the one check every part makes of whether a model is a LoRA actor.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from torch import nn

from zerotir.config import LoraConfig

log = logging.getLogger(__name__)
ADAPTER = "default"  # peft's name of the one adapter a model gets
ADAPTER_SEED = 0  # the adapters' initial values are drawn from it (``init_adapters``)


def _peft() -> Any:
    try:
        import peft
    except ImportError as err:  # the lora extra is optional
        raise ImportError("model.base.lora needs peft: pip install -e '.[lora]' (or set model.base.lora: null for "
                          "full fine-tuning)") from err
    return peft


def peft_config(cfg: LoraConfig) -> Any:
    """peft's ``LoraConfig`` of a ``model.base.lora`` group."""
    targets: Any = "all-linear" if list(cfg.target_modules) == ["all-linear"] else list(cfg.target_modules)
    return _peft().LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                              bias=cfg.bias)


def add_adapters(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """``model`` (a causal LM, or a critic's backbone) as a ``peft.PeftModel`` with fresh adapters; its own weights
    frozen (peft sets ``requires_grad=False`` on them).

    Raises:
        ValueError: no module of ``model`` matches ``target_modules``, or the LM head got an adapter (``all-linear``
            leaves it out; the chunked log-probs and the engines read its weight directly).
    """
    peft = _peft()
    try:
        # autocast_adapter_dtype: adapters in float32 over a bfloat16 / float16 base (``trained_dtype``)
        wrapped = peft.get_peft_model(model, peft_config(cfg), autocast_adapter_dtype=True)
    except ValueError as err:
        raise ValueError(f"model.base.lora.target_modules={list(cfg.target_modules)}: {err}") from err
    init_adapters(wrapped)
    head = wrapped.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, peft.tuners.tuners_utils.BaseTunerLayer):
        raise ValueError(f"model.base.lora.target_modules={list(cfg.target_modules)}: it matches the LM head, which "
                         "takes no adapter here; name the decoder's modules only (e.g. [q_proj, v_proj])")
    return wrapped


def init_adapters(model: nn.Module) -> None:
    """Give ``model``'s adapters peft's initial values (A as ``nn.Linear``'s default, B zero: the adapted model starts
    as its base) drawn from a fixed seed, whatever the RNG's state and the layout.

    Under DeepSpeed ZeRO-3 (Lightning builds the model inside ``deepspeed.zero.Init``) peft's own initialisation
    writes into empty partitions and does nothing, leaving B random; so the adapter parameters are gathered here,
    rank 0 initialises them and DeepSpeed hands each rank its partition. The fixed seed makes a run's adapters the
    same on 1 rank and on several (the rehearsal's equivalence)."""
    import contextlib

    import torch

    peft = _peft()
    layers = [m for m in model.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    partitioned = [p for name, p in model.named_parameters() if ".lora_" in name and hasattr(p, "ds_id")]
    gathered: Any = contextlib.nullcontext()
    if partitioned:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(partitioned, modifier_rank=0)
    with gathered, torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(ADAPTER_SEED)
        for layer in layers:
            layer.reset_lora_parameters(ADAPTER, True)


def add_critic_adapters(critic: nn.Module, cfg: LoraConfig) -> nn.Module:
    """The critic of ``model.base.lora.critic``: ``adapters`` wraps its backbone (the value head stays trainable),
    ``full`` leaves it as it is."""
    if cfg.critic == "adapters":
        critic.backbone = add_adapters(critic.backbone, cfg)
        critic.value_head.float()  # trained in full: float32, as the adapters (``trained_dtype``)
    return critic


def trained_dtype(dtype: str, cfg: LoraConfig | None, uses_critic: bool) -> str:
    """The dtype of the weights the optimizer steps: under LoRA the adapters and the value head are float32 over a
    base of any dtype (so a bfloat16 base trains without DeepSpeed's fp32 masters), unless a PPO critic trains in
    full (``critic: full``), whose weights are the base's dtype."""
    if cfg is None or (uses_critic and cfg.critic == "full"):
        return dtype
    return "float32"


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters the optimizer takes: those that require a gradient (adapters, value head, trained biases)."""
    return [p for p in model.parameters() if p.requires_grad]


def is_adapted(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (a LoRA actor): the one check the module, the weight sync and the
    engines make. peft is not imported here: where nothing imported it, no model can be a ``PeftModel``."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


class AdaptersOff:
    """The reference policy under LoRA: ``actor``'s base model, i.e. the actor with its adapters disabled for the
    length of each call. Not an ``nn.Module`` (nothing of it is registered, saved or optimized twice); it offers what
    the log-prob passes call: ``__call__``, ``get_decoder()``, ``get_output_embeddings()`` and ``config``."""

    def __init__(self, actor: nn.Module) -> None:
        if not is_adapted(actor):
            raise TypeError(f"AdaptersOff: the actor is a {type(actor).__name__}, not a peft.PeftModel")
        self.actor = actor

    @property
    def config(self) -> Any:
        return self.actor.config

    def __call__(self, **inputs: Any) -> Any:
        with self.actor.disable_adapter():
            return self.actor(**inputs)

    def get_decoder(self) -> Any:
        decoder = self.actor.get_decoder()

        def run(**inputs: Any) -> Any:
            with self.actor.disable_adapter():
                return decoder(**inputs)

        return run

    def get_output_embeddings(self) -> nn.Module:
        return self.actor.get_output_embeddings()


def reference(actor: nn.Module | None, ref_model: nn.Module | None, kl_coef: float) -> Any:
    """The reference an RL step uses: ``ref_model`` when one was loaded, the actor's base (``AdaptersOff``) when the
    actor has adapters and the KL is on, else None."""
    if ref_model is not None or kl_coef <= 0 or not is_adapted(actor):
        return ref_model
    return AdaptersOff(actor)


# What each ``EngineWeights.adapter_path`` means for a LoRA run, said at start (``log_weight_path``).
_WEIGHT_PATHS = {
    "in place": "the transformers engine generates with the actor itself, adapters on; nothing is pushed after an "
                "update",
    "adapter": "every update pushes the adapter tensors only (peft.get_peft_model_state_dict); the engine keeps its "
               "base weights",
    "merged": "the engine takes no adapters: every update pushes the merged weights (base + scaled B @ A of each "
              "adapted layer, the whole model's bytes)",
}


def log_weight_path(path: str, engine: str) -> None:
    """Say at the start of a LoRA run (INFO) how the rollout engine ``engine`` (its name) gets the adapted actor,
    ``path`` being what the engine declares (``EngineWeights.adapter_path``)."""
    log.info("model.base.lora: %s: %s", engine, _WEIGHT_PATHS[path])


def push_size(actor: nn.Module, path: str) -> tuple[int, int]:
    """Bytes and tensors one push of ``actor`` moves into an engine of adapter path ``path``
    (``EngineWeights.adapter_path``): a LoRA actor's adapter tensors into an engine that takes adapters, else every
    weight of the plain model (a LoRA actor's merged: its parameters less the adapters)."""
    if is_adapted(actor) and path == "adapter":
        tensors = list(_peft().get_peft_model_state_dict(actor).values())
    else:
        tensors = [p for name, p in actor.named_parameters() if ".lora_" not in name]
    return sum(t.numel() * t.element_size() for t in tensors), len(tensors)


def save_adapters(actor: nn.Module, out_dir: str, merged_dir: str | None = None) -> None:
    """Write ``actor``'s adapters as a peft folder (``PeftModel.from_pretrained(base, out_dir)`` loads it) and, with
    ``merged_dir``, the base with the adapters merged in as a plain HF folder (the actor itself is not changed)."""
    actor.save_pretrained(out_dir)
    if merged_dir is not None:
        merged = copy_merged(actor)
        merged.config.use_cache = True
        merged.save_pretrained(merged_dir)


def copy_merged(actor: nn.Module) -> nn.Module:
    """A plain transformers model with ``actor``'s adapters merged into a copy of its base (peft's
    ``merge_and_unload`` on a deep copy: the actor keeps its adapters and its base unchanged)."""
    import copy

    return copy.deepcopy(actor).merge_and_unload()
