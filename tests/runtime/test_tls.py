"""TLS on real pods with real certificates (issue 28 item 1): transactions, Pulsar's own client over
pulsar+ssl://, the admin API over https with the CLI, pod-to-pod mutual TLS, refusals at the handshake,
and the errors a client shows for an expired, wrong-host or wrong-CA server certificate."""

from __future__ import annotations

import asyncio
import re
import ssl
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pulsar
import pytest
from pulsar_wire import free_port, placement_flags
from runtime_pods import ServePod
from runtime_waits import wait_until_sync
from tls_certs import expired, issue, make_ca, write_bundle
from tls_pods import TlsFiles, https_metrics, start_tls_pod

from txnkeeper.client import Client, TlsHandshakeError
from txnkeeper.errors import ConnectionClosedError
from txnkeeper.protocol.rpc import StaticClientTls, connect


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return TlsFiles.create(tmp_path_factory.mktemp("tls") / "secret")


@pytest.fixture(scope="module")
def tls_cluster(
    tls: TlsFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServePod, ServePod]]:
    """A coordinator pod and a store pod, TLS on every listener; the client port requires a client
    certificate (their connections to each other present theirs)."""
    work = tmp_path_factory.mktemp("pods")
    store_port, coordinator_port = free_port(), free_port()
    # pulsar:// URLs: lookups answer both, the pulsar+ssl:// one for clients on TLS
    placement = placement_flags(store_port, coordinator_port)
    flags = tls.flags("--tls-client-auth", "require")
    coordinator = ServePod(
        work, "tc-0", "coordinator", extra=[*flags, *placement, "--listen", f"127.0.0.1:{coordinator_port}"]
    )
    store = ServePod(
        work, "pas-0", "store", extra=[*flags, *placement, "--listen", f"127.0.0.1:{store_port}"]
    )
    try:
        start_tls_pod(coordinator, tls.client_settings())
        start_tls_pod(store, tls.client_settings())
        yield coordinator, store
    finally:
        coordinator.stop()
        store.stop()


async def test_transactions_over_tls_end_on_the_store_over_mutual_tls(
    tls: TlsFiles, tls_cluster: tuple[ServePod, ServePod]
) -> None:
    coordinator, store = tls_cluster
    topic = "persistent://t/ns/tls-txns"
    async with Client(
        coordinators=[coordinator.listen], stores=[store.listen], tls=tls.client_settings()
    ) as c:
        consumer = await c.subscribe(topic, "s")
        producer = await c.create_producer(topic)
        for i in range(5):
            txn = await c.new_transaction()
            await producer.send(f"m{i}".encode(), txn=txn)
            await txn.commit()  # the coordinator ends it on the store: pod to pod, mutual TLS
        received = [await asyncio.wait_for(consumer.receive(), 10) for _ in range(5)]
        assert [m.data for m in received] == [f"m{i}".encode() for i in range(5)]
    assert "Traceback" not in coordinator.log() + store.log()


def test_pulsar_client_produces_and_consumes_over_pulsar_ssl(
    tls: TlsFiles, tls_cluster: tuple[ServePod, ServePod]
) -> None:
    _, store = tls_cluster
    client = pulsar.Client(
        f"pulsar+ssl://{store.listen}",
        tls_trust_certs_file_path=str(tls.ca_file),
        tls_validate_hostname=True,
        authentication=pulsar.AuthenticationTLS(
            str(tls.directory / "client.crt"), str(tls.directory / "client.key")
        ),
        operation_timeout_seconds=15,
    )
    try:
        topic = "persistent://public/default/over-tls"
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            producer.send(f"p{i}".encode())
        got = []
        for _ in range(10):
            message = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(message)
            got.append(message.data())
        assert got == [f"p{i}".encode() for i in range(10)]
    finally:
        client.close()


