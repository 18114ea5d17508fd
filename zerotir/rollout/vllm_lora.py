"""LoRA adapters into a running vLLM engine: the engine arguments, the adapter's settings as plain data, and the
function that registers adapter tensors in the worker from memory.

With LoRA the engine holds the *base* weights once (loaded at start) and serves every request through one adapter
(``max_loras=1``). A push registers the actor's adapter tensors (``peft.get_peft_model_state_dict``) in place of the
previous ones: vLLM's public path (``LLM.add_lora`` / a ``LoRARequest`` per request) reads an adapter only from a
folder (``WorkerLoRAManager._load_adapter`` calls ``LoRAModel.from_local_checkpoint`` on ``lora_path``), but
``LoRAModel.from_lora_tensors`` builds the same object from tensors, so ``load_adapter_in_worker`` runs that inside
the in-process worker (``collective_rpc``) and hands it to the worker's adapter manager: no file is written and the
tensors travel by reference. A full-weight reload (``vllm_reload.reload_in_worker``) keeps the registered adapter
(``registered_adapter``, ``restore_adapter``): vLLM's reload drops it.

Every version keeps the same adapter id (``ADAPTER_ID``): vLLM's scheduler gives a request its ``LoRARequest`` for
life, so requests running at a push, which the engine preempts and recomputes under the new weights as with a full
push (``VLLMEngine.reset_cache``), must find the new tensors under the id they carry. The request's ``lora_path`` is
never read (the adapter is registered before any request names it, and with one adapter and ``max_loras=1`` it is
never evicted); it names this module so that a vLLM that did try to read it fails with a path that says why.

vLLM is imported only inside functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from zerotir.lora import is_adapted
from zerotir.parallel.weight_sync import _gathered  # the read-only ZeRO-3 gather of the weight sync

ADAPTER_ID = 1  # the lora_int_id of every adapter version (module doc)
ADAPTER_PATH = "zerotir-in-memory-adapter (zerotir.rollout.vllm_lora registers it from tensors)"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks


def lora_llm_kwargs(rank: int) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of an engine that serves one LoRA adapter of rank ``rank``: ``max_lora_rank`` is
    the smallest rank vLLM accepts that holds it (vLLM takes only the values of ``VLLM_LORA_RANKS``).

    Raises:
        ValueError: ``rank`` < 1 or above vLLM's largest rank.
    """
    if not 1 <= rank <= VLLM_LORA_RANKS[-1]:
        raise ValueError(f"lora rank {rank}: vLLM serves adapters of rank 1..{VLLM_LORA_RANKS[-1]} (max_lora_rank); "
                         "set the LoRA rank (model.base.lora r) within that range")
    return {"enable_lora": True, "max_lora_rank": next(r for r in VLLM_LORA_RANKS if r >= rank), "max_loras": 1,
            "max_cpu_loras": 1}


def adapter_config(peft_config: Any) -> dict[str, Any]:
    """The settings vLLM needs of a ``peft.LoraConfig`` (``actor.peft_config["default"]``) as plain data, so that a
    fleet can send them with the tensors. Settings vLLM cannot serve (DoRA, LoRA bias, ...) pass through and vLLM's
    ``PEFTHelper.validate_legal`` refuses them in ``load_adapter_in_worker``."""
    targets = peft_config.target_modules
    return {
        "r": int(peft_config.r), "lora_alpha": peft_config.lora_alpha,
        "target_modules": targets if isinstance(targets, str) else sorted(targets),
        "bias": peft_config.bias, "modules_to_save": list(peft_config.modules_to_save or []) or None,
        "use_rslora": bool(peft_config.use_rslora), "use_dora": bool(peft_config.use_dora),
        "lora_bias": bool(getattr(peft_config, "lora_bias", False)),
        "rank_pattern": dict(peft_config.rank_pattern or {}), "alpha_pattern": dict(peft_config.alpha_pattern or {}),
    }


