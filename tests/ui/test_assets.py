"""The UI's files ship in the wheel and load nothing from elsewhere (no CDN, no web fonts): no browser needed."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import httpx
import pytest

from agentrun.worker.store import RunStore
from tests.support.builders import http_app

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "worker" / "ui"


def test_every_ui_file_is_package_data() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["agentrun.worker"]
    files = [p.relative_to(ROOT / "worker").as_posix() for p in UI.rglob("*") if p.is_file()]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), (files, globs)


def test_the_ui_loads_nothing_from_elsewhere() -> None:
    for path in UI.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not re.search(r"https?://", text), f"{path.name} names an outside URL"
            assert "@import" not in text and "innerHTML" not in text, path.name


@pytest.mark.parametrize("path", ["/ui/", "/ui/app.js", "/ui/api.js", "/ui/style.css"])
async def test_the_worker_serves_the_ui(store: RunStore, path: str) -> None:
    transport = httpx.ASGITransport(app=http_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://agentrun.test") as client:
        r = await client.get(path)
        assert r.status_code == 200 and r.text
        assert (await client.get("/")).headers["location"] == "/ui/"
