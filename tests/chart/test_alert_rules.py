"""The chart's alert rules, checked by promtool: valid rules, and unit tests proving each alert fires on
series that should trigger it and stays quiet on healthy ones (tests/chart/alert_tests.yaml)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.chart.prometheus_tools import RULES_VALUES, alert_exprs, require, write_rules
from tests.support.chart import Manifest

UNIT_TESTS = Path(__file__).parent / "alert_tests.yaml"


def test_promtool_checks_the_rendered_rules(render: Callable[..., list[Manifest]], tmp_path: Path) -> None:
    promtool = require("promtool")
    rules = write_rules(render(extra=RULES_VALUES), tmp_path)
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_exprs(render(extra=RULES_VALUES)))} rules found" in result.stdout


def test_every_alert_has_unit_tests_that_fire_and_stay_quiet(render: Callable[..., list[Manifest]]) -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for case in test["alert_rule_test"]:
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    alerts = set(alert_exprs(render(extra=RULES_VALUES)))
    assert firing == alerts and quiet == alerts


def test_promtool_unit_tests_of_the_alerts(render: Callable[..., list[Manifest]], tmp_path: Path) -> None:
    promtool = require("promtool")
    write_rules(render(extra=RULES_VALUES), tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = subprocess.run(
        [promtool, "test", "rules", UNIT_TESTS.name], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
