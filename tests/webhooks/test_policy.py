"""The pure part and the secrets file: which URLs a webhook may name, the backoff, and the secrets file
re-read on change, a bad one keeping the last good secrets."""

from __future__ import annotations

import base64
import json
import logging
import os
import random
from pathlib import Path

import pytest

from agentrun.worker.core.webhooks import Allow, Backoff, WebhookProblem, check_webhook, parse_url
from agentrun.worker.runtime.webhooks import WebhookSecrets

REFUSED = [
    "http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:8080/", "http://10.1.2.3/", "http://172.16.0.1/",
    "http://192.168.1.1/", "http://100.64.0.1/", "http://224.0.0.1/", "http://0.0.0.0/", "http://[::1]/",
    "http://[fd00:ec2::254]/", "http://[fe80::1]/", "http://[::ffff:169.254.169.254]/", "http://localhost/",
    "http://api.localhost/",
]
BAD = ["ftp://example.com/", "file:///etc/passwd", "gopher://x/", "http:///nohost", "example.com/hook",
       "http://user:pw@example.com/", "http://exa mple.com/", "javascript:alert(1)", "http://bad_host!/"]


@pytest.mark.parametrize("url", REFUSED)
def test_internal_addresses_are_refused_unless_allowed(url: str) -> None:
    with pytest.raises(WebhookProblem) as e:
        parse_url(url, Allow())
    assert e.value.field == "webhook.url"
    host = url.split("//")[1].split("/")[0].rsplit(":", 1)[0] if "[" not in url else url.split("[")[1].split("]")[0]
    parse_url(url, Allow.parse(f"{host},0.0.0.0/0,::/0"))  # named in AGENTRUN_WEBHOOK_ALLOW: allowed


@pytest.mark.parametrize("url", BAD)
def test_only_absolute_http_urls_without_credentials(url: str) -> None:
    with pytest.raises(WebhookProblem):
        parse_url(url, Allow.parse("0.0.0.0/0"))


def test_public_names_and_addresses_pass_submission() -> None:
    assert parse_url("https://hooks.example.com/x?y=1", Allow()).port == 443
    assert parse_url("http://93.184.216.34:8080/", Allow()).port == 8080


def test_allow_takes_hosts_and_cidrs_and_refuses_junk() -> None:
    allow = Allow.parse(" 127.0.0.1 , 10.0.0.0/8, receiver.svc.cluster.local ")
    assert allow.host("RECEIVER.svc.cluster.local.") and not allow.host("other")
    with pytest.raises(ValueError, match="AGENTRUN_WEBHOOK_ALLOW"):
        Allow.parse("not a host!")


def test_check_webhook_names_the_field() -> None:
    ok = {"url": "https://example.com/h", "events": ["finished", "waiting", "finished"], "secretRef": "s"}
    assert check_webhook(ok, ["s"], Allow())["events"] == ["finished", "waiting"]
    for bad, field in [({**ok, "events": ["done"]}, "webhook.events[0]"), ({**ok, "events": []}, "webhook.events"),
                       ({**ok, "secretRef": "nope"}, "webhook.secretRef"), ({**ok, "x": 1}, "webhook.x"),
                       ({**ok, "url": "http://169.254.169.254/"}, "webhook.url")]:
        with pytest.raises(WebhookProblem) as e:
            check_webhook(bad, ["s"], Allow())
        assert e.value.field == field


def test_backoff_is_about_5_10_30_s_then_grows_to_an_hour() -> None:
    b, rng = Backoff(), random.Random(1)
    for n, base in [(1, 5), (2, 10), (3, 30), (4, 60), (5, 120), (10, 3600), (40, 3600)]:
        d = b.delay(n, rng)
        assert base * 0.8 <= d <= base * 1.2, (n, d)
    assert len({round(b.delay(1, rng), 6) for _ in range(20)}) > 1  # jittered
    assert Backoff.parse("0.1,0.2", 1.0, 60).first == (0.1, 0.2)
    with pytest.raises(ValueError):
        Backoff.parse("a,b", None, None)


def _secret(seed: bytes) -> str:
    return "whsec_" + base64.b64encode(seed * 32).decode()


def test_the_secrets_file_is_reread_on_change_and_a_bad_one_keeps_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "secrets.yaml"
    path.write_text(f"secrets:\n  - name: a\n    secret: {_secret(b'a')}\n")
    now = [0.0]
    secrets = WebhookSecrets(str(path), recheck_seconds=1.0, clock=lambda: now[0])
    assert secrets.names() == ["a"]
    path.write_text(json.dumps({"secrets": [{"name": "b", "secret": _secret(b"b")}]}))
    os.utime(path, ns=(1, 1))
    assert secrets.names() == ["a"]  # not looked at again within the recheck interval
    now[0] += 2
    assert secrets.names() == ["b"] and secrets.get("b") == _secret(b"b")
    for bad in ["secrets: [", json.dumps({"secrets": [{"name": "c", "secret": "plain"}]}),
                json.dumps({"secrets": [{"name": "c", "secret": "whsec_!!"}]}), "[]"]:
        with caplog.at_level(logging.ERROR, "agentrun.worker.runtime.webhooks"):
            path.write_text(bad)
            now[0] += 2
            assert secrets.names() == ["b"]  # the last good secrets stay
        assert "keeping the 1 secrets read before" in caplog.text
        caplog.clear()
    path.unlink()
    now[0] += 2
    assert secrets.names() == ["b"]


def test_a_missing_or_bad_file_at_start_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert WebhookSecrets(str(tmp_path / "absent")).names() == []
        (tmp_path / "bad").write_text("secrets: 3")
        assert WebhookSecrets(str(tmp_path / "bad")).names() == []
    assert "AGENTRUN_WEBHOOK_SECRETS" in caplog.text or "cannot be read" in caplog.text
