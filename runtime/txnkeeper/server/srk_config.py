"""Settings of single-routing-key transactions (PDP-44): the config file's ``singleKeyTransactions``
section and the ``--srk-*`` serve flags (flag > environment > file > default, key by key).

What the settings are, their bounds and their errors is the declaration's
(``contract/settings/single_key.py``, which the CRD's fragment is generated from too); this module only
binds it to ``serve``'s flags and the ``SingleKeySettings`` the store uses.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from txnkeeper.contract.settings import schema
from txnkeeper.contract.settings.single_key import SINGLE_KEY
from txnkeeper.server.config import ConfigError, file_section
from txnkeeper.topic.writers import SingleKeySettings

SECTION = SINGLE_KEY.name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    schema.add_flags(parser, SINGLE_KEY)


def load(ns: argparse.Namespace, path: Path | None) -> schema.Loaded:
    """The section's values and where each came from (``sources``: what a refusal quotes)."""
    try:
        return schema.load(
            SINGLE_KEY,
            flags=vars(ns),
            environ=os.environ,
            file=file_section(path, SECTION),
            file_where=f"{path}: {SECTION}",
        )
    except schema.SettingValueError as exc:
        raise ConfigError(str(exc)) from exc


def single_key_settings(ns: argparse.Namespace, path: Path | None) -> SingleKeySettings:
    """Settings from the config file's section, overridden by the environment and the flags."""
    return SingleKeySettings(**load(ns, path).values)
