"""Test-only callbacks the e2e runs add through the command line (``--trainer.callbacks+=...``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


class SnapshotParams(Callback):
    """Save every parameter of the module (name -> tensor, and whether it is trainable) when fitting starts.

    Args:
        path: the file to write (``torch.save``).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_fit_start(self, trainer, pl_module) -> None:
        snapshot = {name: (p.detach().clone(), p.requires_grad) for name, p in pl_module.named_parameters()}
        torch.save(snapshot, self.path)


class RecordSteps(Callback):
    """Append one JSON line per RL step to ``path``: the RL step, the data batch index and the prompt ids; and, when
    training starts, the pass-rate filter's state as restored from a checkpoint (``{"start": ...}``).

    Args:
        path: a JSONL file, appended to (a resumed run continues the same file).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer, pl_module) -> None:
        filters = [cb.state_dict() for cb in trainer.callbacks if type(cb).__name__ == "PassRateFilter"]
        self._write({"start": filters[0] if filters else None, "rl_step": pl_module.rl_steps_done})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._write({"rl_step": outputs["step"].rl_step, "batch_index": batch[0]["batch_index"],
                     "ids": [row["id"] for row in batch]})


class CompareEngineWithActor(Callback):
    """When training ends (the engine still running), greedy-decode a few prompts with the rollout engine and with a
    transformers copy of the trained actor, and write both to ``path`` (JSON): equal ids mean the weights were
    synced into the engine.

    Args:
        path: the JSON file to write.
        max_new_tokens: tokens decoded per prompt.
    """

    def __init__(self, path: str, max_new_tokens: int = 24) -> None:
        self.path = Path(path)
        self.max_new_tokens = max_new_tokens
        self.last_ids: list[list[int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.last_ids = outputs["step"].rollout.input_ids[:4, :3].tolist()

    def on_train_end(self, trainer, pl_module) -> None:
        import copy

        from zerotir.rollout.engine import SamplingParams, generate
        from zerotir.rollout.hf_engine import HFEngine

        prompts = [list(ids) for ids in self.last_ids]
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=self.max_new_tokens)
        engine_ids = [s[0].token_ids for s in generate(pl_module.runtime.engine, prompts, params)]
        actor = HFEngine(copy.deepcopy(pl_module.actor).float().eval(), pl_module.tokenizer)
        actor_ids = [s[0].token_ids for s in generate(actor, prompts, params)]
        self.path.write_text(json.dumps({"engine": engine_ids, "actor": actor_ids}))


class HangAfterStep(Callback):
    """After RL step ``step`` is logged (and flushed to disk), write ``marker`` and hang: the test then kills the
    process at a known point, after the checkpoint of an earlier step and before any later one.

    Args:
        step: the RL step after which to hang.
        marker: a file written (atomically) once the step's logs are on disk.
    """

    def __init__(self, step: int, marker: str) -> None:
        self.step = step
        self.marker = Path(marker)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if outputs["step"].rl_step != self.step:
            return
        import time

        for logger in trainer.loggers:
            logger.save()
        tmp = self.marker.with_name(self.marker.name + ".tmp")
        tmp.write_text(str(self.step))
        tmp.replace(self.marker)
        while True:  # until killed
            time.sleep(60)
