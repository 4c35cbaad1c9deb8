"""kmock's KubernetesEmulator with the API-server behaviour kopf relies on, which it lacks (kmock 0.8).

- the core and CRD resources kopf discovers are declared (it waits for them forever otherwise);
- objects get uid, resourceVersion, generation and creationTimestamp, and every write a new version;
- JSON patches are applied, and a failing `test` op answers 422 (kopf's finalizer patches rely on it);
- writes to the `status` subresource change only the status, other writes never change it;
- a watch resumes after `?resourceVersion=` and never loses events written while it starts;
- POST answers 201, names `generateName` objects, and namespaces namespaced ones;
- the AgentRun and Agent resources are declared from crds/, and every write to one is pruned, defaulted
  and validated against its structural schema and CEL rules (tests/operator/schema.py): 422 Invalid.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import hashlib
import json
import pathlib
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import jsonpatch
import kmock
import yaml
from kmock._internal import aiobus, enums, rendering

from tests.operator.schema import Invalid, Schema

CRD_FILE = pathlib.Path(__file__).resolve().parents[2] / "crds" / "agentrun.yaml"
AGENT_CRD_FILE = CRD_FILE.with_name("agent.yaml")
SCHEDULE_CRD_FILE = CRD_FILE.with_name("agentschedule.yaml")
AGENTRUNS = "agentrun.dev/v1alpha1/agentruns"


@attrs.frozen
class CustomResource:
    """A served version of a CRD: what discovery, validation and table output need of it."""

    crd: dict[str, Any]
    version: dict[str, Any]
    schema: Schema

    @classmethod
    def load(cls, path: pathlib.Path = CRD_FILE) -> CustomResource:
        crd = yaml.safe_load(path.read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
        return cls(crd, version, Schema(version["schema"]["openAPIV3Schema"]))

    @property
    def names(self) -> dict[str, Any]:
        return self.crd["spec"]["names"]  # type: ignore[no-any-return]

    @property
    def key(self) -> str:
        return f"{self.crd['spec']['group']}/{self.version['name']}/{self.names['plural']}"

    def info(self) -> kmock.ResourceInfo:
        return kmock.ResourceInfo(
            kind=self.names["kind"], singular=self.names.get("singular"),
            namespaced=self.crd["spec"]["scope"] == "Namespaced", verbs=_VERBS,
            shortnames=set(self.names.get("shortNames") or ()), categories=set(self.names.get("categories") or ()),
            subresources=set(self.version.get("subresources") or ()),
        )

    def openapi(self) -> dict[str, Any]:
        """The group-version's OpenAPI v3 document, as an API server publishes it for a CRD."""
        group, version, kind = self.crd["spec"]["group"], self.version["name"], self.names["kind"]
        prefix = ".".join(reversed(group.split("."))) + f".{version}"
        gvk = [{"group": group, "version": version, "kind": kind}]
        schema = copy.deepcopy(self.version["schema"]["openAPIV3Schema"])
        schema["x-kubernetes-group-version-kind"] = gvk
        listing = {
            "type": "object", "required": ["items"], "x-kubernetes-group-version-kind": [
                {"group": group, "version": version, "kind": self.names.get("listKind") or f"{kind}List"}],
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                           "metadata": {"type": "object"},
                           "items": {"type": "array", "items": {"$ref": f"#/components/schemas/{prefix}.{kind}"}}},
        }
        # One path is enough for kubectl: its PATCH declares `fieldValidation`, so kubectl leaves the
        # validation to the server (Strict: unknown fields refused) instead of looking for OpenAPI v2.
        plural = self.names["plural"]
        scope = "namespaces/{namespace}/" if self.crd["spec"]["scope"] == "Namespaced" else ""
        patch = {
            "x-kubernetes-group-version-kind": gvk[0], "operationId": f"patch{kind}",
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}],
            "responses": {"200": {"description": "OK", "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{prefix}.{kind}"}}}}},
        }
        return {
            "openapi": "3.0.0", "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
            "paths": {f"/apis/{group}/{version}/{scope}{plural}/{{name}}": {"patch": patch}},
            "components": {"schemas": {f"{prefix}.{kind}": schema, f"{prefix}.{kind}List": listing}},
        }

    def table(self, objects: list[dict[str, Any]], version: str, include: str | None) -> dict[str, Any]:
        """A meta.k8s.io/v1 Table of `objects`, with the CRD's additionalPrinterColumns, as `kubectl get`
        asks for it: the server formats the cells, kubectl prints them (those of priority > 0 with -o wide)."""
        columns = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
                    "description": "Name must be unique within a namespace."}]
        printer = self.version.get("additionalPrinterColumns") or []
        columns += [{"name": c["name"], "type": c["type"], "format": c.get("format", ""),
                     "description": c.get("description", ""), "priority": c.get("priority", 0)} for c in printer]
        rows = []
        for obj in objects:
            cells: list[Any] = [obj["metadata"]["name"]]
            cells += [_cell(_json_path(obj, c["jsonPath"]), c["type"]) for c in printer]
            shown: dict[str, Any] = (
                obj if include == "Object" else
                {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
            )
            rows.append({"cells": cells, "object": shown if include != "None" else None})
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": version},
                "columnDefinitions": columns, "rows": rows}

    def admit(self, new: dict[str, Any], old: dict[str, Any] | None, strict: bool = False) -> dict[str, Any]:
        """`new` as stored (pruned, defaulted); 422 Invalid naming every problem, or with `strict`
        (`?fieldValidation=Strict`, which kubectl sends) 400 for a field the schema does not declare."""
        if strict and (unknown := self.schema.unknown_fields(new)):
            raise kmock.KubernetesError(400, "BadRequest", "strict decoding error: " + ", ".join(
                f'unknown field "{field}"' for field in unknown))
        try:
            return self.schema.admit(new, old)
        except Invalid as e:
            name = (new.get("metadata") or {}).get("name") or ""
            kind, group = self.names["kind"], self.crd["spec"]["group"]
            causes = e.causes[0] if len(e.causes) == 1 else "[" + ", ".join(e.causes) + "]"
            raise kmock.KubernetesError(422, "Invalid", f'{kind}.{group} "{name}" is invalid: {causes}', {
                "name": name, "group": group, "kind": kind,
                "causes": [{"reason": "FieldValueInvalid", "message": c, "field": c.split(":", 1)[0]}
                           for c in e.causes],
            }) from None


