"""The browser tests' fixtures: one Chromium per session (per pytest-xdist worker), a fresh browser context
per test, so tests share the browser process and nothing else (no cookies, storage, cache or page).

Playwright's objects belong to the event loop that started it, so every async test here, and the database
fixtures it uses, runs on the session's loop (pytest-asyncio's `loop_scope="session"`); the fixtures of
tests/conftest.py run on a loop per test, and `pool`, `store` and `db` are redefined here to match.
Each test still gets its own database clone, pool, stack and context.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import pytest_asyncio
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.store import RunStore
from tests.support import databases
from tests.ui import chromium

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    session_loop = pytest.mark.asyncio(loop_scope="session")
    for item in items:
        if pytest_asyncio.is_async_test(item) and item.path.is_relative_to(HERE):
            item.add_marker(session_loop, append=False)


# Each a function of its own: pytest-asyncio marks the function it is given with its loop scope.
@pytest_asyncio.fixture(loop_scope="session")
async def pool(database_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async for p in databases.pool(database_url):
        yield p


@pytest_asyncio.fixture(loop_scope="session")
async def store(pool: AsyncConnectionPool[Any]) -> RunStore:
    return RunStore(pool)


@pytest_asyncio.fixture(loop_scope="session")
async def db(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async for conn in databases.db(database_url):
        yield conn


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """Launched once (about 0.6 s with Playwright's driver); a test module skips itself without Chromium
    (tests/ui/test_ui.py) before it asks for this."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium.executable(), args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            await b.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    p = await context.new_page()
    p.set_default_timeout(30_000)
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield p
    finally:
        await context.close()
    assert not errors, f"the page raised: {errors}"
