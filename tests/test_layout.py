"""The layout that ``docs/architecture.md`` states, enforced, so the doc and the code cannot drift apart.

It reads the doc's table "Packages and what each may import" and its "File size" section, and walks every ``.py``
under ``zerotir/``, ``callbacks/`` and ``sandbox/`` with ``ast`` (nothing of the project is imported). Every import
counts: at the top, inside a function (a lazy heavy import is still a dependency) and under ``if TYPE_CHECKING:``.
Checked: each module has a row, each name of the table exists, each "holds" cell names exactly what its row holds
(a package's modules, or what a row's modules define) and nothing else, each import follows its row, no cycle
between rows or modules, no file at the limit or over it but those listed, none above its ceiling. The same
checker runs on a small synthetic tree in ``tests/test_layout_checker.py``, so each rule is shown to fail.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = "docs/architecture.md"
ROOTS = ("zerotir", "callbacks", "sandbox")
IMPORT_HEADING = "## Packages and what each may import"
SIZE_HEADING = "## File size"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_NAMES_ONLY = re.compile(r"`[^`]+`(, `[^`]+`)*")  # a cell of backticked names, comma-separated, and nothing else


@dataclass
class Row:
    """One row of the import table: the modules it covers, what they hold and what they may import."""

    names: tuple[str, ...]
    holds: str
    allowed: tuple[str, ...]
    everything: bool
    line: int

    @property
    def label(self) -> str:
        return ", ".join(self.names)


@dataclass
class Tree:
    """The project's modules: dotted name -> file, the imports of each, and the names each defines at top level."""

    root: Path
    files: dict[str, Path] = field(default_factory=dict)
    imports: dict[str, list[tuple[int, str, str]]] = field(default_factory=dict)  # (line, as written, target)
    defined: dict[str, set[str]] = field(default_factory=dict)

    def rel(self, module: str) -> str:
        return self.files[module].relative_to(self.root).as_posix()


def _absolute(name: str) -> str:
    """A table name: ``config`` means ``zerotir.config``; ``callbacks/``, ``sandbox`` and ``zerotir.x`` stay."""
    name = name.strip().rstrip("/")
    return name if name.split(".")[0] in ROOTS else f"zerotir.{name}"


def _table(doc: str, heading: str) -> list[tuple[int, list[str]]]:
    """The first Markdown table after ``heading``: (doc line, cells) per body row."""
    lines = doc.splitlines()
    start = lines.index(heading)
    rows: list[tuple[int, list[str]]] = []
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not set(cells[0]) <= set("-: "):
            rows.append((number, cells))
    return rows[1:]  # the first one is the header


def parse_rows(doc: str) -> list[Row]:
    """The import table. A "may import" cell is ``nothing``, ``everything``, or backticked names and nothing else
    (why a room imports a name is said in the prose below the table)."""
    rows = []
    for line, cells in _table(doc, IMPORT_HEADING):
        assert len(cells) == 3, f"{DOC}:{line}: an import-table row has 3 cells (package | holds | may import)"
        names = tuple(_absolute(n) for n in re.findall(r"`([^`]+)`", cells[0]))
        cell = cells[2]
        assert cell in ("nothing", "everything") or _NAMES_ONLY.fullmatch(cell), (
            f"{DOC}:{line}: the may-import cell of `{', '.join(names)}` is `nothing`, `everything` or backticked "
            f"names, comma-separated, with the reasons in the prose below the table: {cell!r}")
        allowed = tuple(_absolute(n) for n in re.findall(r"`([^`]+)`", cell))
        for name in names + allowed:
            assert _NAME.fullmatch(name), f"{DOC}:{line}: `{name}` is not a module name"
        rows.append(Row(names, cells[1], allowed, cell == "everything", line))
    return rows


