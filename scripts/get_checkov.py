#!/usr/bin/env python3
"""Install checkov, the chart's security scanner, into a virtualenv of its own (tools/checkov) from PyPI.

checkov pins many dependencies of its own (boto3, networkx, ...), so it stays out of the project's
virtualenv: installing it there could move the project's own pins. tests/chart/test_chart_security_scan.py
runs it on every rendering of charts/agentrun/ci/*.yaml. Prints the path of the checkov executable;
exits non-zero if it cannot be installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "tools" / "checkov"
# Pinned so every machine runs the same checks and the test's skip list stays true; bump it deliberately
# (and re-read the findings: a new version adds checks).
PACKAGE = "checkov==3.3.30"
VERSION = PACKAGE.split("==")[1]


def installed(executable: Path) -> bool:
    try:
        out = subprocess.run([str(executable), "--version"], capture_output=True, text=True, timeout=120)
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == VERSION


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dest", type=Path, default=DEFAULT_DIR,
                        help=f"the virtualenv to install checkov into (default: {DEFAULT_DIR})")
    args = parser.parse_args()
    dest: Path = args.dest
    executable = dest / "bin" / "checkov"
    if not installed(executable):
        # A fresh virtualenv each time: a half-finished earlier install must not be built upon.
        shutil.rmtree(dest, ignore_errors=True)
        try:
            venv.create(dest, with_pip=True)
            subprocess.run([str(dest / "bin" / "python"), "-m", "pip", "install", "--quiet",
                            "--disable-pip-version-check", PACKAGE], check=True, timeout=1200)
        except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            print(f"get_checkov: could not install {PACKAGE} into {dest}: {e}", file=sys.stderr)
            return 1
        if not installed(executable):
            print(f"get_checkov: {executable} does not run after installing {PACKAGE}", file=sys.stderr)
            return 1
    print(executable)
    return 0


if __name__ == "__main__":
    sys.exit(main())
