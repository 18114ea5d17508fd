"""A LoRA actor's push through the weight group (gloo, a sender and one engine side, on two threads of this process:
the group's gloo backend is built per rank, not as the default group): only the adapter travels, its settings in the
push's ``begin``, its tensors in one bucket, handed whole to ``engine.update_adapter``."""

from __future__ import annotations

from dataclasses import asdict
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from tests.ports import free_port

from zerotir.fleet.weight_group import GroupAddress, form_weight_group
from zerotir.fleet.weight_push import WeightSender, push_weights, receive_push

peft = pytest.importorskip("peft")

WORLD = 2  # the sender and one engine side
GROUP_TIMEOUT_S = 120.0  # hang guard of every wait in the group


def _actor(seed: int) -> torch.nn.Module:
    """A tiny Llama with a rank-4 LoRA whose A and B are non-zero (``seed``)."""
    from zerotir.toy.tiny_model import build_tiny_model
    from zerotir.toy.tokenizer import build_byte_tokenizer

    base = build_tiny_model(build_byte_tokenizer(), hidden_size=32, num_layers=2, num_heads=2, seed=0)
    actor = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
    return actor


class _AdapterRecorder:
    """An engine stand-in that keeps a copy of each adapter it is given, and refuses full weights."""

    def __init__(self) -> None:
        self.adapters: list[tuple[dict[str, torch.Tensor], dict]] = []

    def update_adapter(self, tensors, config) -> None:
        self.adapters.append(({name: t.clone() for name, t in tensors.items()}, config))

    def adapter_path(self, actor) -> str:
        return "adapter"

    def update_weights(self, named_tensors) -> None:
        raise AssertionError("a LoRA push sent full weights")


class _WeightsOnly:
    def adapter_path(self, actor) -> str:
        return "merged"

    def update_weights(self, named_tensors) -> None:
        raise AssertionError("a LoRA push sent full weights")


def _side(rank: int, port: int) -> dict:
    group = form_weight_group(GroupAddress("127.0.0.1", port), rank, WORLD, "cpu", GROUP_TIMEOUT_S)
    if rank == 0:
        sender, out = WeightSender(group), {"sent": [], "full_bytes": 0}
        for version, seed in ((1, 11), (2, 12), (3, 13)):
            actor = _actor(seed)
            push_weights(sender, actor, version)
            out["sent"].append({n: t.detach().clone() for n, t in peft.get_peft_model_state_dict(actor).items()})
            out["full_bytes"] = sum(p.numel() * p.element_size() for p in actor.get_base_model().parameters())
        out["stats"] = [asdict(s) for s in sender.pushes]
        sender.stop()
    else:
        engine, out = _AdapterRecorder(), {}
        out["versions"] = [receive_push(group, engine) for _ in range(2)]
        out["adapters"] = engine.adapters
        try:
            receive_push(group, _WeightsOnly())
        except ValueError as exc:
            out["refused"] = str(exc)
        out["after_stop"] = receive_push(group, engine)
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    port = free_port()
    with ThreadPoolExecutor(WORLD) as pool:
        sides = [pool.submit(_side, rank, port) for rank in range(WORLD)]
        return [side.result(timeout=2 * GROUP_TIMEOUT_S) for side in sides]


def test_the_engine_gets_each_adapter_exactly_and_no_weights(ranks: list[dict]) -> None:
    sender, engine = ranks
    assert engine["versions"] == [1, 2]
    for sent, (got, config) in zip(sender["sent"][:2], engine["adapters"], strict=True):
        assert sorted(got) == sorted(sent) and all(torch.equal(got[n], sent[n]) for n in sent)
        assert config["r"] == 4 and config["lora_alpha"] == 8 and config["target_modules"] == ["q_proj", "v_proj"]
    assert not torch.equal(*(a[0][next(iter(a[0]))] for a in engine["adapters"]))  # two versions, two adapters
    assert engine["after_stop"] is None


def test_a_push_carries_only_the_adapter_bytes_in_one_bucket(ranks: list[dict]) -> None:
    sender, _ = ranks
    adapter_bytes = sum(t.numel() * t.element_size() for t in sender["sent"][0].values())
    assert [(s["version"], s["bytes"], s["buckets"]) for s in sender["stats"]] == [
        (v, adapter_bytes, 1) for v in (1, 2, 3)]
    assert adapter_bytes * 20 < sender["full_bytes"]


def test_an_engine_without_adapters_refuses_a_lora_push_naming_the_fix(ranks: list[dict]) -> None:
    assert "push 3 is a LoRA adapter but this engine (_WeightsOnly) serves no adapters" in ranks[1]["refused"]
