"""The import graph of ``harness`` and ``tft``: no circles, and no room imports a room above it.

The graph counts every import a module's source holds (function-local ones and those under
``TYPE_CHECKING`` too); ``from harness import x`` is an import of the package ``harness`` (its
``__init__``) as well as of ``harness.x`` when that is a module.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent

FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", ("harness._core", "tft")),
    ("readings", ("harness._measure",)),
    ("the verdict model", ("harness._verdict",)),
    ("timeline", ("harness._timeline",)),
    ("rules", ("harness._rules",)),
    ("attribution", ("harness._attribution",)),
    ("recorder", ("harness._recorder",)),
    ("report", ("harness._report",)),
    ("results", ("harness._results",)),
    ("history", ("harness._history",)),
    ("front ends", ("harness._frontends", "harness.integrations", "harness.__main__", "tft.train")),
    ("the package's public names", ("harness",)),
]
"""Each floor's folders, lowest first: a folder of ``harness`` is one floor (the recorder, which
joins the floors below it, is the one module of its own). A name covers its submodules unless a
longer name places them (``tft.train`` above ``tft``); ``harness`` alone is the package's
``__init__``."""


def modules() -> dict[str, Path]:
    """Every module of ``harness`` and ``tft``, by dotted name."""
    found = {}
    for package in ("harness", "tft"):
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module and the modules of the graph it imports."""
    found = modules()
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            graph[name] |= {t for t in targets if t in found and t != name}
    return graph


def floor_of(module: str) -> int | None:
    """The floor of ``module``: that of the longest name in :data:`FLOORS` that covers it."""
    best, floor = -1, None
    for level, (_, names) in enumerate(FLOORS):
        for name in names:
            covers = module == name or (name != "harness" and module.startswith(name + "."))
            if covers and len(name) > best:
                best, floor = len(name), level
    return floor


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_folders_of_the_harness_are_its_floors():
    """``ls harness`` shows the floors: each folder is named in :data:`FLOORS`, and the only
    modules beside them are the recorder, the package's names and ``python -m harness``."""
    placed = {name for _, names in FLOORS for name in names}
    here = ROOT / "harness"
    folders = {f"harness.{p.name}" for p in here.iterdir() if (p / "__init__.py").is_file()}
    loose = sorted(p.name for p in here.glob("*.py"))
    assert sorted(folders - placed) == []
    assert loose == ["__init__.py", "__main__.py", "_recorder.py"]


def test_no_two_modules_of_the_harness_share_a_name():
    named: dict[str, list[str]] = {}
    for module, path in modules().items():
        if path.name != "__init__.py" and module.startswith("harness."):
            named.setdefault(module.rpartition(".")[2], []).append(module)
    assert {n: m for n, m in named.items() if len(m) > 1} == {}


def test_a_folder_of_the_harness_names_nothing_of_its_modules():
    """Each name has one import path, the module that defines it: a folder's ``__init__`` holds
    its docstring only (``harness`` itself, the public names' one table, aside)."""

    said = {}
    for init in sorted((ROOT / "harness").glob("*/__init__.py")):
        body = ast.parse(init.read_text()).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        said[init.parent.name] = [type(node).__name__ for node in body]
    assert {folder: nodes for folder, nodes in said.items() if nodes} == {}


def test_every_module_has_a_floor():
    unplaced = sorted(m for m in modules() if floor_of(m) is None)
    assert unplaced == [], f"give these modules a floor in FLOORS: {unplaced}"


def test_the_import_graph_has_no_circles():
    assert circles(import_graph()) == []


def test_no_module_imports_one_on_a_higher_floor():
    upward = [
        f"{module} ({FLOORS[floor_of(module) or 0][0]}) imports {target} "
        f"({FLOORS[floor_of(target) or 0][0]})"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if (floor_of(target) or 0) > (floor_of(module) or 0)
    ]
    assert upward == []


def test_the_workload_imports_the_harness_only_from_its_command():
    graph = import_graph()
    into_harness = sorted(
        m
        for m, targets in graph.items()
        if m.startswith("tft") and m != "tft.train"
        if any(t.split(".")[0] == "harness" for t in targets)
    )
    into_tft = sorted(
        m
        for m, targets in graph.items()
        if m.split(".")[0] == "harness"
        if any(t.split(".")[0] == "tft" for t in targets)
    )
    assert (into_harness, into_tft) == ([], [])


def test_nothing_below_the_public_names_imports_the_package():
    importers = sorted(m for m, targets in import_graph().items() if "harness" in targets)
    assert importers == []


def test_the_typed_names_are_the_lazy_ones():
    """The imports a type checker reads under ``TYPE_CHECKING`` name the module each public
    name is loaded from at run time."""
    tree = ast.parse((ROOT / "harness" / "__init__.py").read_text())
    typed = {
        alias.asname or alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == harness._EXPORTS


def test_importing_the_recorder_loads_nothing_above_it():
    code = (
        "import sys, harness._recorder; "
        "print(' '.join(m for m in sys.modules if m.split('.')[0] == 'harness'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded = done.stdout.split()
    recorder = floor_of("harness._recorder") or 0
    above = sorted(m for m in loaded if m != "harness" and (floor_of(m) or 0) > recorder)
    assert "harness._recorder" in loaded and above == []
    judging = (
        "harness._rules",
        "harness._attribution",
        "harness._verdict.model",
        "harness._verdict.options",
    )
    assert [m for m in loaded if m.startswith(judging)] == []
    folders = {m for m in loaded if (ROOT / m.replace(".", "/") / "__init__.py").is_file()}
    # 20, the host's places (host, python_heap), the patches' owner and the board's slots
    assert len(set(loaded) - folders) <= 24, loaded


USER_DOCS = ("README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))))
"""What a user reads for the API; ``docs/architecture.md`` describes the internals."""
PUBLIC_PATHS = ("harness.integrations.lightning",)


def test_the_docs_promise_only_public_names():
    """A dotted name under ``harness`` in the user's docs is one of ``harness.__all__`` or the
    Lightning integration: every other module's name is internal (``harness._rules``)."""
    promised = set()
    for doc in USER_DOCS:
        if doc == "docs/architecture.md":
            continue
        text = (ROOT / doc).read_text()
        promised |= {(doc, m) for m in re.findall(r"\bharness(?:\.\w+)+", text)}
        for names in re.findall(r"from harness import ([\w, ]+)", text):
            promised |= {(doc, f"harness.{n.strip()}") for n in names.split(",")}
    public = {f"harness.{name}" for name in harness.__all__}
    wrong = sorted(
        (doc, name)
        for doc, name in promised
        if name not in public and not name.startswith(PUBLIC_PATHS)
    )
    assert wrong == []


def test_every_module_but_the_public_ones_is_internal_by_name():
    public = {"harness", "harness.__main__", "harness.integrations"}
    exposed = sorted(
        m
        for m in modules()
        if m.startswith("harness.")
        and m not in public
        and not m.startswith("harness.integrations.")
        and not m.split(".")[1].startswith("_")
    )
    assert exposed == []
