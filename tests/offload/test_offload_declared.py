"""The offload declaration (contract/settings/offload.py) is what the ledger's offloader uses: its keys
are the fields of OffloadConfig and OffloadPolicy, its defaults theirs, and the pod's reader refuses
each declared bound in the declaration's words.
"""

from __future__ import annotations

import dataclasses

import pytest

from txnkeeper.contract.settings.offload import OFFLOAD, POLICY_KEYS, range_text
from txnkeeper.contract.settings.schema import Setting
from txnkeeper.ledger.offload import OffloadConfig
from txnkeeper.ledger.offload.offloader import OffloadPolicy
from txnkeeper.server import offload_settings


def _defaults(cls: type) -> dict[str, object]:
    return {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING
        and f.name.startswith(("managedLedger", "max", "min", "offload", "file"))
    }


def test_declared_keys_and_defaults_are_the_ledgers() -> None:
    store = _defaults(OffloadConfig)
    policy = {k: v for k, v in _defaults(OffloadPolicy).items() if k != "config"}
    declared = {s.key: s.default for s in OFFLOAD.settings}
    assert set(policy) == POLICY_KEYS
    assert {**store, **policy} == declared


@pytest.mark.parametrize("setting", [s for s in OFFLOAD.settings if s.kind != "text"], ids=lambda s: s.key)
def test_each_bound_is_refused_in_the_declarations_words(setting: Setting) -> None:
    outside = (setting.maximum + 1) if setting.maximum is not None else (setting.minimum or 0) - 1
    with pytest.raises(offload_settings.OffloadSettingsError) as caught:
        offload_settings.parse({setting.key: outside}, "where")
    shown = float(outside) if setting.kind == "number" else outside  # a number is read as a float
    assert str(caught.value) == f"where: {setting.key} must be {range_text(setting)}, got {shown!r}"
    inside = setting.minimum if setting.minimum is not None else 0
    assert offload_settings.parse({setting.key: str(inside)}, "where") == {setting.key: inside}
