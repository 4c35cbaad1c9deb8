"""checkov, a well-kept Kubernetes security scanner, on every rendering of charts/agentrun/ci/*.yaml.

checkov comes from scripts/get_checkov.py (its own virtualenv, a pinned version, so the findings are the
same on every machine). Every check passes but those in SKIPPED, each of which charts/agentrun/README.md
("Security scan") explains; a skip that no longer fails anywhere must be removed, so the list stays true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support.chart import CHART, CI_VALUES, ROOT, Manifest

# check id → why it stays (the README says it at length).
SKIPPED = {
    "CKV_K8S_15": "imagePullPolicy Always: the chart's images are pinned by tag (or digest); image.pullPolicy sets it",
    "CKV_K8S_38": "the operator's ServiceAccount token: the operator calls the Kubernetes API; workers mount none",
    "CKV_K8S_40": "the bundled PostgreSQL runs as the official image's postgres user (999): it is for trying out",
    "CKV_K8S_43": "image digests: a chart cannot know them; image.tag takes `<version>@sha256:<digest>`",
}


@pytest.fixture(scope="session")
def checkov() -> str:
    """The pinned checkov: $CHECKOV, or installed (or found installed) by scripts/get_checkov.py."""
    if os.environ.get("CHECKOV"):
        return os.environ["CHECKOV"]
    got = subprocess.run([sys.executable, str(ROOT / "scripts" / "get_checkov.py")], capture_output=True,
                         text=True, timeout=1500)
    if got.returncode != 0:
        reason = f"checkov could not be installed: {got.stderr.strip()[-300:]}"
        if os.environ.get("CI") == "true":  # in CI a missing scanner must not hide the scan as a skip
            pytest.fail(f"CI=true: {reason}")
        pytest.skip(reason)
    return got.stdout.strip()


@pytest.fixture(scope="session")
def findings(checkov: str, render: Callable[..., list[Manifest]],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[tuple[str, str]]]:
    """Failed checks per values file, as (check id, resource), from one scan of every rendering."""
    out_dir = tmp_path_factory.mktemp("renderings")
    for values in CI_VALUES:
        (out_dir / values.name).write_text(yaml.safe_dump_all(render(values)))
    # --skip-download: nothing from Bridgecrew's platform (no network, and the same checks everywhere).
    scan = subprocess.run(
        [checkov, "--directory", str(out_dir), "--framework", "kubernetes", "--output", "json", "--quiet",
         "--compact", "--skip-download"],
        capture_output=True, text=True, timeout=600, cwd=out_dir,
        env={k: v for k, v in os.environ.items() if not k.startswith(("BC_", "PRISMA_"))},
    )
    assert scan.returncode in (0, 1), scan.stderr[-2000:]  # 1: something failed, reported below
    reports = json.loads(scan.stdout)
    result: dict[str, set[tuple[str, str]]] = {values.name: set() for values in CI_VALUES}
    for report in reports if isinstance(reports, list) else [reports]:
        assert report["summary"]["parsing_errors"] == 0, report["summary"]
        for failed in report["results"]["failed_checks"]:
            result[Path(failed["file_path"]).name].add((failed["check_id"], failed["resource"]))
    assert sum(report["summary"]["passed"] for report in (reports if isinstance(reports, list) else [reports])) > 0
    return result


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_check_passes_but_the_documented_skips(values: Path,
                                                     findings: dict[str, set[tuple[str, str]]]) -> None:
    unexpected = sorted(f for f in findings[values.name] if f[0] not in SKIPPED)
    assert not unexpected, f"checkov findings on {values.name}: fix them, or skip and document them: {unexpected}"


def test_every_skip_is_still_needed_and_documented(findings: dict[str, set[tuple[str, str]]]) -> None:
    failing = {check for found in findings.values() for check, _ in found}
    assert not set(SKIPPED) - failing, f"skipped checks that pass now: remove them {sorted(set(SKIPPED) - failing)}"
    readme = (CHART / "README.md").read_text()
    assert not [c for c in SKIPPED if c not in readme], "every skipped check is explained in charts/agentrun/README.md"
