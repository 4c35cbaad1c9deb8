#!/usr/bin/env python3
"""Run mypy on the packages as they are imported (`agentrun.worker`, `agentrun.operator`), not as they lie.

The folders are mapped into the `agentrun` namespace by pyproject's package-dir, which mypy cannot
follow (nor the editable install's import hook). So this builds `agentrun/<name> -> <folder>` symlinks
in a temporary directory and runs mypy from there with the repo's config and a cache in the repo.
Extra arguments go to mypy; paths in its output are given back relative to the repo root.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = ROOT / ".mypy_cache"


def package_dirs(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """`agentrun.worker` -> `worker`: the mapping setuptools installs, read from where it is declared."""
    config = tomllib.loads(pyproject.read_text())
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    return mapping


def main(argv: list[str]) -> int:
    mapping = package_dirs()
    with tempfile.TemporaryDirectory(prefix="agentrun-typecheck-") as tmp:
        for package, folder in mapping.items():
            link = Path(tmp, *package.split("."))
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(ROOT / folder, target_is_directory=True)
        command = [
            sys.executable, "-m", "mypy",
            "--config-file", str(ROOT / "pyproject.toml"),
            "--cache-dir", str(CACHE_DIR),
            *(arg for package in mapping for arg in ("-p", package)),
            *argv,
        ]
        # mypy finds the packages in its working directory; MYPYPATH from outside would only add doubt.
        env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
        done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)
    prefixes = {package.replace(".", "/") + "/": folder + "/" for package, folder in mapping.items()}
    for stream, text in ((sys.stdout, done.stdout), (sys.stderr, done.stderr)):
        for line in text.splitlines(keepends=True):
            for prefix, folder in prefixes.items():
                if line.startswith(prefix):
                    line = folder + line[len(prefix):]
                    break
            stream.write(line)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
