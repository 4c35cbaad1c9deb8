"""Which Secret key feeds each secret variable of a rendered container, whether the chart hands it over as
a file (`<NAME>_FILE` into a projected volume, `secrets.asFiles`, the default) or as a `secretKeyRef`."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any


def secret_refs(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """{NAME: (secret, key)} for the container of `pod` (a pod spec): NAME without `_FILE`."""
    refs: dict[str, tuple[str, str]] = {}
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for env in container.get("env", []):
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            refs[env["name"]] = (ref["name"], ref["key"])
        elif env["name"].endswith("_FILE") and str(env.get("value", "")).startswith("/etc/agentrun-secrets/"):
            path = PurePosixPath(env["value"])
            volume = volumes[mounts[str(path.parent)]]
            found = [(source["secret"]["name"], item["key"]) for source in volume["projected"]["sources"]
                     for item in source["secret"]["items"] if item["path"] == path.name]
            assert len(found) == 1, (env, volume)
            refs[env["name"].removesuffix("_FILE")] = found[0]
    return refs
