"""The documentation site builds with `mkdocs build --strict` (no broken link or anchor, no page left out of the
navigation), and README.md stays the short front door with the two commands first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.docs.examples import ROOT

README_LIMIT = 12 * 1024


def test_the_site_builds_strict(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
    concept = (tmp_path / "site" / "concepts" / "runs-and-steps" / "index.html").read_text()
    assert '<pre class="mermaid">' in concept  # the diagram is drawn, not shown as code


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= README_LIMIT, f"README.md is {len(readme)} bytes: move what it grew into docs/"
    first = re.search(r"```sh\n(.*?)```", readme.decode(), re.S)
    assert first is not None
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands[:2] == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci  # CI runs the README's test command


def test_the_readme_links_lead_somewhere() -> None:
    """README.md is read on the forge, outside the site: its relative links name files of the repository."""
    readme = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)]+)\)", readme) if "://" not in t and not t.startswith("#")]
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
