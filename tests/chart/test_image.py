"""What can be checked of the image without a Docker daemon: the Dockerfile's shape, and that the
commands and flags the chart runs in it exist in the installed `agentrun`."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

from tests.support.chart import CI_VALUES, ROOT, Manifest, find

DOCKERFILE = ROOT / "Dockerfile"
AGENTRUN = Path(sys.executable).with_name("agentrun")


def _stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), split into build stages."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def _help(*command: str) -> str:
    result = subprocess.run([str(AGENTRUN), *command, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_entry_point_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "agentrun" in project["project"]["scripts"]
    assert AGENTRUN.exists(), "the package is not installed in this interpreter's environment"


def test_the_image_files_exist() -> None:
    # Read by the tests below; a missing one is a failure, never a skip.
    assert DOCKERFILE.is_file() and (ROOT / ".dockerignore").is_file()


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    stages = _stages()
    assert len(stages) >= 2
    final = stages[-1]
    assert "slim" in DOCKERFILE.read_text().split("PYTHON_IMAGE=", 1)[1].split()[0]
    users = [ln.split()[1] for ln in final if ln.upper().startswith("USER ")]
    assert users and re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", users[-1]), "the final stage runs as a numeric non-root UID"
    assert 'ENTRYPOINT ["agentrun"]' in final and 'CMD ["worker"]' in final
    # Build tools stay in the builder; the final stage only copies the finished virtualenv.
    final_text = " ".join(final)
    for tool in ("gcc", "build-essential", "apt-get install", "pip install", "COPY . "):
        assert tool not in final_text
    assert any(ln.startswith("COPY --from=builder") for ln in final)


def test_dockerfile_copies_what_the_package_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dirs = set(project["tool"]["setuptools"]["package-dir"].values())
    sources = {p.rstrip("/") for ln in _stages()[0] if ln.startswith("COPY ") for p in ln.split()[1:-1]}
    assert package_dirs <= sources, "every package folder goes into the image"
    assert {"pyproject.toml", project["project"]["readme"]} <= sources
    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")}
    assert not sources & ignored, "the Dockerfile copies something .dockerignore leaves out"


def test_cli_has_the_commands_the_chart_runs() -> None:
    top = _help()
    for command in ("worker", "migrate"):
        assert re.search(rf"\b{command}\b", top), f"`agentrun {command}` is missing"


def _flags(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("--")]


def test_worker_and_migrate_flags_exist(render: Callable[..., list[Manifest]]) -> None:
    everything = next(p for p in CI_VALUES if p.stem == "everything-keda-values")
    pod = find(render(everything), "Deployment", "-worker")["spec"]["template"]["spec"]
    worker_help = _help("worker")
    for flag in _flags(pod["containers"][0]["args"]):
        assert flag in worker_help, f"the chart passes {flag} to `agentrun worker`, which does not know it"
    assert pod["initContainers"][0]["args"] == ["migrate"]
    _help("migrate")


def test_operator_flags_exist(render: Callable[..., list[Manifest]]) -> None:
    assert re.search(r"\boperator\b", _help()), "`agentrun operator` is missing"
    watching_one = next(p for p in CI_VALUES if p.stem == "everything-hpa-values")
    container = find(render(watching_one), "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    operator_help = _help("operator")
    for flag in _flags(container["args"]):
        assert flag in operator_help, f"the chart passes {flag} to `agentrun operator`, which does not know it"
