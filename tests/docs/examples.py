"""The shell and Python blocks of README.md and docs/, and what each is marked with: run here, run by a test
elsewhere, or not runnable and why. A marker is an HTML comment on the line right above the block."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# The languages of a block that is meant to be run: shell (or none said) and Python.
CHECKED = {"", "sh", "bash", "shell", "console", "python", "py", "python3"}
MARKER = re.compile(r"^<!-- (not-run|run-by|run): (.+?) -->$")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repo: README.md, docs/...
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None  # not-run, run-by or run
    says: str  # the marker's reason, test files or runner name

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text().splitlines()
    page = path.relative_to(ROOT).as_posix()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence)), len(lines))
        above = lines[i - 1].strip() if i else ""
        marker = MARKER.match(above)
        if lang in CHECKED:
            yield Block(page, i + 1, lang, "\n".join(lines[i + 1:end]) + "\n",
                        marker.group(1) if marker else None, marker.group(2).strip() if marker else "")
        i = end + 1


def every_block() -> list[Block]:
    return [b for p in pages() for b in blocks(p)]
