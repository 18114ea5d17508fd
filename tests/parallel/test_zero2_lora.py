"""DeepSpeed ZeRO-2 with LoRA adapters: PPO with adapters on the actor and on the critic, 2 RL steps of
the scripted rollout (``tests.scripted_source``) under ``CpuDeepSpeedStrategy`` with the rehearsal's ZeRO-2 config
(``configs/rehearsal/zero2.json``), one rank on gloo, and a checkpoint at the end. The adapters and the value head
must move, every base weight stay bit-identical (the optimizer DeepSpeed wraps holds only what trains), and the
checkpoint hold the adapters and no reference. ZeRO-3 with adapters, 2 ranks against 1, is
``tests/e2e/test_rehearsal_lora.py``'s.

The run is this file as a one-process job of its own (``_worker`` under ``__main__``): DeepSpeed's process group and
CPU accelerator stay out of the test process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def _worker(root: Path) -> dict:
    """Two ZeRO-2 steps of LoRA PPO in this process; what changed, what the optimizer held, what was saved."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.scripted_source import ScriptedSource
    from tests.tiny_models import save_tiny_model
    from zerotir.config import BaseModelConfig, LoraConfig, OptimConfig, RLConfig, SamplingConfig
    from zerotir.data.datamodule import PromptDataModule
    from zerotir.module import ZeroTIRModule
    from zerotir.parallel.cpu_deepspeed import CpuDeepSpeedStrategy

    tiny, train = root / "tiny", root / "train.jsonl"
    save_tiny_model(tiny)
    train.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"{i} + {i}", "answer": str(2 * i)}) + "\n"
                             for i in range(6)))
    pl.seed_everything(0)
    module = ZeroTIRModule(BaseModelConfig(str(tiny), lora=LoraConfig(rank=4, alpha=8.0)),
                           rl=RLConfig(algorithm="ppo", micro_batch_size=2, kl_coef=0.0),
                           optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), seed=3,
                           sampling=SamplingConfig(n=2, max_response_tokens=16))
    module.source = ScriptedSource(module)
    data = PromptDataModule(train_files=[str(train)], template="plain", tokenizer=str(tiny), prompts_per_step=2,
                            test_files=[])
    module.configure_model()
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    config = json.loads((REPO / "configs" / "rehearsal" / "zero2.json").read_text())
    ckpt = ModelCheckpoint(dirpath=root / "ckpt", save_last=True, save_top_k=0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=CpuDeepSpeedStrategy(config=config), max_steps=2,
                         precision="32-true", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=root, callbacks=[ckpt])
    trainer.fit(module, datamodule=data)
    zero = trainer.strategy.deepspeed_engine.optimizer  # DeepSpeed's ZeRO-2 optimizer: its groups of model params
    optimized = {id(p) for group in zero.bit16_groups for p in group}
    states = sorted(str(p.relative_to(root / "ckpt")) for p in (root / "ckpt").rglob("*.pt"))
    saved = torch.load(root / "ckpt" / "last.ckpt" / "checkpoint" / "mp_rank_00_model_states.pt", weights_only=False)
    return {"stage": trainer.strategy.deepspeed_engine.zero_optimization_stage(), "steps": module.rl_steps_done,
            "changed": sorted(n for n, p in module.named_parameters() if not torch.equal(before[n], p.detach())),
            "trainable": sorted(n for n, p in module.named_parameters() if p.requires_grad),
            "optimized": sorted(n for n, p in module.named_parameters() if id(p) in optimized),
            "states": states, "saved": sorted(saved["module"])}


def _run(root: Path) -> dict:
    """This file as a one-process gloo job on DeepSpeed's CPU accelerator; the JSON its worker prints."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, __file__, str(root)], env=env, capture_output=True, text=True, timeout=560,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.timeout(600)  # a hang guard
def test_zero2_trains_the_adapters_and_value_head_and_keeps_the_base(tmp_path):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed")
    out = _run(tmp_path)
    assert out["stage"] == 2 and out["steps"] == 2
    adapters = {n for n in out["trainable"] if ".lora_" in n}
    heads = {"critic.value_head.weight", "critic.value_head.bias"}
    assert set(out["trainable"]) == adapters | heads and {n.split(".")[0] for n in adapters} == {"actor", "critic"}
    assert out["optimized"] == out["trainable"]  # the optimizer DeepSpeed wraps holds only what trains
    changed = set(out["changed"])
    assert heads <= changed and any(n.startswith("actor.") and ".lora_B." in n for n in changed)
    assert changed <= adapters | heads  # every base weight bit-identical after the ZeRO-2 steps
    assert "last.ckpt/checkpoint/mp_rank_00_model_states.pt" in out["states"]
    assert any(s.endswith("optim_states.pt") for s in out["states"])
    assert any(".lora_A." in k for k in out["saved"]) and not any(k.startswith("ref_model.") for k in out["saved"])


if __name__ == "__main__":
    print(json.dumps(_worker(Path(sys.argv[1]))))
