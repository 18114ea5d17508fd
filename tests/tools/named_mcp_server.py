"""An MCP server whose tool names are not the model's (as ``mcp-server-calculator`` names its tool ``calculate``),
for tests/tools/test_mcp_naming.py: ``calculate``, ``lookup`` and ``echo``.

Every call appends the tool's name as a line to the calls file (what the server really received, counted on its
side) and writes a log line to stderr, as many servers do per request. ``python named_mcp_server.py <calls file>``
serves over stdio; a test serves ``build(<calls file>).streamable_http_app()`` over HTTP itself.
"""

import ast
import operator
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

STDERR_LINE = "named-server log: handled {tool}"  # the line a call writes to the server's stderr

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("only integers with + - *")


def build(calls_file: str) -> MCPServer:
    """The server; each call recorded in ``calls_file`` and logged to stderr."""
    app = MCPServer("named")

    def record(tool: str) -> None:
        with Path(calls_file).open("a") as calls:
            calls.write(tool + "\n")
        print(STDERR_LINE.format(tool=tool), file=sys.stderr, flush=True)

    @app.tool(name="calculate")
    def calculate(expression: str) -> str:
        """Evaluate an integer expression with + - *."""
        record("calculate")
        return str(_evaluate(ast.parse(expression, mode="eval").body))

    @app.tool(name="lookup")
    def lookup(key: str) -> str:
        """The value of a key."""
        record("lookup")
        return {"pi": "3.14159"}.get(key, "unknown")

    @app.tool(name="echo")
    def echo(text: str) -> str:
        """The text back."""
        record("echo")
        return text

    return app


if __name__ == "__main__":
    build(sys.argv[1]).run("stdio")
