"""docs/data.md's example runs as written: its shell line writes the JSONL file, its command builds the run (every
check, the shipped toy base loaded) and its data module reads those rows through the renamed fields
(``data.problem_field`` / ``data.answer_field``). The RL step itself is the toy config's (tests/e2e/test_emergence.py):
run here it would cost 11 s of the suite's time."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from zerotir.cli import ZeroTIRCLI

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "data.md"


def example_lines() -> list[str]:
    block = re.search(r"^## Example\n.*?^```bash\n(.*?)^```", DOC.read_text(), re.DOTALL | re.MULTILINE).group(1)
    return block.strip().splitlines()


def test_the_own_dataset_example_reads_its_rows(tmp_path, monkeypatch):
    write, command = example_lines()
    for name in ("configs", "data"):  # the command is written for the repository root
        (tmp_path / name).symlink_to(REPO / name)
    subprocess.run(["bash", "-c", write], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "zerotir", "fit"]
    cli = ZeroTIRCLI(args=words[4:], run=False)
    cli.datamodule.setup("fit")
    rows = cli.datamodule.train_rows
    assert sorted((r["problem"], r["answer"]) for r in rows) == [("12 * 34", "408"), ("56 + 78", "134")]
    assert cli.datamodule.prompts_per_step == 2 and cli.trainer.default_root_dir == "runs/my_data"
