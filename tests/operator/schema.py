"""What an API server does with a CRD's structural schema on every write, for the emulator: prune unknown
fields, apply defaults, validate (types, required, bounds, enums, patterns, lengths, sets, formats) and
evaluate the `x-kubernetes-validations` CEL rules, transition rules (`oldSelf`) included."""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Iterator
from typing import Any

import celpy

# RFC 3339, as kube-openapi's date-time format accepts it.
DATE_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", re.IGNORECASE)
# Where the API server takes over from the schema: never pruned, validated by its own rules.
SERVER_OWNED = ("apiVersion", "kind", "metadata")


class Invalid(ValueError):
    """The object breaks its schema; `causes` are Kubernetes-style "field: problem" lines."""

    def __init__(self, causes: list[str]) -> None:
        super().__init__("; ".join(causes))
        self.causes = causes


class Schema:
    """One version's openAPIV3Schema, with its CEL rules compiled once."""

    def __init__(self, openapi: dict[str, Any]) -> None:
        self.root = openapi
        self._env = celpy.Environment()
        self._programs: dict[str, Any] = {}
        for node in _nodes(openapi):
            for rule in node.get("x-kubernetes-validations") or ():
                # A rule that does not compile is refused when the CRD is applied: here, at load.
                self._programs[rule["rule"]] = self._env.program(self._env.compile(rule["rule"]))

    def unknown_fields(self, obj: dict[str, Any]) -> list[str]:
        """The fields the schema does not declare, which admitting `obj` would drop."""
        return _prune(copy.deepcopy(obj), self.root, top=True)

    def admit(self, new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """The object as stored: pruned and defaulted; raises Invalid listing every problem."""
        obj = copy.deepcopy(new)
        _prune(obj, self.root, top=True)
        _default(obj, self.root)
        # The rules see typed, in-bounds values only (an API server does not run them on a value that
        # failed its schema: an integer past int64 could not even be decoded).
        causes = list(self._validate(obj, self.root, "")) or self._rules(obj, old, self.root, "", old is not None)
        if causes:
            raise Invalid(causes)
        return obj

    # -- the OpenAPI part --------------------------------------------------------------------------

    def _validate(self, value: Any, schema: dict[str, Any], path: str) -> Iterator[str]:
        where = path or "<root>"
        expected = schema.get("type")
        if expected and not _is(value, expected):
            yield f'{where}: Invalid value: "{_kind(value)}": {where} in body must be of type {expected}: "{_kind(value)}"'
            return
        if "enum" in schema and value not in schema["enum"]:
            choices = ", ".join(f'"{c}"' for c in schema["enum"])
            yield f"{where}: Unsupported value: {_show(value)}: supported values: {choices}"
        if isinstance(value, str):
            yield from self._string(value, schema, where)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, int) and not -(2**63) <= value < 2**63:
                yield f"{where}: Invalid value: {value}: {where} in body must fit in int64"
                return
            yield from _number(value, schema, where)
        elif isinstance(value, list):
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                yield f"{where}: Too many: {len(value)}: must have at most {schema['maxItems']} items"
            if "minItems" in schema and len(value) < schema["minItems"]:
                yield f"{where}: Invalid value: {len(value)}: {where} in body should have at least {schema['minItems']} items"
            if schema.get("x-kubernetes-list-type") == "set":
                seen: list[Any] = []
                for i, item in enumerate(value):
                    if item in seen:
                        yield f"{where}[{i}]: Duplicate value: {_show(item)}"
                    seen.append(item)
            items = schema.get("items")
            if items:
                for i, item in enumerate(value):
                    yield from self._validate(item, items, f"{where}[{i}]")
        elif isinstance(value, dict):
            for name in schema.get("required") or ():
                if name not in value:
                    yield f"{_join(path, name)}: Required value"
            for name, sub in (schema.get("properties") or {}).items():
                if name in value and not (not path and name in SERVER_OWNED):
                    yield from self._validate(value[name], sub, _join(path, name))

    def _string(self, value: str, schema: dict[str, Any], where: str) -> Iterator[str]:
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield f"{where}: Too long: may not be more than {schema['maxLength']} bytes"
        if "minLength" in schema and len(value) < schema["minLength"]:
            yield f'{where}: Invalid value: "{value[:40]}": {where} in body should be at least {schema["minLength"]} chars long'
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield f'{where}: Invalid value: "{value[:40]}": {where} in body should match \'{schema["pattern"]}\''
        if schema.get("format") == "date-time" and not _date_time(value):
            yield f'{where}: Invalid value: "{value[:40]}": {where} in body must be of type date-time: "{value[:40]}"'

    # -- the CEL part ------------------------------------------------------------------------------

    def _rules(self, value: Any, old: Any, schema: dict[str, Any], path: str, has_old: bool) -> list[str]:
        causes = []
        where = path or "<root>"
        for rule in schema.get("x-kubernetes-validations") or ():
            text = rule["rule"]
            activation = {"self": celpy.json_to_cel(value)}
            if "oldSelf" in text:
                if not has_old:
                    continue  # a transition rule only runs on an update that has the old value
                activation["oldSelf"] = celpy.json_to_cel(old)
            result = self._programs[text].evaluate(activation)
            if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
                message = rule.get("message") or f"failed rule: {text}"
                if isinstance(result, celpy.CELEvalError):
                    message = f"{message} (evaluation error: {result.args[0] if result.args else result})"
                causes.append(f"{where}: Invalid value: \"object\": {message}")
        if isinstance(value, dict):
            for name, sub in (schema.get("properties") or {}).items():
                if name in value and not (not path and name in SERVER_OWNED):
                    in_old = has_old and isinstance(old, dict) and name in old
                    causes += self._rules(value[name], old[name] if in_old else None, sub, _join(path, name), in_old)
        elif isinstance(value, list) and schema.get("items"):
            for i, item in enumerate(value):
                # Items are matched by position only for atomic lists of scalars; transition rules
                # on items are not used by this CRD, so they get no old value.
                causes += self._rules(item, None, schema["items"], f"{where}[{i}]", False)
        return causes


