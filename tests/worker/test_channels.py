"""Channel names and advisory-lock keys are defined once (worker/store/channels.py) and the migrations'
triggers use the same values: a migration names them as `{{NAME}}`, written in when it is applied."""

from __future__ import annotations

import importlib.resources
import re

import psycopg
import pytest

from agentrun.worker.store import RunStore, channels, migrate
from agentrun.worker.store.channels import CHANNELS, EVENT_LOCK_GATE, NAMES, render
from tests.support.builders import new_run


def _raw() -> dict[str, str]:
    folder = importlib.resources.files("agentrun.worker.store").joinpath("migrations")
    return {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir() if p.name.endswith(".sql")}


def test_every_name_a_migration_uses_is_defined_and_written_in() -> None:
    used = {name for text in _raw().values() for name in re.findall(r"\{\{\s*(\w+)\s*\}\}", text)}
    assert used <= set(NAMES), f"undefined: {used - set(NAMES)}"
    assert {"WAKE_CHANNEL", "CANCEL_CHANNEL", "RUN_CHANNEL", "EVENTS_CHANNEL", "EVENT_LOCK_GATE"} <= used
    for m in migrate.available():
        assert "{{" not in m.sql, m.name


def test_no_migration_spells_out_a_channel_or_a_lock_key() -> None:
    for name, text in _raw().items():
        for channel in CHANNELS.values():
            assert f"'{channel}'" not in text, f"{name} names {channel} itself: use its {{{{NAME}}}}"
        assert str(EVENT_LOCK_GATE) not in text, name


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(KeyError, match="NO_SUCH_CHANNEL"):
        render("SELECT pg_notify('{{NO_SUCH_CHANNEL}}', '')")


async def test_the_triggers_notify_on_the_channels_the_code_listens_to(store: RunStore, database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await channels.listen(conn, channels.WAKE_CHANNEL, channels.EVENTS_CHANNEL)
        run, _ = await store.create(new_run())
        heard: set[str] = set()
        async for note in conn.notifies(timeout=10):
            heard.add(note.channel)
            if heard >= {channels.WAKE_CHANNEL, channels.EVENTS_CHANNEL}:
                break
    assert heard >= {channels.WAKE_CHANNEL, channels.EVENTS_CHANNEL}, f"heard {heard} after run {run.id}"


async def test_listen_takes_only_our_channels(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        with pytest.raises(ValueError, match="not an agentrun channel"):
            await channels.listen(conn, "x; DROP TABLE run")
