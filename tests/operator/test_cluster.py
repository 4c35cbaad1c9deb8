"""Against a real cluster: the CRD is accepted by the API server. Runs only when KUBECONFIG is set."""

from __future__ import annotations

import os
import pathlib

import pytest
import yaml

pytestmark = pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a Kubernetes cluster (KUBECONFIG)")

CRD = pathlib.Path(__file__).resolve().parents[2] / "crds" / "agentrun.yaml"


def test_api_server_accepts_the_crd_and_rejects_a_bad_agentrun() -> None:
    import kubernetes

    kubernetes.config.load_kube_config()
    client = kubernetes.client.ApiClient()
    ext = kubernetes.client.ApiextensionsV1Api(client)
    body = yaml.safe_load(CRD.read_text())
    # Server-side dry run: validates the structural schema and compiles the CEL rules, changes nothing.
    ext.create_custom_resource_definition(body, dry_run="All")
    custom = kubernetes.client.CustomObjectsApi(client)
    try:
        custom.create_namespaced_custom_object(
            "agentrun.dev", "v1alpha1", "default", "agentruns",
            {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "bad"},
             "spec": {"input": ""}},
            dry_run="All",
        )
    except kubernetes.client.ApiException as e:
        assert e.status in (404, 422)  # 404 when the CRD is not installed in this cluster
    else:
        pytest.fail("an empty input was accepted")
