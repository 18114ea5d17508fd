"""``python -m zerotir scaling --group-by``: runs grouped by a config key or by model size (zerotir.scaling.groups)."""

import json
from pathlib import Path

import pytest
import yaml

from tests.scaling.test_report import _png_size, _write_run
from zerotir.scaling import report as scaling
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Three runs with their saved config: budgets 1, 4, 4 on a 16-wide and a 32-wide model."""
    root = tmp_path_factory.mktemp("sweep")
    tok = build_byte_tokenizer()
    for width in (16, 32):
        build_tiny_model(tok, save_dir=root / f"model{width}", hidden_size=width, num_layers=1, num_heads=2)
    for name, budget, width, m in (("b1", 1, 16, 20.0), ("b4", 4, 16, 10.0), ("b4_wide", 4, 32, 8.0)):
        run = root / name / "tensorboard"
        _write_run(run, steps=30, m=m)
        config = {"model": {"base": {"path": str(root / f"model{width}")}, "tool": {"max_tool_calls": budget}}}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def test_group_by_a_config_key_and_by_size(sweep, tmp_path):
    out = tmp_path / "report"
    args = ["--logdir", str(sweep), "--out", str(out), "--last-n", "5", "--group-by", "model.tool.max_tool_calls",
            "params"]
    assert scaling.main(args) == 0
    report = json.loads((out / "scaling.json").read_text())
    budget = report["groups"]["model.tool.max_tool_calls"]["groups"]
    assert list(budget) == ["1", "4"] and [len(g["runs"]) for g in budget.values()] == [1, 2]
    # The slower run (half-way at step 20) is further from its plateau and takes longer to 80% of it.
    assert budget["1"]["steps_to_fraction"] > budget["4"]["steps_to_fraction"]
    size = report["groups"]["params"]
    assert len(size["groups"]) == 2 and size["closed_form"]["fit"]["points"] == 90
    assert 0.0 < size["closed_form"]["law_r2"] <= 1.0
    width, _ = _png_size(out / "groups.png")
    assert width > 600
    assert "Runs grouped by params" in (out / "scaling.md").read_text()


def test_group_by_an_unknown_key_names_it(sweep, tmp_path, capsys):
    assert scaling.main(["--logdir", str(sweep), "--out", str(tmp_path), "--group-by", "model.nope"]) == 2
    err = capsys.readouterr().err
    assert "--group-by model.nope" in err and "no 'nope'" in err
