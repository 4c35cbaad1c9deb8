"""Fixtures: an emulated Kubernetes API server and the real kopf operator running against it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import kmock
import pytest

from tests.operator.emulator import ApiServer
from tests.support.cluster import Cluster, operator_running, settings_for


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with ApiServer() as server, kmock.Server(server) as srv:
        url = str(srv.url).rstrip("/")
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            yield Cluster(server, url, http)


@pytest.fixture
async def operator(cluster: Cluster, database_url: str) -> AsyncIterator[None]:
    async with operator_running(cluster, settings_for(database_url)):
        yield
