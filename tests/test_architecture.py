"""Architecture rules that keep the layers visible: the pure core does no I/O, imports point down the
floors of the house, exceptions live in one errors module per room, and the layout trap."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PURE = [
    "agentrun.worker.core.records",
    "agentrun.worker.core.replay",
    "agentrun.worker.core.replays",
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


def _modules(packages: dict[str, str] = PACKAGES) -> dict[str, Path]:
    """Every module of `packages` (folder: dotted package) by its dotted name."""
    found = {}
    for folder, package in packages.items():
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
ENGINE_PARTS = {"durable", "messages", "people", "waiting", "subagents", "compaction", "recorded"}


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


# -- one door for a new run ------------------------------------------------------------------------------
#
# Every run is written by one statement, store/insert.py's INSERT_RUN, and whatever sends it is reached only
# through the door (runtime/door.py), which resolves the agent, applies the policy, pins, and records the way
# in. The store's functions that send it are found, not listed: those that name the statement, and those that
# name one of them, until no more are found. Outside the store, only the door may call them on the store or
# import them.

INSERT_INTO_RUN = re.compile(r"\bINSERT\s+INTO\s+run\b", re.IGNORECASE)
THE_STATEMENT = ("worker/store/insert.py", "INSERT_RUN")
DOOR = "agentrun.worker.runtime.door"
STORE_HANDLE = re.compile(r"(^|\.)(store_?|st)$")
"""What the store is called where it is held (`self.store`, `store`, a guarded call's `st`), as
test_sql_gateway.py knows a connection by its name."""


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of each string in the module, an f-string's literal parts joined."""
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in parts:
            yield node.lineno, node.value.decode(errors="replace") if isinstance(node.value, bytes) else node.value
        elif isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else " x " for v in node.values)


def _definitions(tree: ast.Module) -> Iterator[tuple[str, set[str]]]:
    """(name, the names it mentions) for each function, method and module-level assignment of a module."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, _mentioned(node)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    yield target.id, _mentioned(node.value)


def _mentioned(node: ast.AST) -> set[str]:
    """What `node` calls or reads of its module and objects: names called, constants, attributes (not its
    parameters and locals, which may share a name with a function)."""
    called = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    constants = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and re.fullmatch(r"_?[A-Z][A-Z0-9_]*", n.id)}
    return called | constants | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _run_writers() -> set[str]:
    """The names in the store that send the statement that inserts into `run`, directly or through another."""
    store = [ast.parse(p.read_text(), str(p)) for m, p in MODULES.items() if room_of(m) == "store"]
    definitions = [d for tree in store for d in _definitions(tree)]
    found = {THE_STATEMENT[1]}
    while True:
        more = {name for name, mentions in definitions if mentions & found} - found
        if not more:
            return found - {THE_STATEMENT[1]}
        found |= more


def test_one_statement_inserts_into_run() -> None:
    found = [(str(path.relative_to(ROOT)), line) for path in MODULES.values()
             for line, text in _strings(ast.parse(path.read_text(), str(path))) if INSERT_INTO_RUN.search(text)]
    found += [(str(p.relative_to(ROOT)), 0) for p in sorted((ROOT / "worker").rglob("*.sql"))
              if INSERT_INTO_RUN.search(p.read_text())]
    assert [file for file, _ in found] == [THE_STATEMENT[0]], \
        f"exactly one statement inserts into run ({THE_STATEMENT[0]}): {found}"


def test_only_the_door_makes_runs() -> None:
    writers = _run_writers()
    # Not blind: it finds what the store sends the statement by, for each way in.
    assert {"insert_run", "create", "tick", "spawn"} <= writers, writers
    outside = []
    for module, path in MODULES.items():
        if room_of(module) == "store" or module == DOOR:
            continue
        file = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in writers and STORE_HANDLE.search(ast.unparse(node.value)):
                outside.append(f"{file}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentrun.worker.store"):
                outside += [f"{file}:{node.lineno} imports {a.name}" for a in node.names if a.name in writers]
    assert not outside, "a run is made only through the door (runtime/door.py), which resolves the agent, applies " \
        "the policy, pins and records the way in:\n  " + "\n  ".join(outside)


def test_the_store_handle_pattern_sees_how_the_store_is_held() -> None:
    """Every way of holding the store in the code is one STORE_HANDLE knows (else it could not see a call)."""
    held = {ast.unparse(n.value) for m, path in MODULES.items() if room_of(m) != "store"
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Attribute) and n.attr in ("for_run", "find_linked", "next_due_in", "cancel_orphans")}
    assert held and all(STORE_HANDLE.search(h) for h in held), held


def test_the_door_is_where_the_ways_in_meet() -> None:
    """Each way in reaches the store's writers through the door, and the door names each of them."""
    door = ast.parse(MODULES[DOOR].read_text())
    assert {"create", "tick", "spawn"} <= {n.attr for n in ast.walk(door) if isinstance(n, ast.Attribute)}
    for module in ("agentrun.worker.api.common", "agentrun.operator.handlers", "agentrun.worker.runtime.schedules",
                   "agentrun.worker.runtime.engine"):
        assert "Door" in _mentioned(ast.parse(MODULES[module].read_text())), f"{module} makes runs without the door"


