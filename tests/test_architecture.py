"""Architecture rules that keep the layers visible: the pure core does no I/O, imports point down the
floors of the house, exceptions live in one errors module per room, and the layout trap."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PURE = [
    "agentrun.worker.core.records",
    "agentrun.worker.core.replay",
    "agentrun.worker.core.guard",
    "agentrun.worker.core.pricing",
    "agentrun.worker.core.types",
    "agentrun.worker.core.errors",
]
IO = ["psycopg", "psycopg_pool", "anthropic", "httpx", "aiohttp", "kopf", "kubernetes", "fastapi", "uvicorn"]


def test_pure_core_imports_no_io_library() -> None:
    code = (
        "import sys, json\n"
        + "".join(f"import {m}\n" for m in PURE)
        + "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    loaded = set(json.loads(out.stdout))
    assert not {m for m in loaded if m.split(".")[0] in IO}, "the pure core pulled in an I/O library"
    assert not {"agentrun.worker.store", "agentrun.worker.runtime.engine"} & loaded


def test_operator_folder_does_not_shadow_the_standard_library() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()
    out = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"], capture_output=True, text=True,
        check=True, cwd=ROOT,
    )
    assert "/lib/python3" in out.stdout and not out.stdout.startswith(str(ROOT))


# -- the rooms and the way imports point ----------------------------------------------------------------
#
# A room is a folder of worker/ (or one of its top-level modules), and operator/ as a whole. Each may
# import itself and the rooms listed here, nothing else of ours; imports inside functions and under
# TYPE_CHECKING count too, since they are the same dependency paid later. From the top:
#   cli → demo → serve → api, operator → runtime → tools, llm, obs → store → settings → core
# Rooms on one floor do not import each other: the API and the operator are two front doors to the same
# runtime; tools, model adapters and observability are three independent adapters (obs reads what it
# measures through protocols, as the engine's `Observer` does). `settings` is configuration: read once
# from the environment at start and passed down, so every layer may name its type, and it imports
# nothing of ours but the core. `testing` (local model servers, scripted clients) stands apart: it
# imports only the core, and only the demo and `agentrun dev` (both in demo/) import it, never the
# worker itself. `agentrun.worker` is the tool authors' door (`from agentrun.worker import tool,
# ToolContext`): it imports the tools, and nothing of ours imports it.
FLOORS: list[list[str]] = [
    ["cli"],
    ["demo"],
    ["serve"],
    ["api", "operator"],
    ["runtime"],
    ["tools", "llm", "obs"],
    ["store"],
    ["settings"],
    ["core"],
]


def _below(room: str) -> set[str]:
    floor = next(i for i, rooms in enumerate(FLOORS) if room in rooms)
    return {r for rooms in FLOORS[floor + 1:] for r in rooms}


MAY_IMPORT: dict[str, set[str]] = {room: _below(room) for rooms in FLOORS for room in rooms}
MAY_IMPORT["demo"] |= {"testing"}
MAY_IMPORT["testing"] = {"core"}
MAY_IMPORT["agentrun.worker"] = {"tools"}

# Imports that break the table today and are being moved (issue 25). Each must still be there: once it
# is gone, its entry goes too, so this list never hides a new one.
PENDING: dict[tuple[str, str], str] = {}

MAX_TOP_LEVEL_MODULES = 8
PACKAGES = {"worker": "agentrun.worker", "operator": "agentrun.operator"}


def _modules() -> dict[str, Path]:
    """Every module of ours by its dotted name."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def room_of(module: str) -> str:
    """`agentrun.worker.store.runs` -> `store`; `agentrun.worker.settings` -> `settings`."""
    parts = module.split(".")
    if parts[:2] == ["agentrun", "operator"]:
        return "operator"
    return parts[2] if len(parts) > 2 else "agentrun.worker"


