"""The chart lints, renders with default values and with every optional part on, and what it renders is
valid Kubernetes with secure pod defaults."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from agentrun.worker.core.pricing import PriceTable
from tests.chart.secret_refs import secret_refs
from tests.support.chart import CHART, CI_VALUES, NAMESPACE, Manifest, find, kinds, run_helm

KUBERNETES_VERSION = "1.33"
# Kinds of other operators' CRDs, unknown to kubernetes-validate: checked by shape below instead.
FOREIGN_KINDS = {"ServiceMonitor", "PrometheusRule", "ScaledObject", "TriggerAuthentication"}
CASES = [None, *CI_VALUES]
CASE_IDS = ["defaults", *(p.stem for p in CI_VALUES)]
Render = Callable[..., list[Manifest]]


def _render(render: Render, values: Path | None) -> list[Manifest]:
    return render(values) if values else render()


def _pod_specs(manifests: list[Manifest]) -> list[tuple[str, dict[str, Any]]]:
    return [(m["metadata"]["name"], m["spec"]["template"]["spec"])
            for m in manifests if m["kind"] in ("Deployment", "StatefulSet")]


def test_ci_values_cover_every_optional_part() -> None:
    names = {p.stem for p in CI_VALUES}
    assert {"everything-keda-values", "everything-hpa-values", "minimal-values"} <= names


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_lint_strict(helm: str, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_rendered_manifests_validate(render: Render, values: Path | None) -> None:
    for manifest in _render(render, values):
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        if manifest["kind"] in FOREIGN_KINDS:
            continue
        try:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{name}: {e.message} at {list(e.path)}")


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_pods_are_locked_down(render: Render, values: Path | None) -> None:
    for name, pod in _pod_specs(_render(render, values)):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        for container in pod["containers"] + pod.get("initContainers", []):
            where = f"{name}/{container['name']}"
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert container["resources"]["requests"] and container["resources"]["limits"], where
            # A read-only root needs a writable /tmp.
            assert "/tmp" in {v["mountPath"] for v in container["volumeMounts"]}, where


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_no_secret_in_a_configmap(render: Render, values: Path | None) -> None:
    for manifest in _render(render, values):
        if manifest["kind"] == "ConfigMap":
            # The providers file names the variables holding endpoint keys (`"apiKeyEnv":"OPENAI_API_KEY"`):
            # a name, not a secret; the keys themselves come from Secrets.
            data = re.sub(r'"apiKeyEnv":"\w+"', "", str(manifest.get("data", {})))
            assert not re.search(r"postgres(ql)?://|API_KEY|API_TOKEN|password", data, re.I), manifest["metadata"]["name"]


def test_defaults(render: Render) -> None:
    manifests = render()
    assert not kinds(manifests) & (FOREIGN_KINDS | {"StatefulSet", "HorizontalPodAutoscaler"})
    worker = find(manifests, "Deployment", "-worker")
    pod = worker["spec"]["template"]["spec"]
    assert worker["spec"]["replicas"] == 2
    assert pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]
    args = container["args"]
    assert args[0] == "worker" and args[args.index("--shutdown-grace") + 1] == "25"
    # A restarted container is a worker of its own (the pod's name plus a per-process suffix): the runs of
    # the process that died move by its free liveness lock, not after the lease (test_restart_under_the_same_pod_name).
    assert args[args.index("--id-prefix") + 1] == "$(POD_NAME)" and "--id" not in args
    # The kubelet's SIGKILL comes after the worker's own grace has run out.
    assert pod["terminationGracePeriodSeconds"] > float(args[args.index("--shutdown-grace") + 1])
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Secrets are files by default (`secrets.asFiles`): `<NAME>_FILE` in the environment, no value.
    assert not [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    refs = secret_refs(pod, container)
    assert refs["AGENTRUN_DATABASE_URL"] == ("agentrun-database", "url")
    assert refs["ANTHROPIC_API_KEY"] == ("agentrun-anthropic", "api-key")
    token_name, token_key = refs["AGENTRUN_API_TOKEN"]
    token = find(manifests, "Secret", "-api-token")
    assert token_name == token["metadata"]["name"] and len(token["data"][token_key]) > 40
    annotations = worker["spec"]["template"]["metadata"]["annotations"]
    assert {"checksum/config", "checksum/api-token"} <= set(annotations)
    # The migration init container gets the database and nothing else secret.
    migrate = pod["initContainers"][0]
    assert migrate["args"] == ["migrate"] and [e["name"] for e in migrate["env"]] == ["AGENTRUN_DATABASE_URL_FILE"]
    assert set(secret_refs(pod, migrate)) == {"AGENTRUN_DATABASE_URL"}
    assert find(manifests, "ServiceAccount", "-worker")["automountServiceAccountToken"] is False
    dashboard = find(manifests, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["agentrun.json"] == (CHART / "dashboards" / "agentrun.json").read_text().rstrip("\n")
    assert find(manifests, "CustomResourceDefinition", "agentruns.agentrun.dev")["spec"]["names"]["kind"] == "AgentRun"
    assert find(manifests, "CustomResourceDefinition", "agents.agentrun.dev")["spec"]["names"]["kind"] == "Agent"


def test_operator_is_single_and_scoped(render: Render) -> None:
    manifests = render()
    operator = find(manifests, "Deployment", "-operator")
    assert operator["spec"]["replicas"] == 1 and operator["spec"]["strategy"]["type"] == "Recreate"
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["operator", "--standalone"]
    assert [e["name"] for e in container["env"]] == ["AGENTRUN_DATABASE_URL_FILE"]
    assert set(secret_refs(operator["spec"]["template"]["spec"], container)) == {"AGENTRUN_DATABASE_URL"}
    role = find(manifests, "ClusterRole", "-operator")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules[(("agentrun.dev",), ("agentruns",))] == {"get", "list", "watch", "patch", "delete"}  # delete: ttlSecondsAfterFinished
    assert rules[(("agentrun.dev",), ("agentruns/status",))] == {"get", "patch"}
    assert rules[(("agentrun.dev",), ("agents",))] == {"get", "list", "watch", "patch"}  # never delete an Agent
    assert rules[(("agentrun.dev",), ("agents/status",))] == {"get", "patch"}
    assert "create" in rules[(("", "events.k8s.io"), ("events",))]
    discovery = find(manifests, "ClusterRole", "-operator-discovery")
    assert {r["resources"][0] for r in discovery["rules"]} == {"customresourcedefinitions", "namespaces"}
    for r in role["rules"] + discovery["rules"]:
        assert "*" not in r["verbs"]
        assert "delete" not in r["verbs"] or r["resources"] == ["agentruns"]  # only its own finished AgentRuns
    # Workers get no RBAC at all.
    for m in manifests:
        if m["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert all(s["name"].endswith("-operator") for s in m["subjects"])


def test_one_watched_namespace_gets_a_role_there(render: Render) -> None:
    manifests = render(next(p for p in CI_VALUES if p.stem == "everything-hpa-values"))
    role = find(manifests, "Role", "-operator")
    binding = find(manifests, "RoleBinding", "-operator")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "agents"
    assert binding["subjects"][0]["namespace"] == NAMESPACE
    operator = find(manifests, "Deployment", "-operator")
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--namespace") + 1] == "agents"
    hpa = find(manifests, "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in find(manifests, "Deployment", "-worker")["spec"]
    assert "ScaledObject" not in kinds(manifests)


def test_everything_with_keda(render: Render) -> None:
    manifests = render(next(p for p in CI_VALUES if p.stem == "everything-keda-values"))
    scaled = find(manifests, "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] == find(manifests, "Deployment", "-worker")["metadata"]["name"]
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "postgresql"
    assert trigger["metadata"]["query"] == (
        "SELECT count(*) FROM run WHERE status IN ('QUEUED', 'RUNNING') AND run_at <= now()"
    )
    # KEDA reads the URL from its Secret: the worker container has it only as a file.
    auth = find(manifests, "TriggerAuthentication")
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "connection", "name": find(manifests, "Secret", "-postgresql")["metadata"]["name"], "key": "url"}]
    assert "HorizontalPodAutoscaler" not in kinds(manifests)
    assert "replicas" not in find(manifests, "Deployment", "-worker")["spec"]

    monitor = find(manifests, "ServiceMonitor")
    service = find(manifests, "Service", "-worker")
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "http"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert find(manifests, "ConfigMap", "-dashboard")["metadata"]["namespace"] == "monitoring"

    # The bundled PostgreSQL: the workers' URL comes from its generated Secret.
    postgres = find(manifests, "StatefulSet", "-postgresql")
    assert postgres["spec"]["template"]["spec"]["containers"][0]["image"] == "postgres:16"
    secret = find(manifests, "Secret", "-postgresql")
    worker_pod = find(manifests, "Deployment", "-worker")["spec"]["template"]["spec"]
    assert secret_refs(worker_pod, worker_pod["containers"][0])["AGENTRUN_DATABASE_URL"] == (secret["metadata"]["name"], "url")
    # Its password is a file too, which the official image reads from POSTGRES_PASSWORD_FILE.
    postgres_pod = postgres["spec"]["template"]["spec"]
    assert secret_refs(postgres_pod, postgres_pod["containers"][0]) == {"POSTGRES_PASSWORD": (secret["metadata"]["name"], "password")}

    # The price table renders into TOML the worker's PriceTable reads, mounted where the env says.
    prices = find(manifests, "ConfigMap", "-prices")
    table = PriceTable.from_toml(prices["data"]["prices.toml"])
    assert str(table.prices["claude-haiku-4-5"].cache_read) == "0.1"
    assert str(table.prices["claude-sonnet-4-5"].output) == "15"
    config = find(manifests, "ConfigMap", "-config")["data"]
    assert config["AGENTRUN_PRICES_FILE"] == "/etc/agentrun/prices.toml"
    assert config["AGENTRUN_TOOLS"] == "agentrun_tools.search,agentrun_tools.files"
    assert config["AGENTRUN_LOG_FORMAT"] == "console"


def test_foreign_kinds_have_their_required_shape(render: Render) -> None:
    for values in CI_VALUES:
        for m in _render(render, values):
            if m["kind"] == "ServiceMonitor":
                assert m["apiVersion"] == "monitoring.coreos.com/v1" and m["spec"]["endpoints"]
            elif m["kind"] == "PrometheusRule":
                assert m["apiVersion"] == "monitoring.coreos.com/v1"
                for rule in (r for g in m["spec"]["groups"] for r in g["rules"]):
                    assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"} and rule["expr"].strip()
            elif m["kind"] == "ScaledObject":
                assert {"scaleTargetRef", "triggers", "minReplicaCount", "maxReplicaCount"} <= set(m["spec"])


def test_minimal_install_has_no_optional_parts(render: Render) -> None:
    manifests = render(next(p for p in CI_VALUES if p.stem == "minimal-values"))
    assert kinds(manifests) == {"ConfigMap", "Service", "Deployment", "CustomResourceDefinition", "NetworkPolicy"}
    pod = find(manifests, "Deployment", "-worker")["spec"]["template"]["spec"]
    assert "initContainers" not in pod and pod["serviceAccountName"] == "default"
    assert [e["name"] for e in pod["containers"][0]["env"]] == ["POD_NAME", "AGENTRUN_DATABASE_URL_FILE"]


def test_notes_tell_how_to_submit_a_run(helm: str) -> None:
    result = run_helm(helm, "install", "demo", str(CHART), "--dry-run=client", "--namespace", NAMESPACE)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kind: AgentRun" in notes and "kubectl -n agents-system get agentruns" in notes
    assert "grafana_dashboard" in notes and "create secret generic agentrun-database" in notes
