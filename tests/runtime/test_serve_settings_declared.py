"""Every ``txnkeeper serve`` setting is declared (contract/settings/) and read through the declaration:
a flag ``serve --help`` lists that no section declares fails here, and tables of hostile values through
serve's real argument parser, its env and its config file get the exact refusal a user sees.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from txnkeeper.contract.settings.connections import CONNECTIONS, MEMORY
from txnkeeper.contract.settings.interpreter import INTERPRETER
from txnkeeper.contract.settings.process import PROCESS
from txnkeeper.contract.settings.sections import SECTIONS
from txnkeeper.process_settings import ProcessSettings
from txnkeeper.protocol import auth, clientauth
from txnkeeper.protocol.limits import ConnectionLimits
from txnkeeper.server.config import ConfigError
from txnkeeper.server.serve import build_config, register
from txnkeeper.topic.tailcache import DEFAULT_MAX_BYTES

# Flags of `serve --help` that are no setting of a section, and why. (None today: keep it so.)
UNDECLARED: dict[str, str] = {}

MAX_PENDING = "an integer of at least 5242880 (bytes)"
SECONDS = "a number of seconds in 0.001..604800"
TAIL = "an integer of bytes in 0..1099511627776 (0: no tail cache, consumers read from disk)"
PORT = "host:port (port 0: any free port)"


def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TXNKEEPER_* variable of the runner's own reaches a test (each test calls this first)."""
    for name in [n for n in os.environ if n.startswith("TXNKEEPER_")]:
        monkeypatch.delenv(name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser


def _serve_parser() -> argparse.ArgumentParser:
    subparsers = argparse.ArgumentParser().add_subparsers()
    register(subparsers)
    return subparsers.choices["serve"]


def test_every_flag_serve_has_is_declared_once() -> None:
    serve = _serve_parser()
    flags = {o for a in serve._actions for o in a.option_strings if o not in ("-h", "--help")}
    declared = [s.flag for section in SECTIONS for s in section.settings if s.flag]
    assert len(declared) == len(set(declared)), "a flag is declared twice"
    assert flags - set(UNDECLARED) == set(declared) & flags
    assert flags - set(declared) == set(UNDECLARED)
    for action in serve._actions:  # the declaration gives defaults and checks: argparse neither
        if action.option_strings and action.dest != "help":
            assert (action.default, action.type, action.choices) == (None, None, None), action.dest
    envs = [s.env_name for section in SECTIONS for s in section.settings if s.env_name]
    assert len(envs) == len(set(envs)), "an env variable is declared twice"


def test_defaults_are_the_runtimes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clean(monkeypatch)
    config = build_config(_parser().parse_args(["serve", "--role", "store", "--data-dir", str(tmp_path)]))
    assert config.connection_limits == ConnectionLimits()
    assert config.tail_cache_bytes == DEFAULT_MAX_BYTES
    assert (config.listen, config.admin_listen, config.log_level) == ("0.0.0.0:6650", "0.0.0.0:8080", "INFO")
    assert config.coordinator_ids == (0,) and config.replicas is None and config.shards is None
    for s in CONNECTIONS.settings:
        assert getattr(ConnectionLimits(), s.field) == s.default, s.key


def test_flags_win_over_env_over_the_file_key_by_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clean(monkeypatch)
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "connectionLimits": {
                    "maxConnections": 7,
                    "maxConnectionsPerAddress": 6,
                    "idleTimeoutSeconds": 5,
                },
                "memory": {"tailCacheBytes": 0},
            }
        )
    )
    monkeypatch.setenv("TXNKEEPER_MAX_CONNECTIONS_PER_ADDRESS", "3")
    monkeypatch.setenv("TXNKEEPER_IDLE_TIMEOUT", "2.5")
    monkeypatch.setenv("TXNKEEPER_CONFIG", str(path))
    monkeypatch.setenv("TXNKEEPER_LOG_LEVEL", "debug")
    argv = ["serve", "--role", "store", "--data-dir", str(tmp_path), "--idle-timeout", "1.5"]
    config = build_config(_parser().parse_args(argv))
    limits = config.connection_limits
    assert (limits.max_connections, limits.max_connections_per_address, limits.idle_timeout_s) == (7, 3, 1.5)
    assert config.tail_cache_bytes == 0 and config.log_level == "DEBUG"


