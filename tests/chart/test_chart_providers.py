"""The chart's model providers: the providers file, regions and project, and credentials from Secrets only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrun.worker.llm.providers import Providers
from tests.chart.secret_refs import secret_refs
from tests.support.chart import CHART, find

Render = Callable[..., list[dict[str, Any]]]
EVERYTHING = CHART / "ci" / "everything-keda-values.yaml"


def _worker(manifests: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = find(manifests, "Deployment", "-worker")["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "worker")


def test_the_providers_file_is_what_the_worker_reads(render: Render) -> None:
    manifests = render(EVERYTHING)
    config = find(manifests, "ConfigMap", "-config")["data"]
    assert config["AGENTRUN_PROVIDERS"] == "/etc/agentrun-providers/providers.json"
    text = find(manifests, "ConfigMap", "-providers")["data"]["providers.json"]
    providers = Providers.parse(text)  # the worker's own parser accepts what the chart renders
    assert providers.names == ("anthropic", "bedrock", "vertex", "vllm", "openai")
    assert providers.endpoints["openai"].api_key_env == "OPENAI_API_KEY"
    assert providers.endpoints["openai"].headers == {"OpenAI-Organization": "org-123"}
    pod, worker = _worker(manifests)
    mount = next(m for m in worker["volumeMounts"] if m["name"] == "providers")
    assert mount["mountPath"] == "/etc/agentrun-providers" and mount["readOnly"]
    volume = next(v for v in pod["volumes"] if v["name"] == "providers")
    assert volume["configMap"]["name"].endswith("-providers")


def test_cloud_settings_and_credentials_come_from_values_and_secrets(render: Render) -> None:
    manifests = render(EVERYTHING)
    config = find(manifests, "ConfigMap", "-config")["data"]
    assert config["AWS_REGION"] == "eu-west-1"
    assert (config["CLOUD_ML_REGION"], config["ANTHROPIC_VERTEX_PROJECT_ID"]) == ("us-east5", "agentrun-demo")
    assert config["GOOGLE_APPLICATION_CREDENTIALS"] == "/var/run/secrets/agentrun/gcp/key.json"
    pod, worker = _worker(manifests)
    refs = secret_refs(pod, worker)
    assert refs["OPENAI_API_KEY"] == ("agentrun-openai", "api-key")
    assert refs["AWS_ACCESS_KEY_ID"] == ("agentrun-aws", "access-key-id")
    assert refs["AWS_SECRET_ACCESS_KEY"] == ("agentrun-aws", "secret-access-key")
    key = next(v for v in pod["volumes"] if v["name"] == "gcp-key")
    assert key["secret"] == {"secretName": "agentrun-gcp-key", "items": [{"key": "key.json", "path": "key.json"}]}
    assert {"name": "gcp-key", "mountPath": "/var/run/secrets/agentrun/gcp", "readOnly": True} in worker["volumeMounts"]


def test_defaults_configure_no_provider_and_no_credential(render: Render) -> None:
    manifests = render()
    config = find(manifests, "ConfigMap", "-config")["data"]
    for var in ("AGENTRUN_PROVIDERS", "AWS_REGION", "CLOUD_ML_REGION", "GOOGLE_APPLICATION_CREDENTIALS"):
        assert var not in config
    assert not [m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-providers")]
    pod, worker = _worker(manifests)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(secret_refs(pod, worker))


def test_a_prefixed_default_model_and_workload_identity_annotations(render: Render, tmp_path: Path) -> None:
    values = tmp_path / "bedrock-irsa.yaml"
    values.write_text("""
config:
  defaultModel: bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0
providers:
  bedrock: {region: us-east-1}
worker:
  serviceAccount:
    annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::123456789012:role/agentrun-bedrock"}
""")
    manifests = render(values)
    config = find(manifests, "ConfigMap", "-config")["data"]
    assert config["AGENTRUN_DEFAULT_MODEL"] == "bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    assert config["AWS_REGION"] == "us-east-1"
    account = find(manifests, "ServiceAccount", "-worker")
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith("role/agentrun-bedrock")
