"""spec.tls as the operator reads it (tlsspec.py), the pods and jobs it renders with TLS on
(builders.py), the operator's own scheme per pod and its client certificate (podtls.py): pure parts.

The real-kube-apiserver side (CEL refusals, the operator process rendering and rebuilding its client
context when the Secret changes) is tests/operator/test_op_tls_apiserver.py; real TLS pods are
tests/operator/test_op_tls_pods.py."""

from __future__ import annotations

import dataclasses
from base64 import b64encode
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from txnkeeper.contract import pki
from txnkeeper.verifier import spark_k8s
from txnkeeper_operator import builders, podtls, tlsspec
from txnkeeper_operator.engine import BatchSettings, Template
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.settings import OperatorSettings, OperatorSettingsError


def _cr(kind: str = "PendingAckStore", **spec: Any) -> Resource:
    return Resource.from_body(
        {
            "kind": kind,
            "metadata": {"name": "pas", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": {"version": "2.0.0", **spec},
        }
    )


def test_defaults_and_durations() -> None:
    spec = tlsspec.TlsSpec.of({}, True)
    assert spec.enabled and spec.client_auth == "none" and spec.mode == "operator"
    assert (spec.renew_before, spec.certificate_validity) == (timedelta(days=30), timedelta(days=90))
    assert (spec.ca_validity, spec.ca_renew_before, spec.ca_overlap) == (
        timedelta(days=365),
        timedelta(days=30),
        timedelta(hours=1),
    )
    assert spec.issuer is None
    assert tlsspec.parse_duration("1h30m15s", "x") == timedelta(hours=1, minutes=30, seconds=15)
    custom = tlsspec.TlsSpec.of(
        {"tls": {"enabled": False, "clientAuth": "require", "certManager": {"issuerRef": {"name": "ca"}}}},
        True,
    )
    assert not custom.enabled and custom.client_auth == "require" and custom.mode == "cert-manager"
    assert custom.issuer == tlsspec.IssuerRef("ca", "Issuer", "cert-manager.io")


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ({"renewBefore": "30d"}, "spec.tls.renewBefore must be a duration such as 720h"),
        ({"renewBefore": "0h"}, "spec.tls.renewBefore must be longer than zero"),
        (
            {"renewBefore": "2160h", "certificateValidity": "2160h"},
            "spec.tls.renewBefore (2160h) must be shorter than spec.tls.certificateValidity (2160h)",
        ),
        (
            {"ca": {"renewBefore": "9000h"}},
            "spec.tls.ca.renewBefore must be shorter than spec.tls.ca.validity",
        ),
        ({"ca": {"overlap": "720h"}}, "spec.tls.ca.overlap must be shorter than spec.tls.ca.renewBefore"),
        ({"certificateValidity": "9000h"}, "must not be longer than spec.tls.ca.validity"),
        ({"clientAuth": "maybe"}, "spec.tls.clientAuth must be one of none, request, require"),
        ({"certManager": {"issuerRef": {"name": "x", "kind": "Vault"}}}, "Issuer or ClusterIssuer"),
        ({"certManager": {"issuerRef": {"kind": "Issuer"}}}, "issuerRef needs a name"),
        ({"enabled": "yes"}, "spec.tls.enabled must be true or false"),
    ],
)
def test_nonsense_is_refused_naming_the_field(tls: dict[str, Any], message: str) -> None:
    with pytest.raises(tlsspec.TlsSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tlsspec.TlsSpec.of({"tls": tls}, True)
    assert message in tlsspec.problems(tls)[0]


def test_enabled_follows_the_spec_else_the_operators_default() -> None:
    assert tlsspec.enabled({}, True) and not tlsspec.enabled({}, False)
    assert tlsspec.enabled({"tls": {"enabled": True}}, False)
    assert not tlsspec.enabled({"tls": {"enabled": False}}, True)
    # A typo in a lifetime does not switch the transport.
    assert tlsspec.enabled({"tls": {"renewBefore": "bad"}}, True)


def test_the_operator_default_comes_from_the_environment() -> None:
    assert OperatorSettings.from_env({}).tls_default is False
    assert OperatorSettings.from_env({"TXNKEEPER_OPERATOR_TLS_DEFAULT": "true"}).tls_default is True
    assert OperatorSettings.from_env({"TXNKEEPER_OPERATOR_TLS_DEFAULT": "False"}).tls_default is False
    with pytest.raises(OperatorSettingsError, match="TXNKEEPER_OPERATOR_TLS_DEFAULT must be true or false"):
        OperatorSettings.from_env({"TXNKEEPER_OPERATOR_TLS_DEFAULT": "on"})


TLS_ON = OperatorSettings(tls_default=True)
TEMPLATE = Template("2.0.0", BatchSettings.from_block({}))


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_tls_pods_mount_the_secret_and_probe_over_https() -> None:
    sts = builders.statefulset(_cr(tls={"clientAuth": "require"}), TEMPLATE, TLS_ON)
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = _env(container)
    assert env["TXNKEEPER_TLS_CERT_FILE"] == "/etc/txnkeeper/tls/tls.crt"
    assert env["TXNKEEPER_TLS_KEY_FILE"] == "/etc/txnkeeper/tls/tls.key"
    assert env["TXNKEEPER_TLS_CA_FILE"] == "/etc/txnkeeper/tls/ca.crt"
    assert (env["TXNKEEPER_TLS_CLIENT_AUTH"], env["TXNKEEPER_TLS_ADMIN_CLIENT_AUTH"]) == (
        "require",
        "request",
    )
    assert {"name": "tls", "mountPath": "/etc/txnkeeper/tls", "readOnly": True} in container["volumeMounts"]
    assert {"name": "tls", "secret": {"secretName": "pas-tls", "defaultMode": 0o440}} in pod["volumes"]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"

    plain = builders.statefulset(_cr(tls={"enabled": False}), TEMPLATE, TLS_ON)
    (container,) = plain["spec"]["template"]["spec"]["containers"]
    assert not any(name.startswith("TXNKEEPER_TLS_") for name in _env(container))
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert all(v["name"] != "tls" for v in plain["spec"]["template"]["spec"]["volumes"])


def test_verifier_and_audit_jobs_get_the_secret_and_spark_executors_too() -> None:
    offload = {"driver": "aws-s3", "bucket": "b", "region": "r", "verifySchedule": "@daily"}
    cr = _cr(version="3.0.0", offload=offload, verifier={"sparkMaster": "k8s://https://k:6443"})
    cron = builders.verifier_cron_job(cr, TLS_ON)
    audit = builders.offload_audit_cron_job(cr, TLS_ON)
    assert audit is not None
    for job in (cron, audit):
        pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = _env(container)
        assert env["TXNKEEPER_TLS_CA_FILE"] == "/etc/txnkeeper/tls/ca.crt"
        assert env["TXNKEEPER_TLS_CERT_FILE"] == "/etc/txnkeeper/tls/tls.crt"
        assert "TXNKEEPER_TLS_CLIENT_AUTH" not in env  # a client: it serves nothing
        assert any(m["mountPath"] == "/etc/txnkeeper/tls" for m in container["volumeMounts"])
        conf = env["TXNKEEPER_SPARK_EXECUTOR_CONF"]
        assert '"spark.kubernetes.executor.secrets.pas-tls": "/etc/txnkeeper/tls"' in conf
        assert '"spark.executorEnv.TXNKEEPER_TLS_CA_FILE": "/etc/txnkeeper/tls/ca.crt"' in conf
        # What the job's Spark driver accepts (runtime verifier/spark_k8s.py refuses anything else).
        assert (
            spark_k8s._executor_conf(env)["spark.kubernetes.executor.secrets.pas-tls"] == "/etc/txnkeeper/tls"
        )
    plain = builders.verifier_cron_job(_cr(), OperatorSettings())
    (container,) = plain["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert "TXNKEEPER_TLS_CA_FILE" not in _env(container)


def _pod(name: str, ip: str | None, *, tls: bool) -> dict[str, Any]:
    env = [{"name": "TXNKEEPER_TLS_CERT_FILE", "value": "/etc/txnkeeper/tls/tls.crt"}] if tls else []
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "txnkeeper", "env": env}]},
        "status": {"podIP": ip} if ip else {},
    }


