"""The shared runtime-process flags: defaults, environment, and refusal of bad values."""

from __future__ import annotations

import argparse

import pytest

from txnkeeper import eventloop, gcpolicy
from txnkeeper.process_settings import ProcessSettings, add_arguments


def parse(argv: list[str]) -> ProcessSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return ProcessSettings.from_args(parser.parse_args(argv))


def test_defaults_are_the_runtime_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GC_THRESHOLD", "EVENT_LOOP", "SWITCH_INTERVAL_MS", "MALLOC_POLICY"):
        monkeypatch.delenv(f"TXNKEEPER_{name}", raising=False)
    settings = parse([])
    assert settings.gc_thresholds == gcpolicy.RUNTIME_THRESHOLDS
    assert settings.event_loop == eventloop.resolve("auto")
    assert settings.switch_interval_s == pytest.approx(eventloop.IO_SWITCH_INTERVAL_S)
    assert settings.malloc_policy == "fixed"


def test_environment_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXNKEEPER_GC_THRESHOLD", "default")
    monkeypatch.setenv("TXNKEEPER_EVENT_LOOP", "asyncio")
    monkeypatch.setenv("TXNKEEPER_SWITCH_INTERVAL_MS", "2")
    monkeypatch.setenv("TXNKEEPER_MALLOC_POLICY", "glibc")
    assert parse([]) == ProcessSettings((700, 10, 10), "asyncio", 0.002, "glibc")
    argv = ["--gc-threshold", "1000,5,7", "--switch-interval-ms", "1", "--malloc-policy", "fixed"]
    assert parse(argv) == ProcessSettings((1000, 5, 7), "asyncio", 0.001, "fixed")


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        ("GC_THRESHOLD", "1,2", "three positive integers"),
        ("EVENT_LOOP", "trio", "^TXNKEEPER_EVENT_LOOP must be one of auto, uvloop, asyncio, got 'trio'$"),
        (
            "SWITCH_INTERVAL_MS",
            "0",
            r"^TXNKEEPER_SWITCH_INTERVAL_MS must be a number of milliseconds in 0\.001\.\.1000",
        ),
        ("MALLOC_POLICY", "jemalloc", "^TXNKEEPER_MALLOC_POLICY is 'jemalloc': give 'fixed' .* or 'glibc'"),
    ],
)
def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch, env: str, value: str, message: str) -> None:
    monkeypatch.setenv(f"TXNKEEPER_{env}", value)
    with pytest.raises(ValueError, match=message):
        parse([])