# (argv after `serve --role store --data-dir D`, env, config document or None, the whole error)
ROWS: list[tuple[list[str], dict[str, str], object, str]] = [
    # ---- connectionLimits through flags
    (
        ["--max-connections", "\u0661\u0662\u0663"],
        {},
        None,
        "--max-connections must be an integer of at least 1, got '١٢٣' (default 1024)",
    ),
    (
        ["--max-connections", " 12 "],
        {},
        None,
        "--max-connections must be an integer of at least 1, got ' 12 ' (default 1024)",
    ),
    (["--max-connections", "-0"], {}, None, "--max-connections='-0' is a negative zero; write 0"),
    (
        ["--max-connections", "-5"],
        {},
        None,
        "--max-connections must be an integer of at least 1, got -5 (default 1024)",
    ),
    (
        ["--max-connections", "1e308"],
        {},
        None,
        "--max-connections must be an integer of at least 1, got '1e308' (default 1024)",
    ),
    (
        ["--max-connections", "1.5"],
        {},
        None,
        "--max-connections must be an integer of at least 1, got '1.5' (default 1024)",
    ),
    (
        ["--max-connections", "99999999999999999999"],
        {},
        None,
        "--max-connections must be an integer of at least 1, got '99999999999999999999' (default 1024)",
    ),
    (["--idle-timeout", "NaN"], {}, None, f"--idle-timeout must be {SECONDS}, got 'NaN' (default 600)"),
    (["--idle-timeout", "inf"], {}, None, f"--idle-timeout must be {SECONDS}, got 'inf' (default 600)"),
    (["--idle-timeout", "1e308"], {}, None, f"--idle-timeout must be {SECONDS}, got '1e308' (default 600)"),
    (["--idle-timeout", "604801"], {}, None, f"--idle-timeout must be {SECONDS}, got 604801 (default 600)"),
    (["--idle-timeout", "0"], {}, None, f"--idle-timeout must be {SECONDS}, got 0 (default 600)"),
    (["--write-timeout", "-0.0"], {}, None, "--write-timeout='-0.0' is a negative zero; write 0"),
    (
        ["--max-pending-bytes", "5242879"],
        {},
        None,
        f"--max-pending-bytes must be {MAX_PENDING}, got 5242879 (default 67108864)",
    ),
    # ---- through env (named as the variable)
    (
        [],
        {"TXNKEEPER_MAX_PENDING_BYTES": "\u0661"},
        None,
        f"TXNKEEPER_MAX_PENDING_BYTES must be {MAX_PENDING}, got '\u0661' (default 67108864)",
    ),
    (
        [],
        {"TXNKEEPER_HANDSHAKE_TIMEOUT": "ten"},
        None,
        f"TXNKEEPER_HANDSHAKE_TIMEOUT must be {SECONDS}, got 'ten' (default 10)",
    ),
    # ---- through the config file (named as file: section.key)
    (
        [],
        {},
        {"connectionLimits": {"maxConnections": "12"}},
        "{path}: connectionLimits.maxConnections must be an integer of at least 1, got '12' (default 1024)",
    ),
    (
        [],
        {},
        {"connectionLimits": {"maxConnections": True}},
        "{path}: connectionLimits.maxConnections must be an integer of at least 1, got True (default 1024)",
    ),
    (
        [],
        {},
        {"connectionLimits": {"maxConnections": 10**30}},
        "{path}: connectionLimits.maxConnections must be an integer of at least 1 that fits 64 bits, got "
        + str(10**30),
    ),
    (
        [],
        {},
        {"connectionLimits": {"idleTimeoutSeconds": 1e308}},
        f"{{path}}: connectionLimits.idleTimeoutSeconds must be {SECONDS}, got 1e+308 (default 600)",
    ),
    (
        [],
        {},
        {"connectionLimits": {"maxConection": 1}},
        "{path}: connectionLimits: unknown key(s) ['maxConection']; known: "
        + str(sorted(CONNECTIONS.keys())),
    ),
    ([], {}, {"connectionLimits": []}, "{path}: section connectionLimits must be an object"),
    (
        [],
        {},
        '{"connectionLimits": {"idleTimeoutSeconds": NaN}}',
        "config file {path}: NaN is not a number: JSON has no NaN or Infinity; write a finite number",
    ),
    # ---- memory
    (["--tail-cache-bytes", "-1"], {}, None, f"--tail-cache-bytes must be {TAIL}, got -1 (default 67108864)"),
    (
        ["--tail-cache-bytes", "1099511627777"],
        {},
        None,
        f"--tail-cache-bytes must be {TAIL}, got 1099511627777 (default 67108864)",
    ),
    (
        [],
        {},
        {"memory": {"tailCacheBytes": 1.0}},
        f"{{path}}: memory.tailCacheBytes must be {TAIL}, got 1.0 (default 67108864)",
    ),
    (
        [],
        {},
        {"memory": {"tailCache": 1}},
        "{path}: memory: unknown key(s) ['tailCache']; known: ['tailCacheBytes']",
    ),
    # ---- process (flags and env only)
    (["--replicas", "0"], {}, None, "--replicas must be an integer in 1..1024, got 0"),
    (["--replicas", "1025"], {}, None, "--replicas must be an integer in 1..1024, got 1025"),
    (["--shards", "4097", "--replicas", "1"], {}, None, "--shards must be an integer in 1..4096, got 4097"),
    (["--coordinators", "\u0663"], {}, None, "--coordinators must be an integer in 1..4096, got '٣'"),
    (
        [],
        {"TXNKEEPER_COORDINATORS": "0"},
        None,
        "TXNKEEPER_COORDINATORS must be an integer in 1..4096, got 0",
    ),
    (["--listen", "6650"], {}, None, f"--listen must be {PORT}, got '6650'"),
    (["--admin-listen", "h: 80"], {}, None, f"--admin-listen must be {PORT}, got 'h: 80'"),
    (
        ["--log-level", "LOUD"],
        {},
        None,
        "--log-level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL (any case), got 'LOUD'",
    ),
    (["--data-dir", ""], {}, None, "--data-dir must be a directory path, got ''"),
    (["--role", "broker"], {}, None, "--role must be one of ['coordinator', 'store'], got 'broker'"),
    (
        [],
        {"TXNKEEPER_ROLE": "Store"},
        None,
        "TXNKEEPER_ROLE must be one of ['coordinator', 'store'], got 'Store'",
    ),
    (
        ["--shards", "4"],
        {},
        None,
        "--shards (or TXNKEEPER_SHARDS) needs --replicas: the pods the shards start on",
    ),
    (["--release", "9.9.9"], {}, None, "release '9.9.9' is unknown to this build (known: 1.x, 2.x, 3.x)"),
    # ---- the process section is no section of the config file (read as a bare batchedWrite block)
    ([], {}, {"process": {"role": "store"}}, "{path}: unknown batchedWrite key(s) ['process']; use the CR's"),
]