def _nodes(schema: Any) -> Iterator[dict[str, Any]]:
    if isinstance(schema, dict):
        yield schema
        for sub in (schema.get("properties") or {}).values():
            yield from _nodes(sub)
        if "items" in schema:
            yield from _nodes(schema["items"])


def _prune(value: Any, schema: dict[str, Any], top: bool = False, path: str = "") -> list[str]:
    """Drop fields the schema does not declare, as a structural schema's API server does; returns them."""
    dropped = []
    if isinstance(value, dict) and schema.get("type") == "object" and "properties" in schema:
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return []
        props = schema["properties"]
        for name in list(value):
            if top and name in SERVER_OWNED:
                continue
            if name not in props:
                del value[name]
                dropped.append(_join(path, name))
            else:
                dropped += _prune(value[name], props[name], path=_join(path, name))
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            dropped += _prune(item, schema["items"], path=f"{path}[{i}]")
    return dropped


def _default(value: Any, schema: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _default(value[name], sub)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default(item, schema["items"])


def _is(value: Any, expected: str) -> bool:
    if expected == "object":
        return isinstance(value, dict)
    if expected == "array":
        return isinstance(value, list)
    if expected == "string":
        return isinstance(value, str)
    if expected == "boolean":
        return isinstance(value, bool)
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def _number(value: float, schema: dict[str, Any], where: str) -> Iterator[str]:
    if "minimum" in schema:
        low = schema["minimum"]
        if schema.get("exclusiveMinimum") and not value > low:
            yield f"{where}: Invalid value: {_show(value)}: {where} in body should be greater than {low}"
        elif not value >= low:
            yield f"{where}: Invalid value: {_show(value)}: {where} in body should be greater than or equal to {low}"
    if "maximum" in schema:
        high = schema["maximum"]
        if schema.get("exclusiveMaximum") and not value < high:
            yield f"{where}: Invalid value: {_show(value)}: {where} in body should be less than {high}"
        elif not value <= high:
            yield f"{where}: Invalid value: {_show(value)}: {where} in body should be less than or equal to {high}"


def _date_time(text: str) -> bool:
    if not DATE_TIME.fullmatch(text):
        return False
    try:
        datetime.datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