def _imported(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for each import of ours anywhere in the module: functions and TYPE_CHECKING too."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from agentrun.worker import tools` imports the module agentrun.worker.tools
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "agentrun":
                yield node.lineno, name


def _arrows() -> list[tuple[str, int, str, str, str]]:
    """(file, line, imported module, from room, to room) for each import of ours that leaves its room."""
    arrows = []
    for module, path in MODULES.items():
        for line, name in _imported(module, path):
            source, target = room_of(module), room_of(name)
            if source != target:
                arrows.append((str(path.relative_to(ROOT)), line, name, source, target))
    return arrows


def test_every_module_is_in_a_room_of_the_table() -> None:
    rooms = {room_of(m) for m in MODULES}
    assert not rooms - MAY_IMPORT.keys(), f"rooms missing from MAY_IMPORT: {sorted(rooms - MAY_IMPORT.keys())}"


def test_imports_point_down_the_floors() -> None:
    broken = []
    for file, line, name, source, target in _arrows():
        if target in MAY_IMPORT.get(source, set()) or (file, name) in PENDING:
            continue
        allowed = ", ".join(sorted(MAY_IMPORT.get(source, set()))) or "nothing of ours"
        broken.append(f"{file}:{line} imports {name} ({target}), but {source} may import only {allowed}")
    assert not broken, "imports against the layer order:\n  " + "\n  ".join(broken)


def test_pending_moves_are_still_pending() -> None:
    seen = {(file, name) for file, _, name, _, _ in _arrows()}
    done = [f"{file} -> {name} ({why})" for (file, name), why in PENDING.items() if (file, name) not in seen]
    assert not done, "these imports are gone: remove them from PENDING:\n  " + "\n  ".join(done)


def test_the_core_imports_nothing_of_ours_but_itself() -> None:
    outside = [f"{file}:{line} imports {name}" for file, line, name, source, _ in _arrows() if source == "core"]
    assert not outside, "the core imports another room:\n  " + "\n  ".join(outside)


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of rooms in `graph` (room -> rooms it imports), or [] when there is none."""

    def walk(room: str, path: list[str]) -> list[str]:
        for nxt in sorted(graph.get(room, ())):
            if nxt in path:
                return [*path[path.index(nxt):], nxt]
            if found := walk(nxt, [*path, nxt]):
                return found
        return []

    return next((c for room in sorted(graph) if (c := walk(room, [room]))), [])


def test_no_cycle_between_rooms() -> None:
    graph: dict[str, set[str]] = {}
    for file, _, name, source, target in _arrows():
        if (file, name) not in PENDING:
            graph.setdefault(source, set()).add(target)
    cycle = _cycle(graph)
    assert not cycle, "rooms import each other in a circle: " + " -> ".join(cycle)


def test_the_table_itself_has_no_cycle() -> None:
    cycle = _cycle(MAY_IMPORT)
    assert not cycle, "MAY_IMPORT lets rooms import each other in a circle: " + " -> ".join(cycle)


def test_worker_top_level_keeps_at_most_a_few_modules() -> None:
    top = sorted(p.name for p in (ROOT / "worker").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"worker/ has {len(top)} modules at its top level: {top}"


# -- errors: one module per room, where callers look ----------------------------------------------------

ERROR_SUFFIXES = ("Error", "Exception")


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def _exception_classes() -> list[tuple[str, str, int, str]]:
    """(module, file, line, class) for every exception class of ours: a base named *Error or *Exception,
    or a base that is one of ours (LlmError's subclasses, say)."""
    classes = [
        (module, str(path.relative_to(ROOT)), node)
        for module, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ClassDef)
    ]
    ours: set[str] = set()
    while True:
        found = {
            node.name for _, _, node in classes
            if any(b.endswith(ERROR_SUFFIXES) or b in ours for b in _base_names(node))
        }
        if found <= ours:
            break
        ours |= found
    return [(module, file, node.lineno, node.name) for module, file, node in classes if node.name in ours]


def test_exception_classes_are_defined_only_in_errors_modules() -> None:
    outside = [f"{file}:{line} defines {name}" for module, file, line, name in _exception_classes()
               if not module.endswith(".errors")]
    assert not outside, "exception classes belong in their room's errors.py (re-exported where callers look):\n  " \
        + "\n  ".join(outside)


def test_one_errors_module_per_room_at_most() -> None:
    per_room: dict[str, list[str]] = {}
    for module in MODULES:
        if module.endswith(".errors"):
            per_room.setdefault(room_of(module), []).append(module)
    assert all(len(m) == 1 for m in per_room.values()), per_room


def test_errors_modules_export_their_classes() -> None:
    defined: dict[str, set[str]] = {}
    for module, _, _, name in _exception_classes():
        if module.endswith(".errors"):
            defined.setdefault(module, set()).add(name)
    for module, names in defined.items():
        exported = set(importlib.import_module(module).__all__)
        assert names <= exported, f"{module}.__all__ leaves out {sorted(names - exported)}"


def test_no_two_exception_classes_share_a_name() -> None:
    names = [name for _, _, _, name in _exception_classes()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_errors_modules_load_no_framework() -> None:
    # Any layer may import an errors module to catch what it raises, the CLI's quick commands included.
    errors = [m for m in MODULES if m.endswith(".errors")]
    code = "import sys, json\n" + "".join(f"import {m}\n" for m in errors) + "print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    heavy = {m.split(".")[0] for m in json.loads(out.stdout)} & {*IO, "starlette", "mcp", "openai", "pydantic"}
    assert not heavy, f"an errors module pulled in {sorted(heavy)}"


# The engine's driver is the loop and its two steps (the model's, a tool's); every other kind of step is a
# part of runtime/ with a narrow interface (issue 45). What it may define, besides dunders:
DRIVER = {"me", "settings", "drive", "_resume", "_resume_seq", "_loop", "_owed", "_decide", "_finish",
          "_final_answer", "_hand_back_in_outage", "_model_step", "_tool_step"}
ENGINE_PARTS = {"durable", "messages", "people", "waiting", "subagents", "compaction"}


def test_the_driver_is_the_loop_and_its_two_steps() -> None:
    tree = ast.parse((ROOT / "worker" / "runtime" / "engine.py").read_text())
    (driver,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunDriver"]
    methods = {n.name for n in driver.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert {m for m in methods if not m.startswith("__")} <= DRIVER, (
        "RunDriver grew a method: a new kind of step belongs in a part of runtime/ (ENGINE_PARTS)")


def test_the_engines_parts_take_the_store_part_they_use() -> None:
    """A part is typed against the store's part it uses (store/steps.py, store/waits.py, ...), never the
    whole RunStore, and does not import the driver."""
    for name in ENGINE_PARTS:
        tree = ast.parse((ROOT / "worker" / "runtime" / f"{name}.py").read_text())
        imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert ("agentrun.worker.store", "RunStore") not in imported, name
        assert not {m for m, _ in imported if m == "agentrun.worker.runtime.engine"}, name
