"""The chart's TLS values (README "TLS"), rendered by the real helm: tls.enabled reaches the operator
as TXNKEEPER_OPERATOR_TLS_DEFAULT (read back by the operator's own settings parser), the runtime
PodMonitor scrapes https with the CA Secret it is given (else encrypted, unverified), and the values
schema refuses what is not a boolean or not a Secret name."""

from __future__ import annotations

from typing import Any

import pytest
from test_chart import CHART, helm, render

from txnkeeper_operator.settings import OperatorSettings


def _operator_env(*values: str) -> dict[str, str]:
    (deployment,) = [d for d in render(*values) if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: str(e.get("value")) for e in container["env"]}


def test_tls_is_on_by_default_and_reaches_the_operator() -> None:
    on = _operator_env()
    assert on["TXNKEEPER_OPERATOR_TLS_DEFAULT"] == "true"
    assert OperatorSettings.from_env(on).tls_default is True
    off = _operator_env("tls.enabled=false")
    assert OperatorSettings.from_env(off).tls_default is False


def _runtime_endpoint(*values: str) -> dict[str, Any]:
    monitors = [d for d in render("metrics.podMonitor.enabled=true", *values) if d["kind"] == "PodMonitor"]
    (endpoint,) = monitors[0]["spec"]["podMetricsEndpoints"]
    return dict(endpoint)


def test_pod_monitor_scrapes_https_verified_with_the_given_ca() -> None:
    verified = _runtime_endpoint("metrics.podMonitor.tlsCaSecret.name=txnkeeper-ca-copy")
    assert verified["scheme"] == "https"
    assert verified["tlsConfig"] == {
        "ca": {"secret": {"name": "txnkeeper-ca-copy", "key": "ca.crt"}},
        "serverName": "localhost",
    }
    unverified = _runtime_endpoint()
    assert unverified["scheme"] == "https" and unverified["tlsConfig"] == {"insecureSkipVerify": True}
    plain = _runtime_endpoint("tls.enabled=false")
    assert "scheme" not in plain and "tlsConfig" not in plain


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("tls.enabled=maybe", "enabled"),
        ("tls.bogus=1", "bogus"),
        ("metrics.podMonitor.tlsCaSecret.name=Bad_Name", "name"),
    ],
)
def test_values_schema_rejects_bad_tls_values(bad: str, message: str) -> None:
    result = helm("template", "t", str(CHART), "--kube-version", "1.29.0", "--set", bad, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr
