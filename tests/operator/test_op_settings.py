"""Operator settings from the environment: defaults, and a wrong variable named at start."""

from __future__ import annotations

import pytest

from txnkeeper_operator.settings import OperatorSettings, OperatorSettingsError


def test_defaults_and_overrides() -> None:
    assert OperatorSettings.from_env({}) == OperatorSettings()
    settings = OperatorSettings.from_env(
        {"TXNKEEPER_RECONCILE_SECONDS": "0.5", "TXNKEEPER_NAMESPACES": "a, b,", "TXNKEEPER_IMAGE": "x:1"}
    )
    assert (settings.reconcile_seconds, settings.namespaces, settings.image) == (0.5, ("a", "b"), "x:1")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TXNKEEPER_RECONCILE_SECONDS": "fast"}, "TXNKEEPER_RECONCILE_SECONDS must be a number of seconds"),
        ({"TXNKEEPER_RECONCILE_SECONDS": "0"}, r"TXNKEEPER_RECONCILE_SECONDS .* in \(0, 300\]"),
        ({"TXNKEEPER_RECONCILE_SECONDS": "nan"}, "TXNKEEPER_RECONCILE_SECONDS"),
        ({"TXNKEEPER_ADMIN_TIMEOUT_SECONDS": "-1"}, "TXNKEEPER_ADMIN_TIMEOUT_SECONDS"),
        ({"TXNKEEPER_ADMIN_TIMEOUT_SECONDS": "1e9"}, "TXNKEEPER_ADMIN_TIMEOUT_SECONDS"),
        ({"TXNKEEPER_IMAGE": ""}, "TXNKEEPER_IMAGE must be a container image reference"),
        ({"TXNKEEPER_VERIFIER_IMAGE": "a b"}, "TXNKEEPER_VERIFIER_IMAGE"),
        ({"TXNKEEPER_IMAGE_PULL_POLICY": "Sometimes"}, "Always, IfNotPresent, Never"),
    ],
)
def test_wrong_variables_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(OperatorSettingsError, match=message):
        OperatorSettings.from_env(env)
