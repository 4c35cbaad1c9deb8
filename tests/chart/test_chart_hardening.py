"""The chart's hardening: the operator's probes, a NetworkPolicy per component that still lets the chart's own
traffic through, and secrets handed over as files by default."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.chart.secret_refs import secret_refs
from tests.support.chart import CI_VALUES, Manifest, find

Render = Callable[..., list[Manifest]]
EVERYTHING = next(p for p in CI_VALUES if p.stem == "everything-keda-values")


def _pod(manifests: list[Manifest], kind: str, suffix: str) -> tuple[dict[str, str], dict[str, Any]]:
    template = find(manifests, kind, suffix)["spec"]["template"]
    return template["metadata"]["labels"], template["spec"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items() and not selector.get("matchExpressions")


def _port_allowed(rule: dict[str, Any], port: int, container_ports: dict[str, int]) -> bool:
    ports = rule.get("ports")
    return ports is None or any(
        container_ports.get(p["port"], p["port"]) == port and p.get("protocol", "TCP") == "TCP" for p in ports)


def _allows(policy: Manifest, direction: str, peer_labels: dict[str, str], port: int,
            container_ports: dict[str, int] | None = None, address: str | None = None) -> bool:
    """Whether `policy` lets traffic from/to a pod of the same namespace with `peer_labels` (or to the IP
    `address`) on TCP `port` (named ports resolved through `container_ports`, the selected pod's)."""
    key = "from" if direction == "ingress" else "to"
    for rule in policy["spec"].get(direction, []):
        if not _port_allowed(rule, port, container_ports or {}):
            continue
        peers = rule.get(key)
        if peers is None:
            return True
        for peer in peers:
            if address is not None and "ipBlock" in peer and peer["ipBlock"]["cidr"] == "0.0.0.0/0":
                return True
            if address is None and "podSelector" in peer and "namespaceSelector" not in peer \
                    and _selects(peer["podSelector"], peer_labels):
                return True
    return False


def _policy_of(manifests: list[Manifest], pod_labels: dict[str, str]) -> Manifest:
    (policy,) = [m for m in manifests if m["kind"] == "NetworkPolicy"
                 and _selects(m["spec"]["podSelector"], pod_labels)]
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}  # both ways denied but for the rules
    return policy


