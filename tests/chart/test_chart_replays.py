"""`replays.scorers`: the chart hands the workers the custom scorers a replay may name as AGENTRUN_REPLAY_SCORERS,
which the worker reads back as given; none by default, and the schema refuses one that is not `module:function`."""

from __future__ import annotations

from collections.abc import Callable

from agentrun.worker.core.replays import scorers_setting
from tests.support.chart import CHART, Manifest, run_helm

Render = Callable[..., list[Manifest]]
EVERYTHING = CHART / "ci" / "everything-keda-values.yaml"


def _config(manifests: list[Manifest]) -> dict[str, str]:
    (config,) = [m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-config")]
    return config["data"]  # type: ignore[no-any-return]


def test_the_scorers_reach_the_workers_as_given(render: Render) -> None:
    data = _config(render(EVERYTHING))
    assert scorers_setting(data["AGENTRUN_REPLAY_SCORERS"]) == ("mycompany.evals:judge", "evals:same_answer")
    assert "AGENTRUN_REPLAY_SCORERS" not in _config(render())


def test_the_schema_refuses_a_scorer_that_is_no_module_function(helm: str) -> None:
    for bad in ("judge", "evals:", "my-evals:judge", "evals:judge:again"):
        result = run_helm(helm, "template", "demo", str(CHART), "--set", f"replays.scorers[0]={bad}")
        assert result.returncode != 0 and "/replays/scorers/0" in result.stderr, (bad, result.stderr)
