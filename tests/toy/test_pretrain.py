"""Tests of the toy-base command: packing, schedule, a tiny end-to-end build, the cache."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerotir.data.prompts import tokenize_prompts
from zerotir.toy import pretrain
from zerotir.toy.pretrain import Batches, PretrainSettings, ensure_toy_base, main, read_info
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()

# A model and budget small enough for a unit test (seconds); the real base uses the defaults.
TINY = dict(steps=4, batch_size=2, seq_len=256, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
            threads=1, heldout_n=16, eval_n=0, warmup_steps=1, decay_steps=2, probe_every=1, probe_n=4)


def test_rows_hold_whole_documents_from_the_row_start():
    s = PretrainSettings(**{**TINY, "batch_size": 4})
    packer = Batches(s, TOK)
    rows = next(iter(packer))
    assert rows.shape == (4, 256)
    texts = []
    for row in rows.tolist():
        real = row[: max(i for i, t in enumerate(row) if t != 0) + 1]
        assert real[-1] == 2 and 0 not in real  # ends with EOS, padding only after it
        texts += _docs(real)
    assert texts == [text for _, text in packer.docs_used[: len(texts)]]
    assert all(t.startswith(("Python ok.\nQ: ", "```python\n", "Compute ")) for t in texts)


def _docs(row: list[int]) -> list[str]:
    """Split a packed row at its EOS ids into document texts."""
    docs, cur = [], []
    for t in row:
        if t == 2:
            docs.append(TOK.decode(cur))
            cur = []
        else:
            cur.append(t)
    return docs


def test_a_document_longer_than_a_row_is_an_error():
    packer = Batches(PretrainSettings(**{**TINY, "seq_len": 16}), TOK)
    with pytest.raises(ValueError, match="seq_len=16"):
        next(iter(packer))


def test_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="steps"):
        PretrainSettings(steps=0)
    with pytest.raises(ValueError, match="num_heads"):
        PretrainSettings(hidden_size=30, num_heads=4)
    with pytest.raises(TypeError, match="stepz"):
        ensure_toy_base("/nonexistent", stepz=3)


def test_toy_base_builds_a_loadable_folder_and_reuses_it(tmp_path, monkeypatch):
    out = tmp_path / "base"
    argv = ["--out", str(out), "--no-progress"] + [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert main(argv) == out
    info = read_info(out)
    assert info["settings"] == PretrainSettings(**TINY).to_dict()
    record = info["record"]
    assert record["steps_done"] == 4 and record["params"] > 0
    # A 16-wide model cannot copy after 1 step: the probe ran and failed, the decay began at steps - decay_steps.
    assert [p["step"] for p in record["probe"]] == [1] and record["decay_reason"] == "max_steps"
    assert record["decay_start"] == 2
    assert (out / "corpus.jsonl.gz").is_file()

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    text = "Q: 482 * 917 = ?\n```output\n441994\n```\n"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and ids[0] == ord("Q") + 3  # byte tokens, no BOS added
    assert tokenize_prompts("toy", [text], tok) == [ids]  # as the data module tokenizes RL prompts
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape == (1, len(ids), len(tok))

    # Same settings: reused without training (pretrain would raise).
    monkeypatch.setattr(pretrain, "pretrain", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    assert ensure_toy_base(out, show_progress=False, **TINY) == out
    monkeypatch.undo()

    # Other settings: rebuilt in place.
    ensure_toy_base(out, show_progress=False, **{**TINY, "steps": 2})
    assert read_info(out)["record"]["steps_done"] == 2


def test_deterministic(tmp_path):
    a = ensure_toy_base(tmp_path / "a", show_progress=False, **TINY)
    b = ensure_toy_base(tmp_path / "b", show_progress=False, **TINY)
    ma, mb = AutoModelForCausalLM.from_pretrained(a), AutoModelForCausalLM.from_pretrained(b)
    for (name, pa), (_, pb) in zip(ma.named_parameters(), mb.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert json.loads((a / "toy_base.json").read_text())["record"]["final_loss"] == read_info(b)["record"]["final_loss"]


def test_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "weights.bin").write_text("not ours")
    with pytest.raises(FileExistsError, match="not a toy-base folder"):
        ensure_toy_base(tmp_path, show_progress=False, **TINY)
