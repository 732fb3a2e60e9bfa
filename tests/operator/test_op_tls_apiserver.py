"""spec.tls against a real kube-apiserver, and the operator process with TLS on (no nodes: no pods run).

The CRD refuses malformed TLS settings with its own messages (CEL on durations, the issuer kind enum);
a resource without spec.tls.enabled follows the operator's default (TXNKEEPER_OPERATOR_TLS_DEFAULT, as
the chart sets it) and its StatefulSet mounts <cr>-tls with HTTPS probes, its verifier CronJob the same
Secret; without Secret txnkeeper-operator-client-tls the AdminTLS condition says what is awaited (and
a Warning Event), once it exists the condition names its resourceVersion, and when it changes (a CA
rotation rewrites it) the operator's context is rebuilt: the condition follows without a restart.
Switched off, the template loses the Secret and probes plain HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from test_op_apiserver import (
    APISERVERS,
    ETCD,
    _client,
    _cr,
    _get,
    _install_crds,
    _operator_kubeconfig,
    _stop,
    apiserver,
    wait_for,
)

__all__ = ["apiserver"]  # the fixture, shared with test_op_apiserver (one API server per module)

pytestmark = [
    pytest.mark.skipif(not APISERVERS, reason="no kube-apiserver in $CACHE_DIR/k8s (run `make k8s-bins`)"),
    pytest.mark.skipif(ETCD is None, reason="no etcd in $CACHE_DIR/kind/bin (run `make kind-components`)"),
    pytest.mark.timeout(150),
]
NS = "secure"


def test_tls_spec_refusals_rendering_and_the_client_context_rebuilt(apiserver: Path, tmp_path: Path) -> None:
    from kubernetes import client

    api = _client(apiserver)
    _install_crds(api)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    core.create_namespace({"metadata": {"name": NS}})  # type: ignore[arg-type]

    for tls, message in [
        ({"renewBefore": "30d"}, "spec.tls.renewBefore"),
        (
            {"renewBefore": "2160h", "certificateValidity": "720h"},
            "spec.tls.renewBefore must be shorter than spec.tls.certificateValidity",
        ),
        ({"ca": {"overlap": "800h"}}, "spec.tls.ca.overlap must be shorter than spec.tls.ca.renewBefore"),
        ({"certManager": {"issuerRef": {"name": "i", "kind": "Vault"}}}, 'Unsupported value: \\"Vault\\"'),
        ({"clientAuth": "sometimes"}, "Unsupported value"),
    ]:
        body = _cr("PendingAckStore", "bad", {"version": "2.0.0", "tls": tls})
        with pytest.raises(client.ApiException) as refused:
            custom.create_namespaced_custom_object("txnkeeper.io", "v1", NS, "pendingackstores", body)
        assert refused.value.status == 422, refused.value.body
        assert message in str(refused.value.body), (message, refused.value.body)

    # No spec.tls.enabled: the operator's default (on); lifetimes defaulted by the API server.
    custom.create_namespaced_custom_object(
        "txnkeeper.io", "v1", NS, "pendingackstores",
        _cr("PendingAckStore", "pas", {"version": "2.0.0", "replicas": 1, "tls": {"clientAuth": "request"}}),
    )  # fmt: skip
    stored = cast(
        dict[str, Any],
        custom.get_namespaced_custom_object("txnkeeper.io", "v1", NS, "pendingackstores", "pas"),
    )
    assert stored["spec"]["tls"]["renewBefore"] == "720h" and "enabled" not in stored["spec"]["tls"]

    kubeconfig = _operator_kubeconfig(api, apiserver, tmp_path)
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "TXNKEEPER_RECONCILE_SECONDS": "1",
        "TXNKEEPER_OPERATOR_TLS_DEFAULT": "true",
    }
    log = (tmp_path / "operator.log").open("ab")
    operator = subprocess.Popen(
        [sys.executable, "-m", "txnkeeper_operator.main", "--liveness="],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        apps = client.AppsV1Api(api)
        sts = wait_for(lambda: _get(lambda: apps.read_namespaced_stateful_set("pas", NS)), "StatefulSet", 40)
        pod = sts.spec.template.spec
        container = pod.containers[0]
        envs = {e.name: e.value for e in container.env}
        assert envs["TXNKEEPER_TLS_CERT_FILE"] == "/etc/txnkeeper/tls/tls.crt"
        assert envs["TXNKEEPER_TLS_CA_FILE"] == "/etc/txnkeeper/tls/ca.crt"
        assert (envs["TXNKEEPER_TLS_CLIENT_AUTH"], envs["TXNKEEPER_TLS_ADMIN_CLIENT_AUTH"]) == (
            "request",
            "request",
        )
        assert container.readiness_probe.http_get.scheme == "HTTPS"
        assert container.liveness_probe.http_get.scheme == "HTTPS"
        (mount,) = [m for m in container.volume_mounts if m.name == "tls"]
        assert (mount.mount_path, mount.read_only) == ("/etc/txnkeeper/tls", True)
        (volume,) = [v for v in pod.volumes if v.name == "tls"]
        assert volume.secret.secret_name == "pas-tls"
        cron: Any = client.BatchV1Api(api).read_namespaced_cron_job("pas-verifier", NS)
        job_container = cron.spec.job_template.spec.template.spec.containers[0]
        assert {e.name for e in job_container.env} >= {"TXNKEEPER_TLS_CA_FILE", "TXNKEEPER_TLS_CERT_FILE"}
        assert any(m.mount_path == "/etc/txnkeeper/tls" for m in job_container.volume_mounts)

        def admin_tls() -> dict[str, Any] | None:
            got = cast(
                dict[str, Any],
                custom.get_namespaced_custom_object("txnkeeper.io", "v1", NS, "pendingackstores", "pas"),
            )
            conditions = (got.get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "AdminTLS"), None)

        # The operator's certificate manager makes the client Secret before the pods need it (the
        # missing-Secret refusal is test_op_tls_pods'); the context is built from what it made.
        loaded = wait_for(lambda: (c := admin_tls()) and c["status"] == "True" and c, "AdminTLS True", 60)
        made: Any = core.read_namespaced_secret("txnkeeper-operator-client-tls", NS)
        first = made.metadata.resource_version
        assert f"(resourceVersion {first})" in loaded["message"], loaded

        # Renewed on request: a new client certificate (a new resourceVersion), taken without a restart.
        core.patch_namespaced_secret(
            "txnkeeper-operator-client-tls", NS, {"metadata": {"annotations": {"txnkeeper.io/renew": "now"}}}
        )

        def rebuilt() -> bool:
            current: Any = core.read_namespaced_secret("txnkeeper-operator-client-tls", NS)
            version = current.metadata.resource_version
            condition = admin_tls()
            return bool(
                version != first
                and "txnkeeper.io/renew" not in (current.metadata.annotations or {})
                and condition
                and f"(resourceVersion {version})" in condition["message"]
            )

        wait_for(rebuilt, "the operator to rebuild its client context from the renewed Secret", 60)
        # Switched off: the template loses the Secret and probes plain HTTP (no pods run here to restart:
        # the rollout of a switch is test_op_tlsspec's engine test); nothing asks for the client Secret.
        custom.patch_namespaced_custom_object(
            "txnkeeper.io", "v1", NS, "pendingackstores", "pas", {"spec": {"tls": {"enabled": False}}}
        )

        def plain_template() -> bool:
            spec = apps.read_namespaced_stateful_set("pas", NS).spec
            assert spec is not None and spec.template.spec is not None
            (runtime,) = spec.template.spec.containers
            names = {e.name for e in runtime.env or []}
            probe = runtime.readiness_probe
            scheme = probe.http_get.scheme if probe is not None and probe.http_get is not None else None
            return "TXNKEEPER_TLS_CERT_FILE" not in names and scheme == "HTTP"

        wait_for(plain_template, "the template without TLS", 30)
        wait_for(lambda: admin_tls() is None, "AdminTLS gone with TLS off and no TLS pod", 30)
        assert operator.poll() is None  # the same process throughout
    finally:
        _stop(operator)
        log.close()
    text = (tmp_path / "operator.log").read_text(errors="replace")
    assert "Forbidden" not in text and "Traceback" not in text, text[-3000:]
