"""Loading actor / reference / critic, the fail-fast model path check, and export to a HF folder."""

from __future__ import annotations

import os
import time

import pytest
import torch
import transformers.utils

from zerotir import models


@pytest.fixture
def clean_offline(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.mark.parametrize("name", ["./missing_model", "/no/such/model", "a/b/c", "~/nope_model_xyz", "dir/"])
def test_missing_local_path_fails_at_once_naming_the_field(name, clean_offline):
    start = time.perf_counter()
    with pytest.raises(models.ModelNotFoundError, match=r"model.base.path=.*no such folder"):
        models.resolve_model_path(name)
    assert time.perf_counter() - start < 1.0  # no network attempt


def test_relative_path_under_an_existing_folder_is_local(tmp_path, monkeypatch, clean_offline):
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(models.ModelNotFoundError, match="no such folder"):
        models.resolve_model_path("runs/toy_base")


def test_folder_without_config_is_rejected(tmp_path, clean_offline):
    with pytest.raises(models.ModelNotFoundError, match="no config.json"):
        models.resolve_model_path(tmp_path, field="data.tokenizer")


def test_hub_id_offline_and_uncached_fails_with_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import huggingface_hub.constants as const

    monkeypatch.setattr(const, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(models.ModelNotFoundError, match="HF_HUB_OFFLINE"):
        models.resolve_model_path("SomeOrg/some-model")


def test_hub_id_online_is_passed_through(tmp_path, monkeypatch, clean_offline):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(models, "_hub_reachable", lambda: True)
    assert models.resolve_model_path("SomeOrg/some-model") == "SomeOrg/some-model"
    assert "HF_HUB_OFFLINE" not in os.environ


def test_hub_id_uncached_without_a_network_fails_at_once_naming_hf_hub_offline(tmp_path, monkeypatch, clean_offline):
    """Not offline by setting, but the hub cannot be reached: the error comes before any download retry."""
    monkeypatch.chdir(tmp_path)
    import huggingface_hub.constants as const

    monkeypatch.setattr(const, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "_hub_reachable", lambda: False)
    with pytest.raises(models.ModelNotFoundError, match="model.base.path='SomeOrg/some-model'.*HF_HUB_OFFLINE"):
        models.resolve_model_path("SomeOrg/some-model")


def test_local_folder_sets_offline_and_resolves(tiny_dir, clean_offline, monkeypatch):
    assert models.resolve_model_path(str(tiny_dir)) == str(tiny_dir.resolve())
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_actor_dtype_and_checkpointing(tiny_dir):
    actor = models.load_causal_lm(tiny_dir, dtype="bfloat16", gradient_checkpointing=True)
    assert next(actor.parameters()).dtype == torch.bfloat16
    assert actor.is_gradient_checkpointing
    assert all(p.requires_grad for p in actor.parameters())
    with pytest.raises(ValueError, match="dtype='fp8'"):
        models.load_causal_lm(tiny_dir, dtype="fp8")


def test_reference_is_frozen_copy_of_actor(tiny_dir):
    actor = models.load_causal_lm(tiny_dir)
    ref = models.load_reference(tiny_dir)
    assert not ref.training
    assert not any(p.requires_grad for p in ref.parameters())
    for (name, a), (_, r) in zip(actor.named_parameters(), ref.named_parameters()):
        assert torch.equal(a, r), name


def test_critic_shares_backbone_weights_and_trains_them(tiny_dir):
    actor = models.load_causal_lm(tiny_dir)
    critic = models.load_critic(tiny_dir)
    backbone = dict(critic.backbone.named_parameters())
    for name, p in actor.model.named_parameters():
        assert torch.equal(backbone[name], p), name
        assert backbone[name].data_ptr() != p.data_ptr()  # its own copy, trained separately
    ids = torch.tensor([[1, 10, 11, 12], [1, 20, 21, 0]])
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    values = critic(ids, attn)
    assert values.shape == (2, 4)
    values[:, :3].sum().backward()
    grads = [p.grad for p in critic.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads[:1] + grads[-2:])  # embedding and value head


def test_export_writes_the_checkpoint_policy(tiny_dir, tmp_path):
    actor = models.load_causal_lm(tiny_dir)
    state = {f"actor.{k}": v + 0.5 for k, v in actor.state_dict().items()}
    state["critic.value_head.weight"] = torch.zeros(1, 32)  # other modules' weights are ignored
    ckpt = tmp_path / "run.ckpt"
    torch.save({"hyper_parameters": {"base": {"path": str(tiny_dir), "dtype": "float32"}}, "state_dict": state}, ckpt)
    out = models.export_policy(ckpt, tmp_path / "exported")
    reloaded = models.load_causal_lm(out)
    for name, p in reloaded.state_dict().items():
        assert torch.allclose(p, actor.state_dict()[name] + 0.5), name
    assert (out / "tokenizer.json").is_file()
    assert models.load_tokenizer(out).pad_token_id == 0


def test_export_errors_name_the_problem(tiny_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="ckpt_path="):
        models.export_policy(tmp_path / "none.ckpt", tmp_path / "out")
    ckpt = tmp_path / "bare.ckpt"
    torch.save({"state_dict": {}}, ckpt)
    with pytest.raises(ValueError, match="--model_path"):
        models.export_policy(ckpt, tmp_path / "out")
    torch.save({"hyper_parameters": {"base": {"path": str(tiny_dir)}}, "state_dict": {"other.w": torch.zeros(1)}}, ckpt)
    with pytest.raises(ValueError, match="no 'actor"):
        models.export_policy(ckpt, tmp_path / "out")


def test_the_attention_kernel_is_passed_to_from_pretrained_and_checked_against_what_is_installed(tiny_dir):
    # packed rows reach transformers' varlen path only under a flash kernel (zerotir.rl.packing, docs/scale.md)
    eager = models.load_causal_lm(tiny_dir, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
    assert models.load_reference(tiny_dir, attn_implementation="eager").config._attn_implementation == "eager"
    assert models.load_causal_lm(tiny_dir).config._attn_implementation == "sdpa"  # transformers' default
    with pytest.raises(ValueError, match=r"model.base.attn_implementation='flash': choose one of \['sdpa', 'eager', "):
        models.check_attention("flash")
    if not (torch.cuda.is_available() and transformers.utils.is_flash_attn_2_available()):
        with pytest.raises(ValueError, match=r"model.base.attn_implementation='flash_attention_2': (no CUDA device here|its "
                                             r"package is not installed).*or set model.base.attn_implementation: sdpa"):
            models.load_causal_lm(tiny_dir, attn_implementation="flash_attention_2")
