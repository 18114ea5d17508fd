"""Tests of the toy-base command: packing, schedule, a tiny end-to-end build, the cache, the shipped base."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerotir.data.prompts import tokenize_prompts
from zerotir.toy import base_folder, pretrain
from zerotir.toy.base_folder import ChecksumError, settings_differ
from zerotir.toy.pretrain import Batches, PretrainSettings, ensure_toy_base, main, read_info
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()
REPO = Path(__file__).resolve().parents[2]

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
    assert info["settings"] == PretrainSettings(**TINY).identity()  # all but the minutes limit
    record = info["record"]
    assert record["steps_done"] == 4 and record["params"] > 0
    # A 16-wide model cannot copy after 1 step: the probe ran and failed, the decay began at steps - decay_steps.
    assert [p["step"] for p in record["probe"]] == [1] and record["decay_reason"] == "max_steps"
    assert record["decay_start"] == 2
    assert len(record["corpus_sha256"]) == 64 and (out / "SHA256SUMS").is_file()

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


def test_a_failed_build_leaves_no_tmp_folder_and_clears_a_killed_ones(tmp_path, monkeypatch):
    killed = subprocess.Popen([sys.executable, "-c", ""])
    killed.wait()
    stale = tmp_path / f".base.tmp-{killed.pid}"  # what a SIGKILLed build leaves behind
    stale.mkdir()

    def fail(s, out_dir, show_progress):
        (out_dir / "model.safetensors").write_text("half written")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(pretrain, "pretrain", fail)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        ensure_toy_base(tmp_path / "base", show_progress=False, **TINY)
    assert list(tmp_path.iterdir()) == []


def test_a_reused_base_is_verified_against_its_checksums(tmp_path):
    out = ensure_toy_base(tmp_path / "base", show_progress=False, **TINY)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    with pytest.raises(ChecksumError, match=r"config.json: its sha256 differs"):
        ensure_toy_base(out, show_progress=False, **TINY)


def test_a_run_never_rewrites_the_shipped_base(tmp_path, monkeypatch):
    shipped = ensure_toy_base(tmp_path / "toy_base", show_progress=False, **TINY)
    monkeypatch.setattr(base_folder, "SHIPPED", shipped.resolve())
    before = {p.name: p.read_bytes() for p in shipped.iterdir()}
    with pytest.raises(ValueError, match=r"shipped with the repository \(data/toy_base\), built with other settings "
                                         r"\(steps: 4 there, 2 asked\); a run never rewrites it.*"
                                         r"toy-base --out runs/toy_base_custom --steps 2`"):
        ensure_toy_base(shipped, show_progress=False, **{**TINY, "steps": 2})
    assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before
    assert ensure_toy_base(shipped, show_progress=False, **TINY) == shipped  # the same settings: used as it is
    main(["--out", str(shipped), "--no-progress", "--rebuild"] + [f"--{k.replace('_', '-')}={v}" for k, v in
                                                                   {**TINY, "steps": 2}.items()])
    assert read_info(shipped)["record"]["steps_done"] == 2  # the toy-base command remakes it on demand


def test_a_missing_shipped_base_is_not_rebuilt_by_a_run(tmp_path, monkeypatch):
    monkeypatch.setattr(base_folder, "SHIPPED", (tmp_path / "toy_base").resolve())
    with pytest.raises(FileNotFoundError, match=r"git checkout -- data/toy_base"):
        ensure_toy_base(tmp_path / "toy_base", show_progress=False, **TINY)
    assert not (tmp_path / "toy_base").exists()


def test_the_default_config_uses_the_shipped_base_without_building(monkeypatch):
    import yaml

    config = yaml.safe_load((REPO / "configs" / "toy_cpu.yaml").read_text())
    assert config["model"]["base"]["path"] == "data/toy_base" and config["toy_base"] == {}
    monkeypatch.setattr(pretrain, "pretrain", lambda *a, **k: (_ for _ in ()).throw(AssertionError("rebuilt")))
    assert ensure_toy_base(REPO / "data" / "toy_base", show_progress=False) == REPO / "data" / "toy_base"


def test_a_time_limit_is_not_part_of_the_base_and_an_old_clock_shaped_base_is_rebuilt(tmp_path, monkeypatch):
    out = ensure_toy_base(tmp_path / "base", show_progress=False, **TINY)
    monkeypatch.setattr(pretrain, "pretrain", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    assert ensure_toy_base(out, show_progress=False, **{**TINY, "minutes": 30.0}) == out  # the limit shapes nothing
    monkeypatch.undo()
    info = read_info(out)
    # A folder of the version whose budget in minutes could move the decay records it among its settings.
    info["settings"]["minutes"] = 10.0
    (out / "toy_base.json").write_text(json.dumps(info))
    assert pretrain.settings_differ(info, PretrainSettings(**TINY)) == {"minutes": (10.0, None)}
    ensure_toy_base(out, show_progress=False, **TINY)
    assert "minutes" not in read_info(out)["settings"]


def test_every_toy_config_uses_the_shipped_base_or_builds_other_settings_elsewhere():
    """A config with the default settings names the shipped folder (nothing to build); one with other settings names
    a folder of its own under runs/ (it could never be built in the shipped one) and names it in a comment that says
    why, or a base shipped under data/ built with exactly its settings (nothing to build: data/toy_tools_base)."""
    import yaml

    seen = 0
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        if config.get("toy_base") is None:
            continue
        seen += 1
        where = config["model"]["base"]["path"]
        if config["toy_base"] == {}:
            assert where == "data/toy_base", path
        elif where.startswith("data/") and where != "data/toy_base":
            assert not settings_differ(read_info(REPO / where), PretrainSettings(**config["toy_base"])), path
        else:
            comments = [line for line in path.read_text().splitlines() if line.lstrip().startswith("#")]
            assert where.startswith("runs/") and any(where in line for line in comments), path
    assert seen >= 10
