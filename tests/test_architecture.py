"""Guards of the house's shape: no import circle, a small top level, small modules.

The import graph is read from the source with `ast`, not by importing: every ``import`` and
``from ... import`` statement counts, wherever it stands (at module level, inside a function,
under ``if TYPE_CHECKING:``), because a circle hidden in a function is still a circle a
reader has to untangle. ``from capture import open_store`` counts as an import of the module
that `capture/__init__.py`'s lazy table (``_LAZY``) names for it, the module it really loads.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = {"capture": ROOT / "capture", "replay": ROOT / "replay", "capture.cli": ROOT / "cli"}
"""Import name -> folder (the repository's cli/ folder is installed as capture.cli)."""

ELSEWHERE: dict[tuple[str, ...], str] = {}
"""Circles another branch is removing: tolerated by name, and only while they still exist
(`test_a_circle_owned_elsewhere_still_exists` fails once it is gone: delete its entry then)."""

MAX_TOP_LEVEL_MODULES = 12
MAX_LINES = 800
"""STYLE.md's hard cap. Modules are split where they hold two concepts, not at a line count."""

REPLAY_FLOORS = (
    ("replay.runtime",),
    ("replay.runtime.pt2", "replay.runtime.ort"),
    ("replay.inputs",),
    ("replay.check",),
    ("replay.artifact",),
    ("replay.onnx",),
    ("replay.pipeline",),
)
"""`replay`'s rooms from the bottom floor up: a module may import its own room, a room on a
lower floor, and a room beside it on its floor never (pt2 and ort each stand alone). The
runtime is what a server imports, so it is the bottom: nothing of the export job under it."""

MAX_REPLAY_TOP_LEVEL_MODULES = 3
MAX_ROOM_MODULES = 11


def _modules() -> dict[str, Path]:
    """Every module of the three packages: dotted name -> file."""
    out: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _lazy_table(path: Path) -> dict[str, str]:
    """A package ``__init__``'s ``_LAZY = {name: module}`` literal (empty when it has none)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "_LAZY":
            table = ast.literal_eval(node.value)
            assert isinstance(table, dict)
            return {str(k): str(v) for k, v in table.items()}
    return {}


def _imported(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The modules of the three packages that the module `name` imports, anywhere in it."""
    is_package = path.name == "__init__.py"
    lazy = {pkg: _lazy_table(modules[pkg]) for pkg in ("capture", "replay")}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    yield full
                elif alias.name in lazy.get(base, {}):
                    yield lazy[base][alias.name]
                else:
                    yield base


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target in _imported(name, path, modules):
            # `import capture.x.y` names a module of ours or one of its parents: keep the
            # longest prefix that is one of our modules.
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != name:
                edges.add(".".join(parts))
        graph[name] = edges
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_reader_sees_function_level_and_type_checking_imports() -> None:
    # The guard is only as good as its reader: edges known to exist only inside a function
    # (ExportOptions.of reads the operator allow-list lazily) and under TYPE_CHECKING must be found.
    graph = _graph()
    assert "replay.runtime.allowed" in graph["replay.inputs.options"]
    assert "capture.store.reader" in graph["capture.analysis.groups"]
    assert "capture.record.recorder" in graph["capture"]  # through the lazy table


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_import_circle_in_capture_replay_cli() -> None:
    graph = _graph()
    circles = [c for c in _circles(graph) if tuple(c) not in ELSEWHERE]
    described = [
        " <-> ".join(c) + ": " + "; ".join(f"{a} -> {b}" for a in c for b in graph[a] if b in c)
        for c in circles
    ]
    assert described == []


@pytest.mark.parametrize("circle", sorted(ELSEWHERE))
def test_a_circle_owned_elsewhere_still_exists(circle: tuple[str, ...]) -> None:
    assert list(circle) in _circles(_graph()), f"gone: remove {circle} from ELSEWHERE"


def _room(module: str) -> str | None:
    """The replay room a module stands in (the longest floor name that prefixes it)."""
    rooms = [r for floor in REPLAY_FLOORS for r in floor]
    found = [r for r in rooms if module == r or module.startswith(r + ".")]
    return max(found, key=len) if found else None


def _floor(room: str) -> int:
    return next(i for i, floor in enumerate(REPLAY_FLOORS) if room in floor)


def test_every_replay_module_stands_in_a_room_or_at_the_top() -> None:
    homeless = [
        m for m in _modules() if m.startswith("replay.") and _room(m) is None and m.count(".") > 1
    ]
    assert homeless == []


def test_no_arrow_runs_up_between_replay_rooms() -> None:
    up = []
    for module, targets in _graph().items():
        room = _room(module)
        if room is None:
            continue  # replay's top level (the package and the loader) may import any room
        for target in targets:
            other = _room(target)
            if other is None:
                if target.startswith("replay"):
                    up.append(f"{module} -> {target} (replay's top level)")
                continue
            if other != room and _floor(other) >= _floor(room):
                up.append(f"{module} -> {target}")
    assert up == []


def test_replay_has_a_small_top_level_and_small_rooms() -> None:
    top = sorted(p.name for p in (ROOT / "replay").glob("*.py"))
    assert len(top) <= MAX_REPLAY_TOP_LEVEL_MODULES, top
    big = {
        str(folder.relative_to(ROOT)): n
        for folder in sorted((ROOT / "replay").rglob("*"))
        if folder.is_dir()
        and (n := len([p for p in folder.glob("*.py") if p.name != "__init__.py"]))
        > MAX_ROOM_MODULES
    }
    assert big == {}


def test_capture_has_at_most_twelve_top_level_modules() -> None:
    top = sorted(p.name for p in (ROOT / "capture").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_module_over_the_hard_cap(package: str) -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted(PACKAGES[package].rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


TWO_SIDES_OF_ONE_CONCEPT: dict[str, frozenset[str]] = {
    "entries": frozenset({"replay.artifact.entries", "replay.onnx.entries"}),
    "manifest": frozenset({"replay.runtime.manifest", "replay.runtime.ort.manifest"}),
    "runner": frozenset({"replay.runtime.runner", "replay.runtime.ort.runner"}),
    "tokens": frozenset({"capture.record.tokens", "replay.inputs.tokens"}),
    "weights": frozenset({"replay.runtime.pt2.weights", "replay.runtime.ort.weights"}),
}
"""Basenames two modules share because they are one concept seen from two sides (the recorder
and the store, the PT2 artifact and the ONNX set); each module's first docstring line says its
side. Any other shared basename is two concepts under one name: rename one of them."""


def _basenames() -> dict[str, set[str]]:
    """Module basename -> the dotted names of the modules (packages' ``__init__`` aside) with it."""
    out: dict[str, set[str]] = {}
    for name, path in _modules().items():
        if path.name not in ("__init__.py", "__main__.py"):
            out.setdefault(path.stem, set()).add(name)
    return out


def test_one_name_per_concept() -> None:
    shared = {base: names for base, names in _basenames().items() if len(names) > 1}
    unexplained = {
        base: sorted(names)
        for base, names in shared.items()
        if TWO_SIDES_OF_ONE_CONCEPT.get(base) != frozenset(names)
    }
    assert not unexplained, (
        f"modules share a basename: {unexplained}; rename one, or list them in "
        "TWO_SIDES_OF_ONE_CONCEPT if they are one concept seen from two sides"
    )
    stale = sorted(set(TWO_SIDES_OF_ONE_CONCEPT) - set(shared))
    assert not stale, f"TWO_SIDES_OF_ONE_CONCEPT lists basenames no longer shared: {stale}"


@pytest.mark.parametrize("base", sorted(TWO_SIDES_OF_ONE_CONCEPT))
def test_each_side_of_a_shared_name_says_its_side(base: str) -> None:
    modules = _modules()
    for name in TWO_SIDES_OF_ONE_CONCEPT[base]:
        first = modules[name].read_text(encoding="utf-8").split("\n", 1)[0]
        assert "side" in first, f"{name}'s first docstring line does not say its side: {first}"


def test_the_basename_check_sees_a_duplicate() -> None:
    assert _basenames()["manifest"] == {"replay.runtime.manifest", "replay.runtime.ort.manifest"}