def _rows() -> list[object]:
    return [
        pytest.param(argv, env, doc, error, id=" ".join([*argv, *env, json.dumps(doc)[:40]]))
        for argv, env, doc, error in ROWS
    ]


@pytest.mark.parametrize(("argv", "env", "doc", "error"), _rows())
def test_a_hostile_value_gets_the_exact_refusal(
    argv: list[str],
    env: dict[str, str],
    doc: object,
    error: str,
    *,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clean(monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    base = ["serve"]
    if "--role" not in argv and "TXNKEEPER_ROLE" not in env:
        base += ["--role", "store"]
    if "--data-dir" not in argv:
        base += ["--data-dir", str(tmp_path)]
    path = tmp_path / "config.json"
    if doc is not None:
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        argv = [*argv, "--config", str(path)]
    with pytest.raises(ConfigError) as refused:
        build_config(_parser().parse_args([*base, *argv]))
    message = str(refused.value)
    expected = error.replace("{path}", str(path))
    if expected.endswith("use the CR's"):  # the rest lists every batchedWrite key
        assert message.startswith(expected), message
    else:
        assert message == expected


INTERPRETER_ROWS: list[tuple[list[str], dict[str, str], str]] = [
    (
        ["--switch-interval-ms", "0"],
        {},
        "--switch-interval-ms must be a number of milliseconds in 0.001..1000, got 0 (default 0.5)",
    ),
    (
        ["--switch-interval-ms", "1e308"],
        {},
        "--switch-interval-ms must be a number of milliseconds in 0.001..1000, got '1e308' (default 0.5)",
    ),
    (["--switch-interval-ms", "-0"], {}, "--switch-interval-ms='-0' is a negative zero; write 0"),
    (
        [],
        {"TXNKEEPER_SWITCH_INTERVAL_MS": "NaN"},
        "TXNKEEPER_SWITCH_INTERVAL_MS must be a number of milliseconds in 0.001..1000, got 'NaN'"
        " (default 0.5)",
    ),
    (
        ["--gc-threshold", "\u0661,2,3"],
        {},
        "--gc-threshold must be three positive integers gen0,gen1,gen2 such as 50000,20,100, or default,"
        " got '\u0661,2,3'",
    ),
    (
        ["--gc-threshold", "0,1,1"],
        {},
        "GC threshold '0,1,1' is not three positive integers (gen0,gen1,gen2) such as '50000,20,100';"
        " use 'default' for CPython's 700,10,10",
    ),
    (
        ["--malloc-policy", "jemalloc"],
        {},
        "--malloc-policy is 'jemalloc': give 'fixed' (large allocations mapped on their own from 128 KiB, 2"
        " arenas) or 'glibc' (glibc's own defaults)",
    ),
    (
        [],
        {"TXNKEEPER_EVENT_LOOP": "trio"},
        "TXNKEEPER_EVENT_LOOP must be one of auto, uvloop, asyncio, got 'trio'",
    ),
]


@pytest.mark.parametrize(("argv", "env", "error"), INTERPRETER_ROWS)
def test_a_hostile_interpreter_setting_gets_the_exact_refusal(
    argv: list[str], env: dict[str, str], error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean(monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ns = _parser().parse_args(["serve", *argv])
    with pytest.raises(ValueError, match=None) as refused:
        ProcessSettings.from_args(ns)
    assert str(refused.value) == error


def test_the_interpreter_defaults_are_the_runtimes(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean(monkeypatch)
    settings = ProcessSettings.from_args(_parser().parse_args(["serve"]))
    assert (settings.gc_thresholds, settings.switch_interval_s, settings.malloc_policy) == (
        (50000, 20, 100),
        0.0005,
        "fixed",
    )
    monkeypatch.setenv("TXNKEEPER_EVENT_LOOP", "ASYNCIO")  # any case, as before
    assert ProcessSettings.from_args(_parser().parse_args(["serve"])).event_loop == "asyncio"


def test_the_process_sections_are_flags_and_env_only() -> None:
    """What differs per pod is no key of the config file (one per resource) nor of a CR; the names the
    secret loaders quote in their errors are the declared ones."""
    by_key = {s.key: s for s in PROCESS.settings}
    secret, key = by_key["clusterSecretFile"], by_key["clientTokenKeyFile"]
    assert (secret.env_name, key.env_name, key.flag) == (
        auth.SECRET_ENV,
        clientauth.KEY_ENV,
        clientauth.KEY_FLAG,
    )
    assert secret.flag == auth.SECRET_FLAG
    for section in (PROCESS, INTERPRETER):
        assert all(not s.in_file and not s.in_cr and s.flag and s.env for s in section.settings)
    for section in (CONNECTIONS, MEMORY):
        assert all(s.in_file and s.in_cr and s.flag and s.env for s in section.settings)
