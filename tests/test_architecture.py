"""Architecture rules that keep the layers visible: the pure core does no I/O, and the layout trap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PURE = [
    "agentrun.worker.core.records",
    "agentrun.worker.core.replay",
    "agentrun.worker.core.guard",
    "agentrun.worker.core.pricing",
    "agentrun.worker.core.types",
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