def _admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txnkeeper.cli", "admin", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_admin_cli_over_https_and_tls_metrics(tls: TlsFiles, tls_cluster: tuple[ServePod, ServePod]) -> None:
    coordinator, _ = tls_cluster
    url = f"https://{coordinator.admin}"
    ok = _admin("--url", url, "--tls-ca-file", str(tls.ca_file), "info")
    assert ok.returncode == 0, ok.stderr
    assert '"role": "coordinator"' in ok.stdout
    untrusted = _admin("--url", url, "info")  # the system's CAs do not know the test CA
    assert untrusted.returncode == 1
    assert "certificate is not signed by a trusted CA" in untrusted.stderr, untrusted.stderr
    wait_until_sync(
        lambda: (
            "refusing admin connection from 127.0.0.1:" in coordinator.log()
            and "it does not trust this server's certificate" in coordinator.log()
        ),
        10,
        "the admin refusal logged",
    )
    metrics = https_metrics(coordinator, tls.client_settings())
    for listener in ("admin", "client", "peers"):
        line = next(
            ln
            for ln in metrics.splitlines()
            if ln.startswith(f'txnkeeper_tls_certificate_expiry_seconds{{listener="{listener}"}}')
        )
        assert 80 * 86400 < float(line.split()[-1]) <= 90 * 86400  # the test certificate's 90 days
    assert "txnkeeper_tls_reload_errors_total 0.0" in metrics


async def test_plaintext_and_certificateless_clients_are_refused_at_the_handshake(
    tls: TlsFiles, tls_cluster: tuple[ServePod, ServePod]
) -> None:
    _, store = tls_cluster
    plaintext = await connect(store.listen)  # txnkeeper's own protocol, no TLS
    from txnkeeper.pb import txnkeeper_api_pb2 as api

    command = api.Command()
    command.auth_challenge.SetInParent()
    with pytest.raises(ConnectionClosedError):
        await plaintext.request(command, 10)
    plaintext.close()
    with pytest.raises(ConnectionClosedError, match="the server requires a client certificate"):
        async with Client(
            stores=[store.listen], coordinators=[], tls=tls.client_settings(with_cert=False)
        ) as c:
            await (await c.create_producer("persistent://t/ns/no-cert")).send(b"x")
    wait_until_sync(
        lambda: (
            "it did not start a TLS handshake (a plaintext client on a TLS port?)" in store.log()
            and "it sent no client certificate and this listener requires one" in store.log()
        ),
        10,
        "both refusals logged",
    )
    assert "Traceback" not in store.log()


# --- a server presenting a bad certificate ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("expired", r"certificate has expired \(notAfter \d{4}-\d\d-\d\d"),
        ("wrong-host", r"hostname mismatch: certificate is for elsewhere.example, not 127.0.0.1"),
        ("other-ca", r"certificate is not signed by a trusted CA \(CA file .*ca.crt\)"),
    ],
)
async def test_client_names_what_is_wrong_with_the_server_certificate(
    tls: TlsFiles, tmp_path: Path, kind: str, expected: str
) -> None:
    issued = {
        "expired": lambda: expired(tls.ca),
        "wrong-host": lambda: issue(tls.ca, hosts=("elsewhere.example",)),
        "other-ca": lambda: issue(make_ca("another CA")),
    }[kind]()
    cert, key = issued.write(tmp_path, "server")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, ssl=context)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        with pytest.raises(TlsHandshakeError, match=expected):
            await connect(address, tls=StaticClientTls(tls.client_settings()))
    finally:
        server.close()


# --- refusing to start -------------------------------------------------------------------------------


