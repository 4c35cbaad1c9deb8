"""The few Kubernetes API calls the operator makes outside kopf's handlers: status patches, Events and
TTL deletions, through the official client (run in threads, since it is synchronous)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from agentrun.operator.errors import KubeError as KubeError
from agentrun.operator.mapping import GROUP, KIND, PLURAL, VERSION

log = logging.getLogger("agentrun.operator.kube")

MERGE_PATCH = "application/merge-patch+json"


class KubeApi:
    def __init__(self, client: kubernetes.client.ApiClient, component: str = "agentrun-operator") -> None:
        self.client = client
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.core = kubernetes.client.CoreV1Api(client)
        self.component = component

    @classmethod
    def from_environment(cls) -> KubeApi:
        """In a pod: its service account; elsewhere: the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
        config = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=config)
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=config)
        return cls(kubernetes.client.ApiClient(config))

    @classmethod
    def for_host(cls, host: str) -> KubeApi:
        """An unauthenticated client for a plain-HTTP API server (tests, `kubectl proxy`)."""
        config = kubernetes.client.Configuration(host=host.rstrip("/"))
        return cls(kubernetes.client.ApiClient(config))

    def close(self) -> None:
        self.client.close()

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """Merge-patch an AgentRun's status; False if the resource is gone."""
        return await self._call(
            self.custom.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, PLURAL, name, {"status": patch}, _content_type=MERGE_PATCH,
        )

    async def delete(self, namespace: str, name: str) -> bool:
        return await self._call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)

    async def event(
        self, namespace: str, name: str, uid: uuid.UUID | str, type_: str, reason: str, message: str,
        *, strict: bool = False,
    ) -> None:
        """Post a core/v1 Event about an AgentRun. A failure is logged; with `strict`, a transient one is
        raised as KubeError for the caller to retry (a refusal would be refused again: logged only)."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "namespace": namespace, "name": name,
                "uid": str(uid),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],  # the API server caps it; a long error is in the status anyway
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": now,
            "action": reason,
            "count": 1,
        }
        try:
            await self._call(self.core.create_namespaced_event, namespace, body)
        except KubeError as e:
            if strict and e.transient:
                raise
            log.warning("could not post event %s for %s/%s: %s", reason, namespace, name, e)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> bool:
        try:
            await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as e:
            if e.status == 404:
                return False
            raise KubeError(f"{e.status} {e.reason}: {str(e.body)[:300]}", e.status) from e
        except (OSError, urllib3.exceptions.HTTPError) as e:
            raise KubeError(str(e)) from e
        return True