def test_the_operator_is_probed_on_its_health_port(render: Render) -> None:
    _, pod = _pod(render(), "Deployment", "-operator")
    container = pod["containers"][0]
    args = container["args"]
    assert args[args.index("--port") + 1] == "8081"
    assert container["ports"] == [{"name": "health", "containerPort": 8081, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["failureThreshold"] > container["readinessProbe"]["failureThreshold"]


def test_the_operator_probes_are_tunable(render: Render) -> None:
    _, pod = _pod(render(extra=("--set", "operator.port=9000", "--set", "operator.livenessProbe.initialDelaySeconds=20",
                                "--set", "operator.readinessProbe.periodSeconds=15")), "Deployment", "-operator")
    container = pod["containers"][0]
    assert container["args"][container["args"].index("--port") + 1] == "9000"
    assert container["ports"][0]["containerPort"] == 9000
    assert container["livenessProbe"]["initialDelaySeconds"] == 20
    assert container["readinessProbe"]["periodSeconds"] == 15


def test_every_component_has_a_policy_and_the_chart_still_talks_to_itself(render: Render) -> None:
    manifests = render(EVERYTHING)
    worker_labels, worker_pod = _pod(manifests, "Deployment", "-worker")
    operator_labels, _ = _pod(manifests, "Deployment", "-operator")
    postgres_labels, postgres_pod = _pod(manifests, "StatefulSet", "-postgresql")
    worker, operator, postgres = (_policy_of(manifests, labels)
                                  for labels in (worker_labels, operator_labels, postgres_labels))
    postgres_ports = {p["name"]: p["containerPort"] for p in postgres_pod["containers"][0]["ports"]}
    worker_ports = {p["name"]: p["containerPort"] for p in worker_pod["containers"][0]["ports"]}
    # Workers and the operator (and their migrate init containers) reach the bundled PostgreSQL, both ways.
    for labels, policy in ((worker_labels, worker), (operator_labels, operator)):
        assert _allows(policy, "egress", postgres_labels, 5432)
        assert _allows(postgres, "ingress", labels, 5432, postgres_ports)
        assert _allows(policy, "egress", {}, 53, address="10.96.0.10")  # DNS
    assert not _allows(postgres, "ingress", {"app": "something-else"}, 5432, postgres_ports)
    assert not postgres["spec"]["egress"]  # it calls nothing
    # The operator reaches the API server; it takes no connection at all (its probes come from the kubelet).
    assert _allows(operator, "egress", {}, 443, address="10.0.0.1")
    assert _allows(operator, "egress", {}, 6443, address="10.0.0.1")
    assert operator["spec"]["ingress"] == []
    # Workers reach the model APIs and MCP servers over HTTPS, and take their API from their namespace.
    assert _allows(worker, "egress", {}, 443, address="160.79.104.10")
    assert not _allows(worker, "egress", {}, 22, address="160.79.104.10")
    assert _allows(worker, "ingress", {"any": "pod"}, 8080, worker_ports)
    # Prometheus (prometheus-operator's labels) may scrape them from its namespace.
    from_rules = worker["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}} in from_rules


def test_policies_open_what_values_name(render: Render) -> None:
    ingress_ns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    manifests = render(extra=(
        "--set-json", f"networkPolicy.apiFrom=[{json.dumps(ingress_ns)}]",
        "--set-json", 'networkPolicy.egress.database={"cidrs": ["10.0.12.0/24"], "ports": [6432]}',
        "--set-json", 'networkPolicy.egress.models={"cidrs": ["10.1.0.0/16"], "ports": [443, 8000]}',
        "--set", "tracing.otlpEndpoint=http://otel-collector.observability:4318",
    ))
    worker = find(manifests, "NetworkPolicy", "-worker")["spec"]
    assert ingress_ns in worker["ingress"][0]["from"]
    egress = [({p["ipBlock"]["cidr"] for p in r.get("to", [])}, {p["port"] for p in r["ports"]}) for r in worker["egress"]]
    assert ({"10.0.12.0/24"}, {6432}) in egress  # the external database
    assert ({"10.1.0.0/16"}, {443, 8000}) in egress
    assert ({"0.0.0.0/0", "::/0"}, {4317, 4318}) in egress  # tracing, because an endpoint is set
    assert "NetworkPolicy" not in {m["kind"] for m in render(extra=("--set", "networkPolicy.enabled=false"))}


def test_no_secret_is_an_environment_value_by_default(render: Render) -> None:
    for values in CI_VALUES:
        for m in render(values):
            if m["kind"] in ("Deployment", "StatefulSet"):
                pod = m["spec"]["template"]["spec"]
                for container in pod["containers"] + pod.get("initContainers", []):
                    assert "secretKeyRef" not in repr(container.get("env", [])), (values.name, container["name"])
                    for mount in container["volumeMounts"]:
                        assert "subPath" not in mount  # only a directory mount sees a rotated Secret


def test_secrets_as_environment_variables_when_asked(render: Render) -> None:
    manifests = render(EVERYTHING, extra=("--set", "secrets.asFiles=false"))
    _, pod = _pod(manifests, "Deployment", "-worker")
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert "AGENTRUN_DATABASE_URL_FILE" not in env and "valueFrom" in env["AGENTRUN_DATABASE_URL"]
    assert secret_refs(pod, container)["OPENAI_API_KEY"] == ("agentrun-openai", "api-key")
    assert not {"secrets", "migration-secrets"} & {v["name"] for v in pod["volumes"]}
    _, postgres = _pod(manifests, "StatefulSet", "-postgresql")
    assert "POSTGRES_PASSWORD" in {e["name"] for e in postgres["containers"][0]["env"]}


def test_cloud_credentials_from_the_pods_identity_reach_the_metadata_endpoints(render: Render) -> None:
    def cidrs(*extra: str) -> set[str]:
        worker = find(render(extra=extra), "NetworkPolicy", "-worker")["spec"]
        return {p["ipBlock"]["cidr"] for r in worker["egress"] for p in r.get("to", []) if "ipBlock" in p}

    assert "169.254.169.254/32" not in cidrs()
    assert "169.254.169.254/32" in cidrs("--set", "providers.vertex.region=us-east5")  # GKE workload identity
    assert "169.254.170.23/32" in cidrs("--set", "providers.bedrock.region=eu-west-1")  # EKS Pod Identity
    # With a key Secret the credentials are in the pod: no metadata endpoint needed.
    assert "169.254.169.254/32" not in cidrs("--set", "providers.bedrock.region=eu-west-1",
                                             "--set", "providers.bedrock.existingSecret=aws-keys")
