"""The perplexity of what the policy sampled, under the reference model's log-probs."""

from __future__ import annotations

import math

import torch

from tests.rl.test_step import tiny_actor
from tests.rl.update_world import make_traj
from zerotir.config import RLConfig
from zerotir.rl.perplexity import reference_logprobs, sequence_perplexity
from zerotir.rl.update import sequence_logprobs


def test_the_perplexity_is_over_the_action_tokens_only():
    # Row 0: log-probs -1 and -3 on its two action tokens (the -9 is an injected token, off the mask): mean -2,
    # perplexity e^2. Row 1: no action token: 1.
    logp = torch.tensor([[0.0, -1.0, -9.0, -3.0], [0.0, -2.0, -2.0, -2.0]])
    mask = torch.tensor([[False, True, False, True], [False, False, False, False]])
    assert torch.allclose(sequence_perplexity(logp, mask), torch.tensor([math.exp(2.0), 1.0]))


def test_the_reference_log_probs_are_those_of_every_reference_pass():
    reference = tiny_actor().eval()
    traj = make_traj([1.0, 0.0, 1.0], [0, 0, 1])
    got = reference_logprobs(RLConfig(micro_batch_size=2), traj, reference, temperature=0.7)  # two micro-batches
    with torch.no_grad():
        whole, _ = sequence_logprobs(reference, traj.input_ids, traj.attention_mask, temperature=0.7)
    mask = traj.attention_mask.bool()
    assert torch.allclose(got[mask], whole[mask], atol=1e-6)