@attrs.mutable(weakref_slot=True)
class RecordingBus(aiobus.Bus[Any]):
    """A bus that remembers every event with its resourceVersion, for watches that resume."""

    stamp: Callable[[], str] = attrs.field(default=lambda: "0")
    history: list[tuple[int, Any]] = attrs.field(factory=list)

    async def put(self, item: Any) -> None:
        if item.get("type") == "DELETED":
            # A deletion is a change of its own: it gets a version newer than the object's last one.
            item = copy.deepcopy(item)
            item["object"].setdefault("metadata", {})["resourceVersion"] = self.stamp()
        # A copy: the stored object changes in place with later writes, and a resumed watch must replay
        # each version as it was.
        self.history.append((int(item["object"]["metadata"]["resourceVersion"]), copy.deepcopy(item)))
        await super().put(item)


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    custom: tuple[CustomResource, ...] = attrs.field(
        factory=lambda: (CustomResource.load(), CustomResource.load(AGENT_CRD_FILE),
                         CustomResource.load(SCHEDULE_CRD_FILE)))
    _version: int = attrs.field(default=0, init=False)
    _writes: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    _buses: dict[Any, RecordingBus] = attrs.field(
        init=False,
        default=attrs.Factory(lambda self: collections.defaultdict(lambda: RecordingBus(stamp=self._stamp)), takes_self=True),
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=_VERBS)
        self.resources["v1/events"] = kmock.ResourceInfo(kind="Event", namespaced=True, verbs=_VERBS)
        self.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
            kind="CustomResourceDefinition", namespaced=False, verbs=_VERBS
        )
        for custom in self.custom:
            self.resources[custom.key] = custom.info()
        self.fallback["get", re.compile(r"/openapi/v3/apis/[^/]+/[^/]+")] << self._serve_openapi_group
        self.fallback["get /openapi/v3"] << self._serve_openapi_index

    def _stamp(self) -> str:
        self._version += 1
        return str(self._version)

    # -- writes --------------------------------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is None or request.action not in _WRITES:
            return await super()._handle(request)
        # One write at a time, from reading the object to publishing its event, like etcd's revisions.
        async with self._writes:
            if request.action == enums.action.CREATE:
                request = self._creating(request)
            elif request.action == enums.action.UPDATE:
                request = self._patching(request)
            elif request.action == enums.action.DELETE:
                await self._deleting(request)
            return await super()._handle(request)

    def _creating(self, request: rendering.Request) -> rendering.Request:
        body = copy.deepcopy(request.data or {})
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        meta.update(
            uid=str(uuid.uuid4()), resourceVersion=self._stamp(), generation=1,
            creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        if self._has_status(request):
            body.pop("status", None)
        if (custom := self._custom(request)) is not None:
            body = custom.admit(body, None, _strict(request))
        return _with_data(request, body)

    def _patching(self, request: rendering.Request) -> rendering.Request:
        obj = self._find(request)
        if obj is None:
            return request  # the emulator answers 404
        old = copy.deepcopy(obj.raw)
        if isinstance(request.data, list):
            try:
                new = jsonpatch.apply_patch(old, request.data)
            except jsonpatch.JsonPatchTestFailed as e:
                raise kmock.KubernetesError(422, "Invalid", f"the patch test failed: {e}") from None
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise kmock.KubernetesError(422, "Invalid", f"bad JSON patch: {e}") from None
        else:
            new = _merged(old, request.data or {})
        if self._has_status(request):
            if request.subresource == "status":
                new = {**old, "status": new.get("status")} if "status" in new else {k: v for k, v in old.items() if k != "status"}
            elif "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        new = copy.deepcopy(new)  # it may share dicts with `old`, which the diff below compares it with
        if (custom := self._custom(request)) is not None:
            new = custom.admit(new, old, _strict(request))
        meta = new.setdefault("metadata", {})
        meta["resourceVersion"] = self._stamp()
        if new.get("spec") != old.get("spec"):
            meta["generation"] = int(old.get("metadata", {}).get("generation") or 1) + 1
        return _with_data(request, _diff(old, new))

    async def _deleting(self, request: rendering.Request) -> None:
        obj = self._find(request)
        if obj is None or obj.get("metadata", {}).get("deletionTimestamp"):
            return
        if obj.get("metadata", {}).get("finalizers"):
            # Marked, not deleted: the finalizers' owners get a MODIFIED event with a new version.
            async with self._lock:
                obj.patch({"metadata": {
                    "deletionTimestamp": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "resourceVersion": self._stamp(),
                }})
                assert request.resource is not None
                await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})

    def _find(self, request: rendering.Request) -> Any:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects:
            return None
        obj = self.objects[key]
        return None if obj.deleted else obj

    # -- OpenAPI v3, from the CRDs' schemas (kubectl validates what it applies against it) -------------

    def _openapi_documents(self) -> dict[str, dict[str, Any]]:
        """One OpenAPI document per group-version, holding every kind of it (AgentRun and Agent share one)."""
        docs: dict[str, dict[str, Any]] = {}
        for custom in self.custom:
            group_version = custom.key.rsplit("/", 1)[0]
            doc = custom.openapi()
            if group_version in docs:
                docs[group_version]["paths"].update(doc["paths"])
                docs[group_version]["components"]["schemas"].update(doc["components"]["schemas"])
            else:
                docs[group_version] = doc
        return docs

    async def _serve_openapi_index(self, request: rendering.Request) -> Any:
        paths = {}
        for group_version, doc in self._openapi_documents().items():
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
            paths[f"apis/{group_version}"] = {"serverRelativeURL": f"/openapi/v3/apis/{group_version}?hash={digest}"}
        return {"paths": paths}

    async def _serve_openapi_group(self, request: rendering.Request) -> Any:
        wanted = request.url.path.removeprefix("/openapi/v3/apis/")
        doc = self._openapi_documents().get(wanted)
        if doc is None:
            raise kmock.KubernetesError(404, "NotFound", f"no OpenAPI document for {wanted}")
        return doc

    def _custom(self, request: rendering.Request) -> CustomResource | None:
        for custom in self.custom:
            if request.resource == kmock.resource(custom.key):
                return custom
        return None

    def _has_status(self, request: rendering.Request) -> bool:
        info = self.resources.get(request.resource)  # type: ignore[call-overload]
        return info is not None and "status" in info.subresources

    async def _serve_create(self, request: rendering.Request) -> Any:
        return rendering.Response(status=201, payload=await super()._serve_create(request))

    # -- reads ---------------------------------------------------------------------------------------

    async def _serve_list(self, request: rendering.Request) -> Any:
        version = str(self._version)  # taken first: a later write is then replayed, never missed
        listing = await super()._serve_list(request)
        listing["metadata"]["resourceVersion"] = version
        assert request.resource is not None
        info = self.resources.get(request.resource)  # type: ignore[call-overload]
        group_version = f"{request.resource.group}/{request.resource.version}".lstrip("/")
        listing = {"apiVersion": group_version, "kind": f"{info.kind if info else 'Unknown'}List", **listing}
        if (custom := self._custom(request)) is not None and _wants_table(request):
            return custom.table(listing["items"], version, request.params.get("includeObject"))
        return listing

    async def _serve_fetch(self, request: rendering.Request) -> Any:
        obj = await super()._serve_fetch(request)
        if (custom := self._custom(request)) is not None and _wants_table(request):
            return custom.table([obj], obj["metadata"]["resourceVersion"], request.params.get("includeObject"))
        return obj

    async def _serve_version(self, request: rendering.Request) -> Any:
        listing = await super()._serve_version(request)
        for resource in listing["resources"]:
            if "/" in resource["name"]:  # a subresource: only its parent has short names and categories
                resource.update(shortNames=[], categories=[], verbs=["get", "patch", "update"])
        return listing

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        yield b""  # send the headers now
        assert request.resource is not None
        bus = self._buses[request.resource]
        since = _int(request.params.get("resourceVersion"))
        async with self._lock:  # writes publish under it: the backlog and the live stream meet exactly
            mark = await bus.mark()
            if since is None:
                backlog = [{"type": "ADDED", "object": copy.deepcopy(o.raw)} for key, o in self.objects.items()
                           if key[0] == request.resource and not o.deleted]
            else:
                backlog = [event for version, event in bus.history if version > since]
        try:
            for event in backlog:
                if _matches(request, event):
                    yield event
            async for event in bus.stream(since=mark):
                if _matches(request, event):
                    yield event
        finally:
            await bus.unmark(mark)


