"""docs/usage.md's example of the module driven from Python (no command line) runs as written, saved as a file and
run as a script (``python example.py``): one RL step on the shipped toy base, its embedded sandbox started and
stopped. A script, not ``exec``: the reward's worker processes (``spawn``) re-import the main file, which only a real
script run exercises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_the_python_example_trains_one_step_run_as_a_script(tmp_path):
    text = (REPO / "docs" / "usage.md").read_text()
    section = text[text.index("## From Python, without the command line"):]
    code = re.search(r"^```python\n(.*?)^```", section, re.DOTALL | re.MULTILINE).group(1)
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)  # written for the repository root
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RL steps done: 1" in done.stdout.splitlines()