def adapter_request() -> Any:
    """The ``LoRARequest`` every request of a LoRA engine carries (module doc)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name="zerotir-adapter", lora_int_id=ADAPTER_ID, lora_path=ADAPTER_PATH)


def load_adapter_in_worker(worker: Any, tensors: Mapping[str, torch.Tensor], config: dict[str, Any]) -> int:
    """Run inside the worker: build vLLM's ``LoRAModel`` from ``tensors`` (peft names, e.g.
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``) as ``WorkerLoRAManager._load_adapter`` does
    from a folder, and put it in place of the previous version under ``ADAPTER_ID``. Returns the number of modules
    the adapter touches.

    Raises:
        ValueError: settings vLLM cannot serve (a rank above the engine's ``max_lora_rank``, DoRA, ...), or tensors
            of modules vLLM's model has no LoRA layer for (they would be dropped silently otherwise).
    """
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager  # vllm.lora.worker_manager.LRUCacheWorkerLoRAManager
    helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    models = manager._adapter_manager  # noqa: SLF001 (vLLM has no public call that takes a LoRAModel)
    mapper = getattr(models.model, "hf_to_vllm_mapper", None)
    # copies: vLLM scales lora_B in place (LoRALayerWeights.optimize), and its ``.to`` keeps a CPU tensor of the
    # right dtype as it is, which would scale the actor's own parameters
    owned = {name: t.to(device="cpu", dtype=manager.lora_config.lora_dtype, copy=True) for name, t in tensors.items()}
    lora = LoRAModel.from_lora_tensors(
        ADAPTER_ID, owned, helper, device="cpu", dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size, weights_mapper=mapper.get_rename_mapper() if mapper else None,
        skip_prefixes=getattr(models.model, "lora_skip_prefixes", None))
    _check_modules(lora, models)
    manager.remove_adapter(ADAPTER_ID)
    models.add_adapter(lora)
    return len(lora.loras)


def registered_adapter(worker: Any) -> Any:
    """Run inside the worker: the adapter registered under ``ADAPTER_ID`` (vLLM's ``LoRAModel``, on CPU), or None
    (no LoRA, or no push yet)."""
    if worker.vllm_config.lora_config is None:
        return None
    return worker.model_runner.lora_manager._adapter_manager.get_adapter(ADAPTER_ID)  # noqa: SLF001


def restore_adapter(worker: Any, lora: Any) -> None:
    """Run inside the worker: register ``lora`` (from ``registered_adapter``) again if it is gone. vLLM's
    ``reload_weights`` unregisters every adapter (``reset_lora_state``), while the requests still name
    ``ADAPTER_ID``: without this the next step raises ``LoRAAdapterNotFoundError``. The ``LoRAModel`` holds its
    own CPU tensors, already merged and scaled, which registering again leaves as they are; the adapter's GPU slot
    is filled again when a request activates it."""
    if lora is None:
        return
    models = worker.model_runner.lora_manager._adapter_manager  # noqa: SLF001
    if models.get_adapter(ADAPTER_ID) is None:
        models.add_adapter(lora)


def _check_modules(lora: Any, models: Any) -> None:
    """Refuse adapter modules vLLM has no LoRA layer for (``from_lora_tensors`` keeps them, and serving ignores
    them, so the engine would generate without part of the adapter)."""
    expected = set()
    for module in models.supported_lora_modules:
        expected.update(models.packed_modules_mapping.get(module, [module]))
    unknown = sorted({name for name in lora.loras if name.split(".")[-1] not in expected})
    if unknown:
        raise ValueError(f"LoRA adapter: vLLM serves LoRA on {sorted(expected)} of this model, not on {unknown[:4]}; "
                         "set the adapter's target_modules (model.base.lora) to modules among these")


@contextlib.contextmanager
def actor_adapter(actor: torch.nn.Module) -> Iterator[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
    """The adapter of a ``peft.PeftModel`` actor for the block: its tensors (``peft.get_peft_model_state_dict``,
    detached, whole: under ZeRO-3 the adapter parameters are gathered for the block, a collective every training rank
    joins, and released after it, so a receiver copies what it keeps) and its settings (``adapter_config``).

    Raises:
        TypeError: ``actor`` is not a peft model (an engine started for LoRA serves only adapters).
    """
    if not is_adapted(actor):
        raise TypeError(f"the engine serves LoRA adapters (lora_rank set) but the actor is a "
                        f"{type(actor).__name__}, not a peft.PeftModel; wrap it with peft.get_peft_model, or start "
                        "the engine without lora_rank to push full weights")
    import peft

    with _gathered([p for name, p in actor.named_parameters() if ".lora_" in name]):
        tensors = {name: t.detach() for name, t in peft.get_peft_model_state_dict(actor).items()}
        yield tensors, adapter_config(actor.peft_config["default"])
