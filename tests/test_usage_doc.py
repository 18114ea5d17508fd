"""docs/usage.md's example of the module driven from Python (no command line) runs as written: one RL step on the
shipped toy base, its embedded sandbox started and stopped."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_python_example_trains_one_step(monkeypatch):
    text = (REPO / "docs" / "usage.md").read_text()
    section = text[text.index("## From Python, without the command line"):]
    code = re.search(r"^```python\n(.*?)^```", section, re.DOTALL | re.MULTILINE).group(1)
    monkeypatch.chdir(REPO)  # written for the repository root
    scope: dict = {}
    exec(compile(code, "docs/usage.md", "exec"), scope)
    assert scope["trainer"].global_step == 1