_VERBS = {"create", "delete", "get", "list", "patch", "update", "watch"}
_WRITES = {enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE}


def _json_path(obj: Any, path: str) -> Any:
    """A printer column's simple JSONPath (`.status.phase`): the value there, or None."""
    for key in path.strip(".").split("."):
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _cell(value: Any, type_: str) -> Any:
    if value is None:
        return None  # kubectl shows <none>
    if type_ == "date" and isinstance(value, str):
        try:
            then = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        return human_duration(datetime.datetime.now(datetime.UTC) - then)
    if type_ == "string" and not isinstance(value, str):
        return json.dumps(value)
    return value


def human_duration(d: datetime.timedelta) -> str:
    """How Kubernetes shows an age (apimachinery's duration.HumanDuration)."""
    seconds = int(d.total_seconds())
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d" if days < 365 * 8 else f"{days // 365}y"


def _with_data(request: rendering.Request, data: Any) -> rendering.Request:
    # Requests are frozen, and a copy (attrs.evolve) no longer matches kmock's fallback reactions.
    object.__setattr__(request, "data", data)
    return request


def _wants_table(request: rendering.Request) -> bool:
    """`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`, as kubectl get asks (first choice)."""
    accept = request.headers.get("Accept") or request.headers.get("accept") or ""
    first = accept.split(",")[0]
    params = dict(part.strip().partition("=")[::2] for part in first.split(";")[1:])
    return params.get("as") == "Table" and params.get("g") == "meta.k8s.io"


def _strict(request: rendering.Request) -> bool:
    return request.params.get("fieldValidation") == "Strict"


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _matches(request: rendering.Request, event: Any) -> bool:
    meta = event.get("object", {}).get("metadata", {})
    return (request.namespace is None or meta.get("namespace") == request.namespace) and (
        request.name is None or meta.get("name") == request.name
    )


def _merged(old: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch."""
    out = dict(old)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        elif isinstance(value, dict):
            out[key] = _merged({}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The merge patch from `old` to `new`, for the emulator's own (merge-only) storage."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            sub = _diff(old[key], value)
            if sub:
                patch[key] = sub
        elif key not in old or old[key] != value:
            patch[key] = value
    return patch
