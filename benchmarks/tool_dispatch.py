"""The plug-in tools' own cost against a direct sandbox call, for ``benchmarks.rollout_overhead``.

``DirectSandbox`` is the tool loop's path before the tools were plug-ins: the code of a block straight to
``sandbox.run``, the result formatted and cut by ``sandbox.format_for_model``. ``rollout_overhead`` runs the loop
with it beside the plug-in path the trainer runs (the toolbox built and started once, as a source or engine host
keeps it), on the same engine and seeds; ``dispatch_cost`` times both paths per call over a sandbox that answers at
once, which the load of a shared machine barely touches, and the toolbox's build and start (once per source).
"""

from __future__ import annotations

import asyncio
import time

from zerotir.config import ToolConfig
from zerotir.rollout.tool_block import status_of
from zerotir.tools.base import Observation
from zerotir.tools.formats import Fences
from zerotir.tools.registry import Toolbox, Used


class DirectSandbox(Toolbox):
    """The baseline of the plug-in tools: a call's code straight to ``sandbox.run``, its result formatted as the
    loop did before the tools were plug-ins (``sandbox.format_for_model`` at ``max_output_chars``): the same
    observation as the ``python`` tool's, without the registry, the schema check, the tool object and the cap."""

    def __init__(self, sandbox, tool: ToolConfig):
        super().__init__([], tool.max_output_chars)
        self.sandbox, self.tool = sandbox, tool
        self.start()

    @property
    def names(self) -> list[str]:
        return ["python"]  # what the fences format checks

    async def run(self, call) -> Used:
        start = time.perf_counter()
        from sandbox.result import format_for_model

        result = await self.sandbox.run(call.arguments["code"], run_timeout=self.tool.run_timeout)
        return Used("python", Observation(format_for_model(result, self.tool.max_output_chars), status_of(result)),
                    time.perf_counter() - start)


def dispatch_cost(calls: int = 2000) -> dict[str, float]:
    """Seconds per call of the plug-in path (parse, registry, schema check, the python tool, the cap) and of the
    direct call, over an in-process sandbox that answers at once, and of ``Toolbox.build`` + ``start`` (once per
    source and per engine host): the tools' own cost, free of the engine and of the machine's load."""
    from sandbox.result import ExecResult, ExecStatus

    class Instant:
        async def run(self, code, *, run_timeout=None):
            return ExecResult(ExecStatus.OK, "42\n", "", 0.0)

    tool, sandbox = ToolConfig(max_output_chars=1024), Instant()
    fmt = Fences(tool)

    async def per_call(box) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            await box.run(fmt.parse("print(6*7)\n"))
        return (time.perf_counter() - start) / calls

    start = time.perf_counter()
    for _ in range(100):
        started(tool, sandbox).close()
    build = (time.perf_counter() - start) / 100
    box = started(tool, sandbox)
    try:
        return {"plug-in": asyncio.run(per_call(box)), "direct": asyncio.run(per_call(DirectSandbox(sandbox, tool))),
                "build": build}
    finally:
        box.close()


def started(tool: ToolConfig, sandbox=None) -> Toolbox:
    """The plug-in toolbox as a source or engine host keeps it: built and started once (``sandbox``: a client handed
    to the python tool; None: it reaches ``model.tool.sandbox``)."""
    box = Toolbox.build(tool, sandbox)
    box.start()
    return box
