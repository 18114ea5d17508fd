"""The static analysis layer: an import allowlist and a list of refused calls, checked on the syntax tree.

This is a courtesy to the model, not the security boundary. It turns the common mistakes (``import os``,
``subprocess.run``, ``input()``) into one clear line the model can read and learn from, instead of a confusing
runtime failure. It is trivially bypassed by code that wants to (``getattr(__builtins__, "ev" + "al")``); the kernel
layers in :mod:`sandbox.isolation` and the limits in :mod:`sandbox.child` are what contain such code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

SNIPPET_FILENAME = "<snippet>"
#: Refusals shown to the model (the rest are counted): a 1 MB ``import a,a,a,...`` must not answer with 176 MiB.
SHOWN_REFUSALS = 5
#: Refusals a check keeps in memory; beyond it they are only counted.
_KEPT_REFUSALS = 100


@dataclass(frozen=True)
class Refusal:
    """One reason the static check refuses a snippet.

    Attributes:
        line: 1-based line of the offending statement.
        kind: ``"ImportError"`` for a disallowed import, ``"PermissionError"`` for a refused call.
        message: The sentence shown to the model.
    """

    line: int
    kind: str
    message: str

    def format(self) -> str:
        """Render like the last two lines of a Python traceback, so models read it as they read any error."""
        return f'  File "{SNIPPET_FILENAME}", line {self.line}\n{self.kind}: {self.message}'


class Policy:
    """Checks a parsed snippet against an import allowlist and a set of refused dotted call names.

    Args:
        allow_imports: Top-level module names a snippet may import; ``"*"`` in the list allows every module.
        refused_calls: Dotted names (``"eval"``, ``"os.system"``) whose call is refused, through any import alias.
    """

    def __init__(self, allow_imports: Iterable[str], refused_calls: Iterable[str]) -> None:
        self.allow_all = "*" in allow_imports
        self.allowed = frozenset(name for name in allow_imports if name != "*")
        self.refused = frozenset(refused_calls)

    def check(self, tree: ast.AST) -> Refusals:
        """Return the refusals in ``tree`` (empty when the snippet may run), in source order.

        The walk is iterative (an explicit stack, children in source order): a recursive visitor raises
        RecursionError on a 600-term sum that Python itself compiles and runs.
        """
        scan = _Scan(self)
        stack: list[ast.AST] = [tree]
        while stack:
            node = stack.pop()
            if scan.see(node):
                stack.extend(reversed(list(ast.iter_child_nodes(node))))
        return Refusals(sorted(scan.kept, key=lambda r: r.line), scan.count)

    def check_source(self, code: str) -> Refusals:
        """Parse ``code`` and check it; a SyntaxError propagates (the caller reports it as Python would)."""
        return self.check(ast.parse(code, filename=SNIPPET_FILENAME))

    def report(self, refusals: Refusals) -> str:
        """What the model reads: the first :data:`SHOWN_REFUSALS` refusals, a count of the rest, and the list of
        allowed modules once (after the first refused import)."""
        parts = []
        listed = self.allow_all
        for refusal in refusals[:SHOWN_REFUSALS]:
            text = refusal.format()
            if refusal.kind == "ImportError" and not listed:
                text += f" Allowed modules: {', '.join(sorted(self.allowed))}"
                listed = True
            parts.append(text)
        hidden = refusals.total - min(SHOWN_REFUSALS, len(refusals))
        if hidden:
            parts.append(f"... and {hidden} more refusals ({refusals.total} in all)")
        return "\n".join(parts) + "\n"

    def import_refusal(self, module: str, line: int) -> Refusal | None:
        """The refusal for importing ``module`` (dotted), or None when it is allowed."""
        top = module.split(".")[0]
        if self.allow_all or top in self.allowed:
            return None
        return Refusal(line, "ImportError", f"import of module '{top}' is not allowed in this sandbox.")


class Refusals(list):
    """The refusals of one check, in source order: the first ones found (at most ``_KEPT_REFUSALS``), with
    ``total`` counting them all."""

    def __init__(self, kept: Iterable[Refusal], total: int) -> None:
        super().__init__(kept)
        self.total = total


class _Scan:
    """Collects refusals node by node; tracks import aliases so ``import os as o; o.system()`` resolves to
    ``os.system``."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.aliases: dict[str, str] = {}
        self.kept: list[Refusal] = []
        self.count = 0

    def see(self, node: ast.AST) -> bool:
        """Check one node; True when its children still need a look."""
        if isinstance(node, ast.Import):
            self.visit_Import(node)
        elif isinstance(node, ast.ImportFrom):
            self.visit_ImportFrom(node)
        elif isinstance(node, ast.Call):
            self.visit_Call(node)
        return not isinstance(node, (ast.Import, ast.ImportFrom))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._refuse(self.policy.import_refusal(alias.name, node.lineno))
            # `import a.b` binds `a`; `import a.b as c` binds `c` to `a.b`.
            bound = alias.asname or alias.name.split(".")[0]
            self.aliases[bound] = alias.name if alias.asname else alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self._refuse(Refusal(node.lineno, "ImportError",
                                 "relative imports are not available: a snippet is not part of a package"))
            return
        module = node.module or ""
        self._refuse(self.policy.import_refusal(module, node.lineno))
        for alias in node.names:
            if alias.name != "*":
                self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    def visit_Call(self, node: ast.Call) -> None:
        name = self._dotted(node.func)
        if name is not None:
            resolved = self._resolve(name)
            if resolved in self.policy.refused or name in self.policy.refused:
                shown = resolved if resolved in self.policy.refused else name
                self._refuse(Refusal(node.lineno, "PermissionError",
                                     f"calling {shown}() is not allowed in this sandbox" + _CALL_HINTS.get(shown, "")))

    def _refuse(self, refusal: Refusal | None) -> None:
        if refusal is not None:
            self.count += 1
            if len(self.kept) < _KEPT_REFUSALS:
                self.kept.append(refusal)

    def _resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        target = self.aliases.get(head)
        if target is None:
            return dotted
        return f"{target}.{rest}" if rest else target

    @staticmethod
    def _dotted(node: ast.AST) -> str | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(node.id)
        return ".".join(reversed(parts))


_CALL_HINTS = {
    "input": " (there is no stdin: put the values in the code)",
    "eval": " (write the expression directly, or use sympy.sympify for math strings)",
    "exec": " (write the code directly)",
}
