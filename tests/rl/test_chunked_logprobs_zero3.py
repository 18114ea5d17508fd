"""The LM head in chunks under DeepSpeed ZeRO-3, one rank on gloo: the head's partitioned weight is
gathered as often as the full path gathers it (once in forward, once in backward), not once per chunk and again per
chunk in backward's recompute, and the log-probs, entropies and every parameter's gradient are the full path's."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.gloo import one_deepspeed_rank
from zerotir.rl.update import sequence_logprobs
from zerotir.toy.tiny_model import tiny_llama_config
from zerotir.toy.tokenizer import build_byte_tokenizer

deepspeed = pytest.importorskip("deepspeed")

VOCAB = 1024
CHUNK = 4  # 2 rows x 8 scored positions: 4 chunks


def _model(tied: bool) -> LlamaForCausalLM:
    config = tiny_llama_config(build_byte_tokenizer(), hidden_size=32, num_layers=2, num_heads=2,
                               tie_word_embeddings=tied)
    config.vocab_size = VOCAB
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    attn = torch.ones_like(ids)
    attn[1, 6:], ids[1, 6:] = 0, 0  # right padding on one row
    return ids, attn


def _loss(logp: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    w_logp, w_entropy = torch.randn(logp.shape, generator=gen), torch.randn(logp.shape, generator=gen)
    return (logp * w_logp).sum() + (entropy * w_entropy).sum()


def _full_path(model: LlamaForCausalLM) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs, entropies and gradients of the plain model through the full logits."""
    logp, entropy = sequence_logprobs(model, *_batch(), temperature=0.7, with_entropy=True, entropy_grad=True)
    _loss(logp, entropy).backward()
    return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _count_gathers(module: torch.nn.Module, watched: torch.nn.Parameter) -> list[int]:
    """Wrap every parameter's gather entry points (``all_gather``: GatheredParameters; ``all_gather_coalesced``: the
    module hooks and their prefetch) to count the gathers of ``watched`` that fetch it (it was partitioned)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    count = [0]

    def fetches(params) -> bool:
        return any(p is watched and p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in params)

    def spy(param):
        gather, coalesced = param.all_gather, param.all_gather_coalesced

        def all_gather(param_list=None, **kwargs):
            count[0] += fetches([param] if param_list is None else param_list)
            return gather(param_list=param_list, **kwargs)

        def all_gather_coalesced(params, **kwargs):
            params = list(params)
            count[0] += fetches(params)
            return coalesced(params, **kwargs)

        param.all_gather, param.all_gather_coalesced = all_gather, all_gather_coalesced

    for p in module.parameters():
        spy(p)
    return count


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_zero3_gathers_the_head_once_per_pass_and_equals_the_full_path(tied):
    model = _model(tied)
    plain = copy.deepcopy(model)
    full = _full_path(plain)
    config = {"train_micro_batch_size_per_gpu": 1,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    with one_deepspeed_rank(model, torch.optim.AdamW(model.parameters(), lr=0.0), config) as engine:
        head = engine.module.get_output_embeddings().weight
        gathers = _count_gathers(engine.module, head)
        counts = {}
        for chunk in (None, CHUNK):
            gathers[0] = 0
            logp, entropy = sequence_logprobs(engine.module, *_batch(), temperature=0.7, with_entropy=True,
                                              entropy_grad=True, chunk_tokens=chunk)
            forward = gathers[0]
            engine.backward(_loss(logp, entropy))
            counts[chunk] = (forward, gathers[0] - forward)
            if chunk == CHUNK:
                grads = {n: deepspeed.utils.safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}
            engine.optimizer.zero_grad()
    # The full path's: once in forward and once in backward (tied: the embedding's lookup too, in both passes).
    assert counts[CHUNK] == counts[None] == ((2, 2) if tied else (1, 1))
    assert torch.allclose(logp.detach(), full[0], atol=1e-5, rtol=0)
    assert torch.allclose(entropy.detach(), full[1], atol=1e-5, rtol=0)
    assert grads.keys() == full[2].keys()
    for name, g in full[2].items():
        assert torch.allclose(grads[name], g, atol=1e-5, rtol=1e-4), name