def parse_sizes(doc: str) -> tuple[int, dict[str, int]]:
    """The line limit (the section's ``**N lines**``) and the listed oversize files with their ceilings."""
    section = doc[doc.index(SIZE_HEADING):]
    limit = int(re.search(r"\*\*(\d+) lines\*\*", section).group(1))
    ceilings = {}
    for line, cells in _table(doc, SIZE_HEADING):
        files = re.findall(r"`([^`]+)`", cells[0])
        assert len(files) == 1 and cells[1].isdigit(), f"{DOC}:{line}: a size row is | `file` | lines | why |"
        ceilings[files[0]] = int(cells[1])
    return limit, ceilings


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST, module: str, is_package: bool, known: set[str]) -> list[tuple[str, str]]:
    """(as written, the module it names) for one import statement; the target is the longest known module that
    the imported name starts with, so ``from zerotir import models`` names ``zerotir.models``."""
    def longest(name: str) -> str:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in known:
                return ".".join(parts[:end])
        return name

    if isinstance(node, ast.Import):
        return [(f"import {a.name}", longest(a.name)) for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        kept = package[: len(package) - node.level + 1]
        base = ".".join(kept + ([node.module] if node.module else []))
    return [(f"from {'.' * node.level}{node.module or ''} import {a.name}", longest(f"{base}.{a.name}"))
            for a in node.names]


def _defined(tree: ast.Module) -> set[str]:
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def scan(root: Path) -> Tree:
    """Every module under the roots, with its project imports (every one in the file) and top-level names."""
    tree = Tree(root)
    for top in ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            tree.files[_module_name(path, root)] = path
    known = set(tree.files)
    for module, path in tree.files.items():
        parsed = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        tree.defined[module] = _defined(parsed)
        found = tree.imports[module] = []
        for node in ast.walk(parsed):
            for written, target in _targets(node, module, path.name == "__init__.py", known):
                if target.split(".")[0] in ROOTS:
                    found.append((node.lineno, written, target))
        found.sort()
    return tree


def row_of(module: str, rows: list[Row]) -> Row | None:
    """The row with the longest name covering ``module``: the module itself, or a package above it. The row
    ``zerotir`` covers only ``zerotir/__init__.py``, so a new top-level module needs a row of its own."""
    best, best_len = None, -1
    for row in rows:
        for name in row.names:
            covers = module == name or (module.startswith(name + ".") and name != "zerotir")
            if covers and len(name) > best_len:
                best, best_len = row, len(name)
    return best


def _under(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def row_modules(tree: Tree, row: Row, rows: list[Row]) -> set[str] | None:
    """The modules and subpackages directly under the packages ``row`` names that have no row of their own (the
    bare ``zerotir`` row names no package: it covers only its ``__init__``); None for a row of modules only."""
    packages = [name for name in row.names if name != "zerotir" and name in tree.files
                and tree.files[name].name == "__init__.py"]
    if not packages:
        return None
    return {m.split(".")[name.count(".") + 1] for name in packages for m in tree.files
            if m.startswith(name + ".") and row_of(m, rows) is row}


def check_holds(tree: Tree, row: Row, rows: list[Row]) -> list[str]:
    """The "holds" cell is backticked names only; a row of packages names exactly their modules (``row_modules``),
    a row of modules names what is defined at the top of them."""
    where = f"{DOC}:{row.line}: the holds cell of `{row.label}`"
    if not _NAMES_ONLY.fullmatch(row.holds):
        return [f"{where} is backticked module names, comma-separated; say what they hold in the prose below the "
                f"table: {row.holds!r}"]
    words = re.findall(r"`([^`]+)`", row.holds)
    modules = row_modules(tree, row, rows)
    if modules is not None:
        return [f"{where} names `{word}`, which is no module directly under it" for word in words
                if word not in modules] + [f"{where} does not name its module `{child}`"
                                           for child in sorted(modules - set(words))]
    inside = [m for m in tree.files if row_of(m, rows) is row]
    defined = {d for m in inside for d in tree.defined[m]}
    return [f"{where} names `{word}`, which is defined at the top of none of its modules" for word in words
            if word not in defined]


def check_rows(tree: Tree, rows: list[Row]) -> list[str]:
    """Each module has a row; each name in the table exists; each "holds" cell names what its row holds
    (``check_holds``)."""
    problems = [f"{tree.rel(m)}: no row of the import table in {DOC} covers `{m}`: add one"
                for m in tree.files if row_of(m, rows) is None]
    for row in rows:
        for name in row.names + row.allowed:
            if name not in tree.files:
                problems.append(f"{DOC}:{row.line}: `{name}` (row `{row.label}`) is no module or package")
        problems += check_holds(tree, row, rows)
    return problems


def check_imports(tree: Tree, rows: list[Row]) -> list[str]:
    """Each import of a project module follows the row of the importing file; and nothing of ``zerotir/`` imports
    ``callbacks/`` whatever its row (the layers run one way: callbacks observe the package, the CLI names a callback
    by its ``class_path``)."""
    problems = []
    for module, found in tree.imports.items():
        if module.split(".")[0] == "zerotir":
            problems += [f"{tree.rel(module)}:{line}: `{written}` imports `{target}`: nothing of zerotir/ imports "
                         f"callbacks/ ({DOC}); name a callback by its class_path in the CLI"
                         for line, written, target in found if target.split(".")[0] == "callbacks"]
        row = row_of(module, rows)
        if row is None or row.everything:
            continue
        for line, written, target in found:
            if row_of(target, rows) is row or any(_under(target, name) for name in row.allowed):
                continue
            allowed = ", ".join(f"`{name}`" for name in row.allowed) or "nothing of the project"
            problems.append(f"{tree.rel(module)}:{line}: `{written}` imports `{target}`, which row `{row.label}` "
                            f"({DOC}:{row.line}) forbids: it may import {allowed}")
    return problems


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def check_cycles(tree: Tree, rows: list[Row]) -> list[str]:
    """No cycle between the rows of the table, nor between modules; a cycle is named with one import per edge."""
    problems = []
    for kind, key in (("rows", lambda m: row_of(m, rows).label if row_of(m, rows) else m), ("modules", str)):
        graph: dict[str, set[str]] = {}
        where: dict[tuple[str, str], str] = {}
        for module, found in tree.imports.items():
            for line, _, target in found:
                a, b = key(module), key(target)
                if a != b and target in tree.files:
                    graph.setdefault(a, set()).add(b)
                    where.setdefault((a, b), f"{tree.rel(module)}:{line} imports {target}")
        cycle = find_cycle(graph)
        if cycle:
            edges = "; ".join(where[(a, b)] for a, b in zip(cycle, cycle[1:]))
            problems.append(f"import cycle between {kind}: {' -> '.join(cycle)} ({edges})")
    return problems


def check_sizes(tree: Tree, limit: int, ceilings: dict[str, int]) -> list[str]:
    """No file at ``limit`` lines or over but those listed, each at most its listed size; a listed file back under
    the limit leaves the list."""
    problems = []
    sizes = {tree.rel(m): len(p.read_text(encoding="utf-8").splitlines()) for m, p in tree.files.items()}
    for rel, size in sorted(sizes.items()):
        if size >= limit and rel not in ceilings:
            problems.append(f"{rel}: {size} lines, at or over the limit of {limit} ({DOC}, File size): split it")
        elif rel in ceilings and size > ceilings[rel]:
            problems.append(f"{rel}: {size} lines, above its ceiling of {ceilings[rel]} in {DOC}: the listed "
                            f"oversize files may only shrink")
    for rel in sorted(ceilings):
        if rel not in sizes:
            problems.append(f"{DOC}: File size lists `{rel}`, which does not exist")
        elif sizes[rel] < limit:
            problems.append(f"{DOC}: `{rel}` has {sizes[rel]} lines, within the limit: remove it from the list")
    return problems


MAX_TOP_LEVEL = 8  # modules directly under zerotir/ (``__init__.py`` aside): the rest live in packages of one idea
APART = (("zerotir.rewards", "zerotir.rollout"),)  # (package, what it never imports): scoring knows no engine
# A reference to an issue of this project: "issue 12", "Issue #12", "(#12)". History belongs to git.
ISSUE_REF = re.compile(r"\bissues?\s*#?\d+|\(#\d+\)|(?<![\w/&])#\d+\b", re.IGNORECASE)


def check_apart(tree: Tree) -> list[str]:
    """Nothing of a package of ``APART`` imports the package named beside it."""
    return [f"{tree.rel(module)}:{line}: `{written}` imports `{target}`: nothing of `{package}` imports "
            f"`{banned}`" for package, banned in APART for module, found in tree.imports.items()
            if _under(module, package) for line, written, target in found if _under(target, banned)]


def check_top_level(root: Path, most: int = MAX_TOP_LEVEL) -> list[str]:
    """At most ``most`` modules directly under ``zerotir/``."""
    names = sorted(p.name for p in (root / "zerotir").glob("*.py") if p.name != "__init__.py")
    if len(names) <= most:
        return []
    return [f"zerotir/: {len(names)} top-level modules ({', '.join(names)}), at most {most}: move one into the "
            "package of its idea"]


ISSUE_FREE = ("zerotir", "callbacks", "sandbox", "benchmarks", "scripts")  # the source a reader opens


def check_issue_numbers(root: Path) -> list[str]:
    """No issue number in the source (``ISSUE_FREE``: Python and shell): a docstring says what and why; history
    belongs to git."""
    problems = []
    paths = [p for top in ISSUE_FREE for pattern in ("*.py", "*.sh") for p in (root / top).rglob(pattern)]
    for path in sorted(paths):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if found := ISSUE_REF.search(line):
                problems.append(f"{path.relative_to(root).as_posix()}:{number}: `{found.group(0)}` names an issue: "
                                "say what and why instead")
    return problems


# Bases a user subclasses to plug in (the reward, a tool, a call format): their methods raise NotImplementedError
# until the subclass implements them, which is the point of such a base, not a protocol a class claims.
USER_BASES = {"Reward", "Tool", "CallFormat"}


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(isinstance(b, ast.Name) and b.id == "Protocol" or isinstance(b, ast.Attribute) and b.attr == "Protocol"
               for b in node.bases)


def _stub(method: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Raise | None:
    """The statement that makes ``method`` a refusal: a ``raise NotImplementedError`` anywhere in it, or a body
    (its docstring aside) of one unconditional ``raise``; None for a method that does its work."""
    for node in ast.walk(method):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                return node
    body = [s for s in method.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return body[0] if len(body) == 1 and isinstance(body[0], ast.Raise) else None


def check_protocol_stubs(root: Path) -> list[str]:
    """No class of ``zerotir/`` refuses a method named after a method of one of its Protocols: a class implements the
    halves it supports (``rollout.engine.GenerationEngine``, ``EngineWeights``) and leaves out the rest, rather than
    claiming a protocol and raising in the methods it cannot do. Bases meant for user subclassing (``USER_BASES``)
    are left out."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted((root / "zerotir").rglob("*.py"))}
    names = {item.name for tree in trees.values() for node in ast.walk(tree)
             if isinstance(node, ast.ClassDef) and _is_protocol(node) for item in node.body
             if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    problems = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef) or _is_protocol(node) or node.name in USER_BASES:
                continue
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in names and \
                        (stub := _stub(item)) is not None:
                    problems.append(f"{path.relative_to(root).as_posix()}:{stub.lineno}: {node.name}.{item.name} "
                                    "refuses a protocol method: implement it, or drop it and claim only the "
                                    "protocol the class supports")
    return problems


def check_all(root: Path) -> list[str]:
    doc = (root / DOC).read_text(encoding="utf-8")
    rows, (limit, ceilings), tree = parse_rows(doc), parse_sizes(doc), scan(root)
    return check_rows(tree, rows) + check_imports(tree, rows) + check_cycles(tree, rows) + \
        check_sizes(tree, limit, ceilings) + check_apart(tree) + check_top_level(root) + check_issue_numbers(root) + \
        check_protocol_stubs(root)


# The tests on the repository.

@pytest.fixture(scope="module")
def repo() -> tuple[Tree, str]:
    return scan(REPO), (REPO / DOC).read_text(encoding="utf-8")


RULES = {
    "rows": lambda tree, doc: check_rows(tree, parse_rows(doc)),
    "imports": lambda tree, doc: check_imports(tree, parse_rows(doc)),
    "cycles": lambda tree, doc: check_cycles(tree, parse_rows(doc)),
    "sizes": lambda tree, doc: check_sizes(tree, *parse_sizes(doc)),
    "apart": lambda tree, doc: check_apart(tree),
    "top_level": lambda tree, doc: check_top_level(tree.root),
    "issue_numbers": lambda tree, doc: check_issue_numbers(tree.root),
    "protocol_stubs": lambda tree, doc: check_protocol_stubs(tree.root),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_repository_follows_its_layout(repo, rule):
    """Each module has a row and the table names what exists; imports follow the rows; no cycle; file sizes."""
    problems = RULES[rule](*repo)
    assert not problems, "\n".join(problems)


MAX_MODULE_PARAMETERS = 11  # settings belong in a group of zerotir.config, not in the signature


def module_parameters(root: Path) -> list[str]:
    """The parameters of ``ZeroTIRModule.__init__`` (``self`` left out), read with ``ast``."""
    tree = ast.parse((root / "zerotir" / "module.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ZeroTIRModule")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return [a.arg for a in init.args.args[1:] + init.args.kwonlyargs]


def doc_module_parameters(doc: str) -> list[str]:
    """The parameters the doc's flow names: ``ZeroTIRModule(a, b, ...)``, over as many lines as it takes."""
    listed = re.search(r"ZeroTIRModule\(([^)]*)\)", doc).group(1)
    return [name.strip() for name in listed.split(",")]


def test_the_module_takes_the_parameters_the_doc_names_and_at_most_eleven():
    names = module_parameters(REPO)
    assert names == doc_module_parameters((REPO / DOC).read_text(encoding="utf-8")), f"{DOC}: ZeroTIRModule({names})"
    assert len(names) <= MAX_MODULE_PARAMETERS, f"ZeroTIRModule takes {len(names)} parameters: group them"


# The checker on a small synthetic tree: each rule fails when broken.