def test_each_pod_is_called_with_the_scheme_it_serves() -> None:
    pods = [
        _pod("pas-0", "10.0.0.1", tls=True),
        _pod("pas-1", "10.0.0.2", tls=False),
        _pod("pas-2", None, tls=True),
    ]
    assert [podtls.pod_base(p) for p in pods] == ["https://10.0.0.1:8080", "http://10.0.0.2:8080", None]
    # Checked against its own DNS name, which only its resource's wildcard certificate covers.
    assert podtls.hostnames(_cr(), pods) == {"https://10.0.0.1:8080": "pas-0.pas.ns.svc"}


def _secret(ca: pki.Issued, leaf: pki.Issued, version: str) -> dict[str, Any]:
    data = {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem, "ca.crt": ca.cert_pem}
    return {
        "metadata": {"name": "txnkeeper-operator-client-tls", "resourceVersion": version},
        "data": {k: b64encode(v).decode() for k, v in data.items()},
    }


def test_an_unusable_client_secret_is_refused_naming_it() -> None:
    now = datetime.now(UTC)
    ca = pki.new_ca("CA", now=now, validity=timedelta(days=10))
    leaf = pki.issue(ca, "txnkeeper-operator", now=now, validity=timedelta(days=1), server=False)
    other = pki.issue(ca, "other", now=now, validity=timedelta(days=1), server=False)
    podtls.build_context(_secret(ca, leaf, "1"), "ns")  # usable
    broken = _secret(ca, leaf, "2")
    broken["data"]["tls.key"] = b64encode(other.key_pem).decode()
    with pytest.raises(podtls.ClientTlsUnavailable, match="the private key does not belong"):
        podtls.build_context(broken, "ns")
    empty = _secret(ca, leaf, "3")
    del empty["data"]["ca.crt"]
    with pytest.raises(
        podtls.ClientTlsUnavailable, match=r"Secret ns/txnkeeper-operator-client-tls has no ca\.crt"
    ):
        podtls.build_context(empty, "ns")


