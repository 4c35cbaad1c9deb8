"""Every shell and Python block in README.md and docs/ is run: here, by a test elsewhere that names the page,
or marked not runnable with a reason (tests/docs/examples.py says how a block is marked)."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import pytest

from tests.docs.examples import ROOT, Block, every_block

BLOCKS = every_block()
# What `<!-- run: NAME -->` may name: the blocks of one page run in order in one interpreter, as a reader would.
RUNNERS = {"python"}


def test_every_block_is_run_or_says_why_not() -> None:
    unmarked = [b.where for b in BLOCKS if b.marker is None]
    assert not unmarked, (
        "a shell or Python block that no test runs: have a test run it, or put "
        "`<!-- not-run: the reason -->` on the line above it: " + ", ".join(unmarked))
    for b in BLOCKS:
        if b.marker == "not-run":
            assert len(b.says) >= 20, f"{b.where}: say why it cannot be run"
        if b.marker == "run":
            assert b.says in RUNNERS, f"{b.where}: no runner {b.says!r}"
        if b.marker == "run-by":
            files = b.says.split()
            for name in files:
                assert (ROOT / name).is_file(), f"{b.where}: {name} does not exist"
            page = "README" if b.page == "README.md" else b.page
            assert any(page in (ROOT / name).read_text() for name in files), \
                f"{b.where}: none of {files} names {page}: say there which test runs it"


def _python_pages() -> dict[str, list[Block]]:
    found: dict[str, list[Block]] = defaultdict(list)
    for b in BLOCKS:
        if b.marker == "run" and b.says == "python":
            found[b.page].append(b)
    return dict(found)


@pytest.mark.parametrize("page", sorted(_python_pages()))
def test_the_python_blocks_run(page: str) -> None:
    """The page's Python blocks in order, in a fresh interpreter with the package installed: what they define
    is defined (a @tool registers), and nothing raises."""
    code = "\n".join(b.code for b in _python_pages()[page])
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{page}: {out.stderr[-2000:]}"
