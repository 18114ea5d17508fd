"""PromptDataModule: bundled files, sources and validation, the resumable train stream, eval loaders."""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer

from zerotir.data.datamodule import BENCHMARKS, BUNDLED, PromptDataModule, data_dir, load_rows
from zerotir.data.stream import PromptStream
from zerotir.toy.tokenizer import build_byte_tokenizer

# Row counts from data/README.md.
BUNDLED_ROWS = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "gsm8k": 1319, "minerva": 272,
                "olympiadbench": 675, "simplelr_math_level3to5": 8518, "gsm8k_train": 7473}


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def make_rows(n: int) -> list[dict]:
    return [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]


def module(tok, **kwargs) -> PromptDataModule:
    dm = PromptDataModule(**kwargs)
    dm.set_tokenizer(tok)
    return dm


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_every_bundled_file_loads(name: str) -> None:
    rows = load_rows(name)
    assert len(rows) == BUNDLED_ROWS[name]
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(r["problem"].strip() and r["answer"].strip() for r in rows)


def test_bundled_data_size_and_readme() -> None:
    files = list(data_dir().glob("*.jsonl"))
    assert sorted(f.name for f in files) == sorted(BUNDLED.values())
    assert sum(f.stat().st_size for f in files) < 10 * 2**20
    readme = (data_dir() / "README.md").read_text()
    assert all(fname in readme for fname in BUNDLED.values())


def test_benchmarks_through_the_datamodule(tok) -> None:
    dm = module(tok, max_prompt_tokens=None, eval_prompts_per_batch=256)
    assert dm.test_names == list(BENCHMARKS)
    dm.setup("test")
    loaders = dm.test_dataloader()
    for name, loader in zip(dm.test_names, loaders):
        batches = list(loader)
        assert sum(len(b) for b in batches) == BUNDLED_ROWS[name]
        row = batches[0][0]
        assert set(row) >= {"id", "problem", "answer", "prompt_text", "prompt_ids", "source"}
        assert row["source"] == name and isinstance(row["prompt_ids"], list) and isinstance(row["prompt_ids"][0], int)
        assert tok.decode(row["prompt_ids"]) == row["prompt_text"]


def test_eval_loaders_limit_and_batching(tok) -> None:
    dm = module(tok, val_files=["aime24"], test_files=["aime25", "amc23"], limit_test_rows=5, limit_val_rows=3,
                max_prompt_tokens=None,
                eval_prompts_per_batch=2)
    dm.setup("test")
    assert [[len(b) for b in loader] for loader in dm.test_dataloader()] == [[2, 2, 1], [2, 2, 1]]
    first = next(iter(dm.test_dataloader()[0]))
    assert [r["id"] for r in first] == ["2025-I-1", "2025-I-2"]  # file order, no shuffling
    dm.setup("validate")
    assert dm.val_names == ["aime24"] and sum(len(b) for b in dm.val_dataloader()[0]) == 3


@pytest.mark.parametrize(("line", "message"), [
    ({"id": "x", "answer": "1"}, "field 'problem' is missing"),
    ({"id": "x", "problem": "  ", "answer": "1"}, "field 'problem' is empty"),
    ({"id": "x", "problem": "p", "answer": ""}, "field 'answer' is empty"),
    ({"id": "x", "problem": "p", "answer": None}, "field 'answer' is null"),
])
def test_bad_row_names_file_line_and_field(tmp_path: Path, line: dict, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [*make_rows(2), line])
    with pytest.raises(ValueError, match=message) as info:
        load_rows(str(path))
    assert f"{path}:3" in str(info.value)


