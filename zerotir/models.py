"""The models of an RL run: the actor (the policy being trained), its frozen reference copy (for the KL), the PPO
critic (the same backbone with a scalar value head), and the export of a trained policy as a HF folder.

A model is named by a local folder or a hub id. A local folder is loaded with ``HF_HUB_OFFLINE=1`` so that nothing
waits on the network; a name that looks like a local path but does not exist fails at once with the fix, instead of
turning into a hub lookup that hangs or fails much later; so does a hub id that is not cached when the hub cannot be
reached.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# ``attn_implementation`` values and what each needs installed (transformers' own checks, ``transformers.utils``).
ATTENTION = {"sdpa": None, "eager": None, "flash_attention_2": "is_flash_attn_2_available",
             "flash_attention_3": "is_flash_attn_3_available", "flash_attention_4": "is_flash_attn_4_available"}


class ModelNotFoundError(FileNotFoundError):
    """The configured model is neither a local folder nor a cached / reachable hub id."""


def resolve_model_path(name_or_path: str | Path, field: str = "model.base.path") -> str:
    """Turn a model name into something ``from_pretrained`` loads without a long network wait.

    Args:
        name_or_path: a local HF folder, or a hub id such as ``Qwen/Qwen2.5-7B``.
        field: the config field that holds it, named in the error.

    Returns:
        The absolute folder for a local model (and ``HF_HUB_OFFLINE`` is set to 1), or the hub id unchanged.

    Raises:
        ModelNotFoundError: the name looks like a local path and no such folder exists, a local folder has no
            ``config.json``, or the hub id is not in the local cache and ``HF_HUB_OFFLINE`` is set or the hub
            cannot be reached (checked at once, not after the download retries).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{field}={text!r}: the folder exists but has no config.json, so it is not a HF model folder. "
                "Point it at a folder written by save_pretrained (or by `python -m zerotir export` / `toy-base`)."
            )
        os.environ["HF_HUB_OFFLINE"] = "1"
        return str(path.resolve())
    if _looks_local(text):
        raise ModelNotFoundError(
            f"{field}={text!r}: no such folder. Give an existing HF model folder (config.json + weights + tokenizer), "
            "a hub id like 'Qwen/Qwen2.5-7B', or build the toy base with `python -m zerotir toy-base`."
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    if offline and not _in_hub_cache(text):
        raise ModelNotFoundError(
            f"{field}={text!r}: not a local folder and not in the hub cache, and HF_HUB_OFFLINE is set. "
            "Download it first (huggingface-cli download ...) or point the field at a local folder."
        )
    if not offline and not _hub_reachable():
        if _in_hub_cache(text):  # load the cached copy without the retries of an unreachable hub
            os.environ["HF_HUB_OFFLINE"] = "1"
            return text
        raise ModelNotFoundError(
            f"{field}={text!r}: not a local folder, not in the hub cache, and the hub cannot be reached from here "
            f"(HF_HUB_OFFLINE is not set, so loading would wait on the network and then fail). Download it where "
            f"there is a network (huggingface-cli download {text}) and point {field} at the folder or set "
            "HF_HUB_OFFLINE=1 with that cache; or fix the name if it was meant to be a local folder."
        )
    return text


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub's endpoint opens within ``timeout`` seconds (name lookup included)."""
    import socket
    import threading
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    result: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    probe = threading.Thread(target=connect, daemon=True)  # a name lookup does not honour the socket's timeout
    probe.start()
    probe.join(timeout)
    return bool(result and result[0])


def _looks_local(text: str) -> bool:
    """A name that can only mean a local path: absolute, relative with ./ or ~, more than one '/', or whose first
    component is an existing local folder (``runs/toy`` when ``runs/`` exists)."""
    if text.startswith(("/", ".", "~")) or text.count("/") != 1 or text.endswith("/"):
        return True
    return Path(text.split("/")[0]).is_dir()


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a model folder / hub id; a missing pad token falls back to EOS (base models often lack one)."""
    tok = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}: choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def check_attention(name: str | None) -> None:
    """``model.base.attn_implementation`` must be one of ``ATTENTION`` and usable here: a flash-attention kernel needs
    its package installed (``flash_attn`` for flash_attention_2) and a CUDA device. None is transformers' default
    (sdpa where torch has it): packed rows (``model.rl.pack_rows``) then take the block-diagonal N x N mask, and only
    a flash kernel reaches the variable-length path (``zerotir.rl.packing``, docs/scale.md).

    Raises:
        ValueError: an unknown name, or a kernel this machine cannot run, naming the setting and the fix.
    """
    if name is None or ATTENTION.get(name, "") is None:
        return
    if name not in ATTENTION:
        raise ValueError(f"model.base.attn_implementation={name!r}: choose one of {list(ATTENTION)}, or null "
                         "(transformers' default, sdpa)")
    import transformers.utils

    installed = getattr(transformers.utils, ATTENTION[name])()
    if not installed or not torch.cuda.is_available():
        why = ("no CUDA device here" if installed else
               "its package is not installed (flash_attention_2: pip install flash-attn --no-build-isolation)")
        raise ValueError(f"model.base.attn_implementation={name!r}: {why}, so the model cannot load with it; install "
                         "it on a CUDA machine, or set model.base.attn_implementation: sdpa (packed rows then build an "
                         "N x N mask per micro-batch)")


def load_causal_lm(
    name_or_path: str | Path, dtype: str = "float32", gradient_checkpointing: bool = False,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """A trainable causal LM (the actor).

    Args:
        name_or_path: local folder or hub id (see ``resolve_model_path``).
        dtype: parameter dtype, one of ``DTYPES``.
        gradient_checkpointing: recompute activations in the backward pass (non-reentrant; active in train mode).
        attn_implementation: the attention kernel (``check_attention``); None: transformers' default.
    """
    check_attention(attn_implementation)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(name_or_path), dtype=_dtype(dtype),
                                                 attn_implementation=attn_implementation)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # Generation caches keys/values; training never needs them (and they clash with checkpointing).
    model.config.use_cache = False
    return model


def freeze(model: nn.Module) -> nn.Module:
    """Put ``model`` in eval mode with no trainable parameter, so no optimizer state is ever made for it."""
    model.eval()
    model.requires_grad_(False)
    return model


def load_reference(name_or_path: str | Path, dtype: str = "float32",
                   attn_implementation: str | None = None) -> PreTrainedModel:
    """The frozen reference policy for the KL term: the initial actor weights, eval mode, no gradients."""
    return freeze(load_causal_lm(name_or_path, dtype=dtype, attn_implementation=attn_implementation))


class ValueModel(nn.Module):
    """The PPO critic: the causal LM's backbone (its own copy, trained) with a scalar value head instead of the LM head.

    ``forward`` returns one value per position: ``values[b, t]`` is the value of the prefix ``input_ids[b, :t + 1]``.
    The trainer shifts it by one so that it lines up with the action at ``t + 1`` (see ``rl_step.sequence_values``).
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        init_value_head(self.value_head, hidden_size)

    @property
    def config(self) -> PretrainedConfig:
        """The backbone's transformers config (its attention implementation decides how packed rows are masked)."""
        return self.backbone.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Values ``(B, T)``; ``attention_mask`` a 2D padding mask, or with ``position_ids`` restarting per
        trajectory the packed row's 4D mask (or None: the flash-attention varlen path, ``zerotir.rl.packing``)."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids).last_hidden_state
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)


