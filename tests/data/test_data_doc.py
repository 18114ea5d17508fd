"""docs/data.md's example runs as written: its shell line writes the JSONL file, its command trains one RL step
(``tests.test_configs.run_one_step``: the step count is all it changes) on the shipped toy base, and its data module
reads those rows through the renamed fields (``data.problem_field`` / ``data.answer_field``)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.test_configs import in_a_clone, run_one_step

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "data.md"


def example_lines() -> list[str]:
    block = re.search(r"^## Example\n.*?^```bash\n(.*?)^```", DOC.read_text(), re.DOTALL | re.MULTILINE).group(1)
    return block.strip().splitlines()


@pytest.mark.e2e
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


def curriculum_block() -> str:
    return re.search(r"^## Curricula.*?^```yaml\n(.*?)^```", DOC.read_text(), re.DOTALL | re.MULTILINE).group(1)


def test_the_curriculum_example_parses_and_draws_its_first_stage(tmp_path, monkeypatch):
    """The YAML of docs/data.md's curriculum section, as an overlay of configs/toy_cpu.yaml (parsed by the real
    command line, the data module set up for fit: its kinds checked against the rows); its first batches are of the
    first stage's kinds, and the 10-step stage follows once the first stage's pass rate is met."""
    from zerotir.cli.app import ZeroTIRCLI

    clone = in_a_clone(tmp_path)
    (clone / "curriculum.yaml").write_text(curriculum_block())
    monkeypatch.chdir(clone)
    cli = ZeroTIRCLI(args=["--config", "configs/toy_cpu.yaml", "--config", "curriculum.yaml"], run=False)
    data = cli.datamodule
    data.setup("fit")
    assert data.curriculum.adaptive and [stage.steps for stage in data.curriculum.stages] == [None, 10, None]
    stream = data.train_batches("batch")
    assert {row["kind"] for row in next(stream)} <= {"add_1d", "mul_1d"}
    for b in range(4):  # every answer right: the window of 4 batches reaches the 0.8 of stage 0
        data.observe([(b, "add_1d", "train", True)])
    assert {row["kind"] for b in range(4, 14) for row in data.train_batch(b)} <= {"mul_1d", "mul_add"}
    assert data.train_batch(14) and data.state_dict()["curriculum"]["stage"] == 1