def test_bad_json_and_unknown_sources(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"problem": "p", "answer": "1"}\n{"problem": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}:2: not valid JSON"):
        load_rows(str(path))
    with pytest.raises(ValueError, match="unknown file type '.csv'"):
        load_rows(str(tmp_path / "x.csv"))
    with pytest.raises(FileNotFoundError, match="no file at"):
        load_rows(str(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="has no rows"):
        load_rows(str(empty))


def test_parquet_custom_fields_and_id_fallback(tmp_path: Path) -> None:
    table = pa.table({"question": ["q0", "q1", "q2"], "final": [4, 0, 7]})
    path = tmp_path / "my_set.parquet"
    pq.write_table(table, path)
    rows = load_rows(str(path), problem_field="question", answer_field="final")
    assert rows == [{"id": "my_set-0", "problem": "q0", "answer": "4"},
                    {"id": "my_set-1", "problem": "q1", "answer": "0"},
                    {"id": "my_set-2", "problem": "q2", "answer": "7"}]
    pq.write_table(pa.table({"question": ["q0", None]}), path)
    with pytest.raises(ValueError, match=r"row 0: field 'problem' is missing"):
        load_rows(str(path))
    with pytest.raises(ValueError, match=r"row 1: field 'question' is null"):
        load_rows(str(path), problem_field="question", answer_field="question")


def test_hf_source(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def load_dataset(name: str, split: str):
        calls.append((name, split))
        return [{"question": "q", "answer": "1"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert load_rows("hf:org/set", problem_field="question", default_split="train")[0]["problem"] == "q"
    load_rows("hf:org/set:validation", problem_field="question")
    assert calls == [("org/set", "train"), ("org/set", "validation")]
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ImportError, match="needs the 'datasets' package"):
        load_rows("hf:org/set")


def test_long_prompts_are_dropped_with_a_count(tmp_path: Path, tok, caplog: pytest.LogCaptureFixture) -> None:
    rows = make_rows(3) + [{"id": "long", "problem": "x" * 500, "answer": "1"}]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    dm = module(tok, test_files=[str(path)], template="plain", max_prompt_tokens=200)
    with caplog.at_level(logging.WARNING, logger="zerotir.data.datamodule"):
        dm.setup("test")
    assert dm.dropped == {"mixed": 1}
    assert "dropped 1 of 4 prompts of 'mixed'" in caplog.text
    assert [r["id"] for b in dm.test_dataloader()[0] for r in b] == ["p0", "p1", "p2"]


def test_tokenizer_from_path_and_missing_tokenizer(tmp_path: Path, tok) -> None:
    tok.save_pretrained(str(tmp_path / "tok"))
    dm = PromptDataModule(test_files=["aime24"], tokenizer=str(tmp_path / "tok"))
    dm.setup("test")
    row = dm.eval_rows["test"]["aime24"][0]
    assert row["prompt_ids"] == tok(row["prompt_text"])["input_ids"]
    with pytest.raises(ValueError, match="needs a tokenizer"):
        PromptDataModule(test_files=["aime24"]).setup("test")


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="unknown prompt template"):
        PromptDataModule(template="nope")
    with pytest.raises(ValueError, match="share the name"):
        _ = PromptDataModule(test_files=["a/x.jsonl", "b/x.jsonl"]).test_names


def test_stream_epochs_are_permutations() -> None:
    rows = [{"id": str(i), "prompt_ids": [i]} for i in range(10)]
    stream = PromptStream(rows, prompts_per_step=4, seed=3)
    ids = [r["id"] for b in range(5) for r in stream.batch(b)]  # 20 items = exactly two epochs
    assert sorted(ids[:10]) == sorted(ids[10:]) == [str(i) for i in range(10)]
    assert ids[:10] != ids[10:]  # reshuffled per epoch
    assert [r["batch_index"] for r in stream.batch(2)] == [2] * 4  # batch 2 spans the epoch boundary
    assert ids == [r["id"] for b in range(5) for r in PromptStream(rows, 4, seed=3).batch(b)]
    assert ids != [r["id"] for b in range(5) for r in PromptStream(rows, 4, seed=4).batch(b)]


def test_resume_continues_with_the_next_unseen_batch(tmp_path: Path, tok) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", make_rows(10))
    dm = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    dm.setup("fit")
    loader_iter = dm.train_batches("batch")
    batches = [next(loader_iter) for _ in range(3)]  # batch 2 is only prefetched
    assert [b[0]["batch_index"] for b in batches] == [0, 1, 2]
    dm.mark_consumed(0)
    dm.mark_consumed(1)
    state = dm.state_dict()
    assert state["consumed"] == 2 and state["num_train_rows"] == 10
    with pytest.raises(ValueError, match="already consumed"):
        dm.mark_consumed(1)

    resumed = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    resumed.load_state_dict(state)
    resumed.setup("fit")
    nxt = next(resumed.train_batches("batch"))
    assert nxt == batches[2]

    other = module(tok, train_files=[str(path)], prompts_per_step=3, seed=8, test_files=[])
    other.load_state_dict(state)  # checked once the training rows are loaded
    with pytest.raises(ValueError, match="seed=7 but this run has seed=8"):
        other.setup("fit")
    fitted = module(tok, train_files=[str(path)], prompts_per_step=4, seed=7, test_files=[])
    fitted.setup("fit")
    with pytest.raises(ValueError, match="prompts_per_step=3 but this run has prompts_per_step=4"):
        fitted.load_state_dict(state)  # restored after setup, as Lightning does in fit
    # Evaluating a checkpoint never reads the training stream: other data settings are fine there.
    evaluating = module(tok, train_files=[str(path)], prompts_per_step=128, seed=0, test_files=[str(path)])
    evaluating.setup("test")
    evaluating.load_state_dict(state)
    assert evaluating.consumed == 2


def test_the_train_loader_only_ticks_the_steps(tmp_path: Path, tok) -> None:
    """The prompts are the rollout source's to read (``train_batches``); Lightning's loader counts steps only."""
    path = write_jsonl(tmp_path / "train.jsonl", make_rows(10))
    dm = module(tok, train_files=[str(path)], prompts_per_step=3, seed=7, test_files=[])
    ticks = iter(dm.train_dataloader())
    assert [next(ticks) for _ in range(3)] == [0, 1, 2]
    assert dm.consumed == 0 and [r["batch_index"] for r in next(dm.train_batches("batch"))] == [0, 0, 0]
    with pytest.raises(ValueError, match="no training data: set data.train_files"):
        module(tok, test_files=[]).train_dataloader()


class _Recorder(LightningModule):
    """Records the training batches it reads from the stream and marks them consumed, as the RL module and its
    rollout source do (the loader only ticks the steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.automatic_optimization = False
        self.seen: list[int] = []
        self.batches = None

    def training_step(self, tick: int, batch_idx: int) -> None:
        if self.batches is None:  # read from the first step on, once a resumed run's data position is loaded
            self.batches = self.trainer.datamodule.train_batches("batch")
        index = next(self.batches)[0]["batch_index"]
        self.seen.append(index)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward((self.weight - 1.0).pow(2).sum())
        opt.step()  # under manual optimization the global step counts optimizer steps
        self.trainer.datamodule.mark_consumed(index)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(max_steps: int) -> Trainer:
    return Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


def test_resume_through_lightning(tmp_path: Path, tok) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", make_rows(7))
    first = _Recorder()
    trainer = _trainer(3)
    trainer.fit(first, datamodule=module(tok, train_files=[str(path)], prompts_per_step=2, test_files=[]))
    trainer.save_checkpoint(tmp_path / "step3.ckpt")
    assert first.seen == [0, 1, 2]

    second = _Recorder()
    dm = module(tok, train_files=[str(path)], prompts_per_step=2, test_files=[])
    _trainer(6).fit(second, datamodule=dm, ckpt_path=tmp_path / "step3.ckpt")
    assert second.seen == [3, 4, 5]
    assert dm.consumed == 6


def test_jsonargparse_signature() -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(PromptDataModule, "data")
    cfg = parser.parse_args(["--data.train_files=[math500, x.parquet]", "--data.prompts_per_step=16",
                             "--data.limit_test_rows=4", "--data.template=plain"])
    assert cfg.data.train_files == ["math500", "x.parquet"]
    assert cfg.data.prompts_per_step == 16 and cfg.data.limit_test_rows == 4 and cfg.data.template == "plain"
