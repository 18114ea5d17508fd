"""A per-trajectory session: variables persist across tool calls by replaying earlier successful cells.

Each call sends one program: the earlier cells that ran without error, with their standard output suppressed,
followed by the new cell. Nothing is kept on the server, so any server (ours or SandboxFusion) and any worker can
run any call, and a failed call leaves the session as it was. The cost is re-running the earlier cells, which for
math snippets is milliseconds. Line numbers in the new cell's errors are shifted back so they match what the model
wrote. Standard error of replayed cells is not suppressed, so an error raised while replaying stays visible.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from sandbox.client import SandboxClient
from sandbox.result import ExecResult

# Uses only `sys` (allowed by the default static check) and names unlikely to clash with the model's own.
_MUTE = (
    "import sys as _zt_sys\n"
    "class _ZtMute:\n"
    "    def write(self, text): return len(text)\n"
    "    def flush(self): pass\n"
    "_zt_stdout, _zt_sys.stdout = _zt_sys.stdout, _ZtMute()\n"
)
_UNMUTE = "_zt_sys.stdout = _zt_stdout\ndel _zt_sys, _ZtMute, _zt_stdout\n"
_LINE_REF = re.compile(r'(File "([^"]+)", line )(\d+)')


class CodeSession:
    """Runs cells of one trajectory so that later cells see the variables of earlier successful ones.

    Args:
        client: The client that runs the programs.
    """

    def __init__(self, client: SandboxClient) -> None:
        self.client = client
        self.cells: list[str] = []

    async def run(self, code: str, **kw: Any) -> ExecResult:
        """Run ``code`` after replaying the earlier successful cells; ``kw`` as for :meth:`SandboxClient.run`."""
        program, offset = self.program(code)
        result = await self.client.run(program, **kw)
        if result.ok:
            self.cells.append(code)
        if offset:
            result = replace(result, stderr=_shift_lines(result.stderr, offset))
        return result

    def program(self, code: str) -> tuple[str, int]:
        """(the program sent for ``code``, how many lines precede ``code`` in it)."""
        if not self.cells:
            return code, 0
        replay = "".join(cell if cell.endswith("\n") else cell + "\n" for cell in self.cells)
        prefix = _MUTE + replay + _UNMUTE
        return prefix + code, prefix.count("\n")

    def reset(self) -> None:
        """Forget every cell (a new trajectory)."""
        self.cells.clear()


def _shift_lines(stderr: str, offset: int) -> str:
    """Subtract ``offset`` from line numbers of the program's own file (the first file a traceback names)."""
    files = [m.group(2) for m in _LINE_REF.finditer(stderr)]
    if not files:
        return stderr
    program_file = "<snippet>" if "<snippet>" in files else files[0]

    def shift(match: re.Match[str]) -> str:
        line = int(match.group(3))
        if match.group(2) != program_file or line <= offset:
            return match.group(0)
        return f"{match.group(1)}{line - offset}"

    return _LINE_REF.sub(shift, stderr)
