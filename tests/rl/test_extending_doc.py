"""The worked example estimator of docs/extending.md, as written there, on hand-worked numbers through the one
signature the trainer calls (``zerotir.rl.estimators``)."""

from __future__ import annotations

import torch

from tests.tools.test_extending_doc import block
from zerotir.config import RLConfig


def test_the_example_estimator_gives_the_reward_minus_the_baseline_on_the_action_tokens_only():
    namespace: dict = {}
    exec(compile(block("estimator"), "docs/extending.md", "exec"), namespace)  # the doc's code, as written
    estimator = namespace["fixed_baseline"]
    rewards, groups = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    mask = torch.tensor([[True, True, False], [False, True, True]])  # row 0: a pad; row 1: a prompt token first
    adv, targets = estimator(rewards, groups, mask, None, None, RLConfig(kl_coef=0.0))
    assert targets is None
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.0], [0.0, -0.5, -0.5]]))  # 1 - 0.5, 0 - 0.5
    kl = torch.tensor([[0.1, 0.3, 9.0], [9.0, 0.2, 0.2]])  # the 9s sit off the mask: never summed
    adv, _ = estimator(rewards, groups, mask, kl, None, RLConfig(kl_coef=0.5))
    # row 0: 1 - 0.5 * (0.1 + 0.3) - 0.5 = 0.3; row 1: 0 - 0.5 * (0.2 + 0.2) - 0.5 = -0.7
    torch.testing.assert_close(adv, torch.tensor([[0.3, 0.3, 0.0], [0.0, -0.7, -0.7]]))