def test_a_tls_switch_restarts_the_pods_one_at_a_time_highest_ordinal_first() -> None:
    from txnkeeper_operator.engine import Desired, Observed, Phase, PodState, Progress, RestartPod, decide
    from txnkeeper_operator.observe import PodView

    batch = BatchSettings.from_block({})
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    pods = [_pod(f"pas-{o}", f"10.0.0.{o}", tls=o == 2) for o in range(3)]
    views = [PodView(p) for p in pods]
    states = tuple(PodState(o, f"pas-{o}", "2.0.0", True, batch) for o in range(3))
    marked = podtls.mark_stale(states, views, tls=True)
    assert [s.stale for s in marked] == [None if o == 2 else "TLS off -> on" for o in range(3)]

    decision = decide(Desired("2.0.0", 3, batch), Observed(TEMPLATE, marked, now), Progress())
    assert decision.phase == Phase.ROLLING_UPGRADE
    assert decision.action == RestartPod("pas-1", 1, "2.0.0", "2.0.0", "restart pas-1: TLS off -> on")
    # Not while another pod is down (the restarted one must be Ready first).
    down = (marked[0], dataclasses.replace(marked[1], ready=False), marked[2])
    held = decide(Desired("2.0.0", 3, batch), Observed(TEMPLATE, down, now), Progress())
    assert held.action is None and held.phase == Phase.WAITING_FOR_PODS
    # Outside a maintenance window the restart waits, as a version roll's does.
    closed = Desired("2.0.0", 3, batch, ("* 3 * * *",))
    waiting = decide(closed, Observed(TEMPLATE, marked, now), Progress())
    assert waiting.action is None and "waits for a maintenance window" in waiting.reason
    # Every pod restarted with TLS: nothing left to do.
    done = podtls.mark_stale(
        states, [PodView(_pod(f"pas-{o}", "10.0.0.9", tls=True)) for o in range(3)], tls=True
    )
    assert decide(Desired("2.0.0", 3, batch), Observed(TEMPLATE, done, now), Progress()).phase == Phase.READY
