"""The chart wires least privilege: the migrate init containers alone get the owner role's Secret, the
workers and the operator the runtime role's; named API identities are mounted where the workers read
them, as a directory so that rotation reaches the pods without a restart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrun.worker.api.identities import Scope, parse
from tests.chart.secret_refs import secret_refs
from tests.support.chart import CHART, CI_VALUES, Manifest, find, run_helm

Render = Callable[..., list[Manifest]]
LEAST = next(p for p in CI_VALUES if p.stem == "least-privilege-values")


def _pods(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"].rsplit("-", 1)[-1]: m["spec"]["template"]["spec"]
            for m in manifests if m["kind"] == "Deployment"}


def _database_secret(pod: dict[str, Any], container: dict[str, Any]) -> tuple[str, str]:
    return secret_refs(pod, container)["AGENTRUN_DATABASE_URL"]


def test_migrations_run_as_the_owner_and_everything_else_as_the_runtime_role(render: Render) -> None:
    manifests = render(LEAST)
    pods = _pods(manifests)
    assert set(pods) == {"worker", "operator"}
    for name, pod in pods.items():
        (migrate,) = pod["initContainers"]
        assert migrate["args"] == ["migrate"], name
        assert _database_secret(pod, migrate) == ("agentrun-owner", "owner-url"), name
        assert [e["name"] for e in migrate["env"]] == ["AGENTRUN_DATABASE_URL_FILE"], name  # nothing else secret
        main = pod["containers"][0]
        assert _database_secret(pod, main) == ("agentrun-runtime", "url"), name
        # The owner's URL is a volume of the init container's own, which the main container does not mount.
        assert "migration-secrets" not in {m["name"] for m in main["volumeMounts"]}, name
        assert "--no-migrate" in main["args"], name  # the runtime role could not migrate anyway
        assert migrate["resources"] == main["resources"], name  # the pod asks for no more than it did
    # The owner's Secret is named by the init containers and nowhere else.
    elsewhere = [m for m in manifests if m["kind"] != "Deployment"] + [p["containers"] for p in pods.values()]
    assert "agentrun-owner" not in repr(elsewhere)


def test_without_a_migration_secret_migrations_use_the_runtime_url(render: Render) -> None:
    pods = _pods(render())
    for name, pod in pods.items():
        assert _database_secret(pod, pod["initContainers"][0]) == ("agentrun-database", "url"), name
        assert _database_secret(pod, pod["containers"][0]) == ("agentrun-database", "url"), name


def test_identities_are_rendered_into_a_secret_the_workers_read(render: Render) -> None:
    manifests = render(LEAST)
    secret = find(manifests, "Secret", "-api-tokens")
    text = secret["stringData"]["tokens.yaml"]
    identities = parse(text, "rendered")
    assert [(i.name, i.scopes) for i, _ in identities] == [
        ("alice", frozenset({Scope.READ, Scope.DECIDE})), ("ci-bot", frozenset({Scope.SUBMIT, Scope.READ}))]
    worker = find(manifests, "Deployment", "-worker")
    pod = worker["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    path = env["AGENTRUN_API_TOKENS"]["value"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "api-tokens")
    assert "subPath" not in mount and mount["readOnly"] is True  # a subPath mount never sees updates
    assert path == f"{mount['mountPath']}/tokens.yaml"
    volume = next(v for v in pod["volumes"] if v["name"] == "api-tokens")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    # Rotation without a restart: no checksum rolls the pods when the identities change.
    annotations = worker["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == {"checksum/config", "checksum/api-token"}
    # The shared bearer token stays, as the identity `default`.
    assert "AGENTRUN_API_TOKEN" in secret_refs(pod, container)
    # The operator needs no API identities.
    operator = find(manifests, "Deployment", "-operator")["spec"]["template"]["spec"]
    assert "AGENTRUN_API_TOKENS" not in repr(operator)


def test_an_existing_tokens_secret_is_mounted_and_none_rendered(render: Render) -> None:
    manifests = render(extra=("--set", "apiTokens.existingSecret=team-tokens", "--set", "apiTokens.secretKey=ids.json"))
    assert not [m for m in manifests if m["kind"] == "Secret" and m["metadata"]["name"].endswith("-api-tokens")]
    pod = find(manifests, "Deployment", "-worker")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["AGENTRUN_API_TOKENS"]["value"].endswith("/ids.json")
    assert next(v for v in pod["volumes"] if v["name"] == "api-tokens")["secret"]["secretName"] == "team-tokens"


def test_defaults_mount_no_tokens_file(render: Render) -> None:
    manifests = render()
    pod = find(manifests, "Deployment", "-worker")["spec"]["template"]["spec"]
    assert "AGENTRUN_API_TOKENS" not in repr(pod) and "api-tokens" not in repr(pod["volumes"])


def test_the_schema_refuses_bad_identities(helm: str) -> None:
    base = ["--set", "apiTokens.identities[0].name=alice"]
    sha = "apiTokens.identities[0].sha256=" + "ab" * 32
    cases = [
        ([*base, "--set", "apiTokens.identities[0].sha256=agrt_a-token-pasted-here", "--set",
          "apiTokens.identities[0].scopes={read}"], "/apiTokens/identities/0/sha256"),
        ([*base, "--set", sha, "--set", "apiTokens.identities[0].scopes={fly}"], "/apiTokens/identities/0/scopes/0"),
        ([*base, "--set", sha], "scopes"),
        (["--set", "database.migrationSecret=Not_A_Name"], "/database/migrationSecret"),
    ]
    for args, where in cases:
        result = run_helm(helm, "template", "demo", str(CHART), *args)
        assert result.returncode != 0 and where in result.stderr, (args, result.stderr)