# -- modules of peers: no private name crosses a module, no cycle between modules --------------------------
#
# A name with one leading underscore belongs to its module: no other module imports it (`from m import _x`)
# or reaches into it (`m._x`, `m` a module of ours bound by an import). What two modules share is public,
# in one of them or in a module of its own (api/common.py for the API's routers). The rule holds in the
# package (worker/, operator/), in tests/ (a test reaches what it tests through public names, as callers
# do) and in bench/. A package's private *module* is another thing: bench/_pg.py and bench/_worker.py are the
# helpers its benchmarks share (the underscore keeps them off the list of benchmarks), and modules of the
# same package may import them.
CHECKED = {"worker": "agentrun.worker", "operator": "agentrun.operator", "tests": "tests", "bench": "bench"}

# Private names still imported across modules, each while it moves. Each must still be there: once it is
# gone its entry goes too, so this list never hides a new one.
PRIVATE_PENDING: dict[tuple[str, str], str] = {}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


CHECKED_MODULES = _modules(CHECKED)
OURS = {"agentrun", "tests", "bench"}


def _private_crossings(module: str, path: Path, text: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, `module.name`) for each private name of another module of ours that `module` (at `path`, its
    text read there unless given) imports or reaches."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    bound: dict[str, str] = {}  # a name in this module -> the module of ours it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:  # `import a.b.c` binds `a`, and `a.b.c` is reached by its dotted name
                        bound.update({".".join(alias.name.split(".")[:i]): ".".join(alias.name.split(".")[:i])
                                      for i in range(1, alias.name.count(".") + 2)})
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] not in OURS:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in CHECKED_MODULES:
                    bound[alias.asname or alias.name] = full
                    if _private(alias.name) and base != package:  # a private module outside its package
                        yield node.lineno, full
                elif _private(alias.name) and base != module:
                    yield node.lineno, full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            target = bound.get(ast.unparse(node.value))
            if target is not None and target != module and f"{target}.{node.attr}" not in CHECKED_MODULES:
                yield node.lineno, f"{target}.{node.attr}"


def _crossings() -> list[tuple[str, int, str]]:
    return [(str(path.relative_to(ROOT)), line, name) for module, path in CHECKED_MODULES.items()
            for line, name in _private_crossings(module, path)]


def test_no_private_name_is_used_outside_its_module() -> None:
    found = [f"{file}:{line} uses {name}" for file, line, name in _crossings() if (file, name) not in PRIVATE_PENDING]
    assert not found, "a private name belongs to its module; make it public (or move it where both can see it):" \
        "\n  " + "\n  ".join(found)


def test_pending_private_names_are_still_pending() -> None:
    seen = {(file, name) for file, _, name in _crossings()}
    done = [f"{file} -> {name}" for file, name in PRIVATE_PENDING if (file, name) not in seen]
    assert not done, "these private names no longer cross: remove them from PRIVATE_PENDING:\n  " + "\n  ".join(done)


def test_the_private_name_check_sees_what_it_looks_for() -> None:
    """Not blind: each form it knows is found in a module written for the purpose."""
    text = ("from agentrun.worker.store.rows import _run\nfrom agentrun.worker.store import rows\n"
            "import agentrun.worker.api.schemas as schemas\nimport agentrun.worker.llm.errors\n"
            "rows._step\nschemas._whole\nagentrun.worker.llm.errors._x\nrows.as_run\n")
    found = [name for _, name in _private_crossings("tests.sample", ROOT / "tests" / "sample.py", text)]
    assert sorted(found) == ["agentrun.worker.api.schemas._whole", "agentrun.worker.llm.errors._x",
                             "agentrun.worker.store.rows._run", "agentrun.worker.store.rows._step"], found


# Between modules of the package (worker/ and operator/), imports make no circle, whatever the rooms: a
# module that needs another's piece and is needed by it shares that piece through a third. Every import
# counts, as for the rooms: inside functions and under TYPE_CHECKING too (a circle kept for the type checker
# alone is still two modules that cannot be read one before the other). `from package import name` points
# to the module `name` when it is one, else to the package's __init__; the parent packages Python loads on
# the way are not counted (no module asked for them).


def _module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for _, name in _imported(module, path):
            if name in MODULES and name != module:
                graph[module].add(name)
    return graph


def _module_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of modules in `graph`, or [] when there is none (depth-first, each module visited once)."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        for nxt in sorted(graph[module]):
            if nxt in path:
                return [*path[path.index(nxt):], nxt]
            if nxt not in done and (found := visit(nxt, [*path, nxt])):
                return found
        done.add(module)
        return []

    for module in sorted(graph):
        if module not in done and (found := visit(module, [module])):
            return found
    return []


def test_no_cycle_between_modules() -> None:
    cycle = _module_cycle(_module_graph())
    assert not cycle, "modules import each other in a circle: " + " -> ".join(cycle)


def test_the_module_cycle_check_finds_a_circle() -> None:
    graph = _module_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300, "the graph misses modules or imports"
    assert _module_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _module_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
