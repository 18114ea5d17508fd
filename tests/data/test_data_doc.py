"""docs/data.md's example runs as written: its shell line writes the JSONL file, its command trains one RL step
(``tests.test_configs.run_one_step``: the step count is all it changes) on the shipped toy base, and its data module
reads those rows through the renamed fields (``data.problem_field`` / ``data.answer_field``)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from tests.test_configs import in_a_clone, run_one_step

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "data.md"


def example_lines() -> list[str]:
    block = re.search(r"^## Example\n.*?^```bash\n(.*?)^```", DOC.read_text(), re.DOTALL | re.MULTILINE).group(1)
    return block.strip().splitlines()


def test_the_own_dataset_example_reads_its_rows(tmp_path, monkeypatch):
    write, command = example_lines()
    clone = in_a_clone(tmp_path)  # the command is written for the repository root
    subprocess.run(["bash", "-c", write], cwd=clone, check=True)
    monkeypatch.chdir(clone)
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "zerotir", "fit"]
    cli = run_one_step("fit", words[4:])
    rows = cli.datamodule.train_rows
    assert sorted((r["problem"], r["answer"]) for r in rows) == [("12 * 34", "408"), ("56 + 78", "134")]
    assert cli.datamodule.prompts_per_step == 2 and cli.trainer.default_root_dir == "runs/my_data"
