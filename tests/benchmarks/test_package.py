"""The benchmarks as a package: every module imports without side effects and without editing ``sys.path``, and
every command's ``python -m benchmarks.<name> --help`` runs from the repository root.

The ``--help`` runs share one child process (``runpy.run_module``, what ``python -m`` does), so torch and
transformers are imported once.
"""

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__))
COMMANDS = [m for m in MODULES if 'if __name__ == "__main__":' in (REPO / "benchmarks" / f"{m}.py").read_text()]

CHILD = """
import contextlib, io, json, runpy, sys
results = {}
for name in sys.argv[1:]:
    module = "benchmarks." + name
    out, before = io.StringIO(), list(sys.path)
    sys.argv = [module, "--help"]
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = None
        except SystemExit as exit:
            code = exit.code
    results[name] = {"code": code, "usage": out.getvalue().startswith("usage:"), "path_kept": sys.path == before}
print(json.dumps(results))
"""


def test_no_benchmark_edits_sys_path():
    for name in MODULES:
        assert "sys.path" not in (REPO / "benchmarks" / f"{name}.py").read_text(), name


def test_every_module_imports_quietly(capsys):
    import importlib

    for name in MODULES:
        importlib.import_module(f"benchmarks.{name}")
    assert capsys.readouterr().out == ""  # import does no work: nothing runs, nothing prints


@pytest.mark.e2e
def test_every_command_has_help():
    assert {"toy_emergence", "toy_findings", "train_step", "rollout_overhead"} <= set(COMMANDS)
    done = subprocess.run([sys.executable, "-c", CHILD, *COMMANDS], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name in COMMANDS:
        assert results[name] == {"code": 0, "usage": True, "path_kept": True}, (name, results[name])