def _serve_fails(tmp_path: Path, *flags: str) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnkeeper.cli",
            "serve",
            "--role",
            "store",
            "--data-dir",
            str(tmp_path / "d"),
            *flags,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def test_serve_refuses_an_expired_certificate_a_mismatched_key_and_a_missing_file(
    tls: TlsFiles, tmp_path: Path
) -> None:
    old_cert, old_key = expired(tls.ca).write(tmp_path, "expired")
    err = _serve_fails(
        tmp_path,
        "--tls-cert-file",
        str(old_cert),
        "--tls-key-file",
        str(old_key),
        "--tls-ca-file",
        str(tls.ca_file),
    )
    assert f"certificate file {old_cert}: certificate has expired (notAfter" in err
    other_cert, _ = issue(tls.ca).write(tmp_path, "other")
    err = _serve_fails(
        tmp_path,
        "--tls-cert-file",
        str(other_cert),
        "--tls-key-file",
        str(tls.key_file),
        "--tls-ca-file",
        str(tls.ca_file),
    )
    assert f"private key file {tls.key_file} does not match certificate file {other_cert}" in err
    err = _serve_fails(tmp_path, *tls.flags("--tls-ca-file", str(tmp_path / "missing.crt")))
    assert f"CA file {tmp_path / 'missing.crt'} cannot be read" in err
    bundle = write_bundle(tmp_path / "empty.crt")
    err = _serve_fails(tmp_path, *tls.flags("--tls-ca-file", str(bundle)))
    assert "holds no" in err and str(bundle) in err


# --- the settings (flags, env, the config file's "tls" section) ----------------------------------------


def _settings(tmp_path: Path, *args: str, config: Mapping[str, object] | None = None) -> object:
    import json

    from txnkeeper.cli import build_parser
    from txnkeeper.server import tls_settings

    path = None
    if config is not None:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
    ns = build_parser().parse_args(["serve", "--role", "store", "--data-dir", str(tmp_path), *args])
    return tls_settings.settings(ns, path)


def test_tls_settings_from_the_config_section_and_flags(tls: TlsFiles, tmp_path: Path) -> None:
    from txnkeeper.contract.tls import TlsServerSettings
    from txnkeeper.server.config import ConfigError

    section = {
        "certFile": str(tls.cert_file),
        "keyFile": str(tls.key_file),
        "caFile": str(tls.ca_file),
        "listeners": ["client", "peers"],
        "clientAuth": {"client": "require"},
        "reloadIntervalSeconds": 2,
    }
    got = _settings(tmp_path, config={"tls": section})
    assert got == TlsServerSettings(
        str(tls.cert_file),
        str(tls.key_file),
        str(tls.ca_file),
        frozenset({"client", "peers"}),
        {"client": "require", "admin": "none"},
        2.0,
    )
    flagged = _settings(
        tmp_path, "--tls-listeners", "admin", "--tls-admin-client-auth", "request", config={"tls": section}
    )
    assert isinstance(flagged, TlsServerSettings)
    assert flagged.listeners == {"admin"} and flagged.client_auth["admin"] == "request"
    assert _settings(tmp_path) is None  # no certificate: plaintext
    for config, args, message in (
        (
            {"tls": {**section, "listeners": ["client", "gossip"]}},
            (),
            "give one or more of client, admin, peers",
        ),
        ({"tls": {**section, "certfile": "x"}}, (), "tls has unknown keys ['certfile']"),
        ({"tls": {**section, "clientAuth": {"client": "always"}}}, (), "give none, request or require"),
        ({"tls": {**section, "reloadIntervalSeconds": 0}}, (), "must be seconds between 0.05 and 3600"),
        ({"tls": {k: v for k, v in section.items() if k != "caFile"}}, (), "TLS needs a CA file"),
        (None, ("--tls-ca-file", str(tls.ca_file)), "TLS settings were given without a certificate"),
        (None, ("--tls-cert-file", str(tls.cert_file)), "--tls-key-file is missing"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            _settings(tmp_path, *args, config=config)


async def test_operator_admin_client_over_https(
    tls: TlsFiles, tls_cluster: tuple[ServePod, ServePod]
) -> None:
    import aiohttp

    from txnkeeper.contract.admin import AdminClient, AdminError

    _, store = tls_cluster
    base = f"https://{store.admin}"
    async with aiohttp.ClientSession() as session:
        info = await AdminClient(session, tls=tls.client_settings(with_cert=False)).info(base)
        assert info["role"] == "store"
        assert await AdminClient(session, tls=tls.client_settings().context()).ready(base)
        with pytest.raises(AdminError, match=r"certificate is not signed by a trusted CA \(CA file \(system"):
            await AdminClient(session).info(base)