def init_value_head(head: nn.Linear, hidden_size: int) -> None:
    """A small random weight (std ``1 / (hidden_size + 1)``, not zero: a zero head would block the backbone's gradient
    in the first update) and a zero bias.

    Under DeepSpeed ZeRO-3 (transformers' switch, live while the module loads its models inside
    ``deepspeed.zero.Init``) the head's parameters are partitioned the moment it is built, so an init of them would
    write into empty placeholders and leave ``nn.Linear``'s default values: the init then runs on the gathered
    parameters, and rank 0's values become every rank's (``GatheredParameters(modifier_rank=0)``).
    """
    from transformers.integrations import is_deepspeed_zero3_enabled

    gathered: contextlib.AbstractContextManager = contextlib.nullcontext()
    if is_deepspeed_zero3_enabled():
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(list(head.parameters()), modifier_rank=0)
    with gathered:
        nn.init.normal_(head.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(head.bias)


def load_critic(name_or_path: str | Path, dtype: str = "float32", gradient_checkpointing: bool = False,
                attn_implementation: str | None = None) -> ValueModel:
    """A critic initialised from the actor's pretrained backbone (the LM head is dropped)."""
    lm = load_causal_lm(name_or_path, dtype, gradient_checkpointing, attn_implementation)
    critic = ValueModel(lm.base_model, lm.config.hidden_size)
    return critic.to(_dtype(dtype))


def export_policy(ckpt_path: str | Path, out_dir: str | Path, model_path: str | None = None,
                  merged_dir: str | None = None) -> Path:
    """Write the actor of a training checkpoint as a HF folder (weights + config + tokenizer); of a LoRA run
    (``model.base.lora``), its adapters as a peft folder, and with ``merged_dir`` the merged model as a HF folder.

    Args:
        ckpt_path: a Lightning checkpoint file, or a DeepSpeed checkpoint folder (consolidated to fp32 first).
        out_dir: the folder of the policy: the whole model of a full fine-tuning run, which the rollout engines load
            like any HF model; a LoRA run's adapters as a peft folder (``peft.PeftModel.from_pretrained(base,
            out_dir)``), the merged model going to ``merged_dir``.
        model_path: the model the run started from (architecture and tokenizer); defaults to the checkpoint's
            ``base.path`` hyperparameter (``model.base.path``).
        merged_dir: a LoRA run only: a second folder, beside ``out_dir`` (the adapters), with the base and the
            adapters merged in, a plain HF folder.
    """
    checkpoint = _load_checkpoint(Path(ckpt_path))
    saved = checkpoint.get("hyper_parameters", {}).get("base") or {}
    base = model_path or saved.get("path")
    if base is None:
        raise ValueError(f"{ckpt_path}: the checkpoint names no base model (hyperparameter base.path); pass "
                         "--model_path (the run's base model)")
    dtype = saved.get("dtype", "float32")
    actor = load_causal_lm(base, dtype=dtype)
    if saved.get("lora"):
        from zerotir import lora
        from zerotir.config import LoraConfig

        actor = lora.add_adapters(actor, LoraConfig(**saved["lora"]))
    elif merged_dir is not None:
        raise ValueError(f"merged_dir={merged_dir!r}: {ckpt_path} is a full fine-tuning run (no model.base.lora), "
                         "its out_dir is the whole model already; drop --merged_dir")
    prefix = "actor."
    weights = {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    if not weights:
        raise ValueError(f"{ckpt_path}: no '{prefix}*' weights in the checkpoint's state_dict; is it a zerotir run?")
    missing, unexpected = actor.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"{ckpt_path}: actor weights do not match {base}: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    actor.config.use_cache = True
    if saved.get("lora"):
        from zerotir import lora

        lora.save_adapters(actor, str(out), merged_dir)
    else:
        actor.save_pretrained(str(out))
    for folder in (out, merged_dir):
        if folder is not None:
            load_tokenizer(base).save_pretrained(str(folder))
    return out


def _load_checkpoint(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"ckpt_path={str(path)!r}: no such checkpoint file or folder")
    if path.is_dir():  # a DeepSpeed checkpoint: gather the ZeRO shards into one fp32 state dict
        from lightning.pytorch.utilities.deepspeed import (
            convert_zero_checkpoint_to_fp32_state_dict,
        )

        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "consolidated.ckpt"
            convert_zero_checkpoint_to_fp32_state_dict(str(path), str(target))
            return torch.load(target, map_location="cpu", weights_only=False)
    return torch.load(path, map_location="cpu", weights_only=False)
