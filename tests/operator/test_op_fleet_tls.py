"""The local fleet with TLS on (issue 28): its own CA and a leaf per process, every listener over TLS,
members reaching each other with mutual TLS. Under transactional load the store group scales 2 -> 3
(shards moved to the new member over https, the target presenting its certificate), then the leaves
are renewed and the CA rotated in its three steps (fleet/rotation.py): no transaction fails, no process
restarts, new connections are served the new certificates and a client trusting only the retired CA
is refused.
"""

from __future__ import annotations

import asyncio
import io
import secrets
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from txnkeeper.client import TlsHandshakeError
from txnkeeper.client.client import Client
from txnkeeper.contract import pki
from txnkeeper.contract.admin import AdminClient
from txnkeeper.contract.tls import TlsClientSettings
from txnkeeper.fleet.certificates import FleetCertificates
from txnkeeper.fleet.demo import Fleet
from txnkeeper.fleet.display import Display
from txnkeeper.fleet.group import COORDINATOR, STORE, MemberGroup
from txnkeeper.fleet.load import TransactionalLoad
from txnkeeper.fleet.process import RuntimeProcess
from txnkeeper.fleet.rotation import CertificateRotation, served_fingerprint
from txnkeeper.fleet.scaling import ScalingDriver
from txnkeeper_operator.engine import BatchSettings, Desired


async def _settle(driver: ScalingDriver, replicas: int) -> None:
    deadline = asyncio.get_running_loop().time() + 150
    while True:
        decision = await driver.step(replicas)
        if (
            decision.phase == "Balanced"
            and not decision.actions
            and len(driver.group.members_started()) == replicas
        ):
            return
        assert asyncio.get_running_loop().time() < deadline, f"{decision.phase}: {decision.message}"
        await asyncio.sleep(0.2)


async def _progress(load: TransactionalLoad, count: int) -> None:
    """Until ``count`` more producer transactions committed (the load keeps running meanwhile)."""
    target = load.figures.committed_txns + count
    deadline = asyncio.get_running_loop().time() + 60
    while load.figures.committed_txns < target:
        assert asyncio.get_running_loop().time() < deadline, f"load stalled: {load.figures.summary()}"
        await asyncio.sleep(0.1)


def _ca_file(path: Path, *cas: x509.Certificate) -> TlsClientSettings:
    path.write_bytes(pki.bundle_pem(cas))
    return TlsClientSettings(str(path))


@pytest.mark.timeout(300)
async def test_fleet_over_tls_scales_with_moves_over_tls_and_rotates_certificates_under_load(
    tmp_path: Path,
) -> None:
    certificates = FleetCertificates.create(tmp_path / "tls")
    token = tmp_path / "token"
    token.write_text(secrets.token_urlsafe(16))
    token.chmod(0o600)
    lines: list[str] = []
    async with aiohttp.ClientSession() as session:
        admin = AdminClient(
            session, timeout_seconds=30, token=token.read_text(), tls=certificates.client_context()
        )
        tc = MemberGroup("tc", COORDINATOR, tmp_path, token, admin, replicas=1, coordinators=1)
        pas = MemberGroup("pas", STORE, tmp_path, token, admin, replicas=2, placement_replicas=2)
        for group in (tc, pas):
            group.certificates = certificates
        fleet = Fleet([tc, pas], Display(io.StringIO()), certificates=certificates)
        driver = ScalingDriver(pas, admin, token.read_text(), lines.append)
        load: TransactionalLoad | None = None

        def members() -> list[RuntimeProcess]:
            return [m for g in (tc, pas) for m in g.members_started() if m.running()]

        try:
            want = {"tc": Desired("2.0.0", 1, BatchSettings()), "pas": Desired("2.0.0", 2, BatchSettings())}
            assert await fleet.drive(want, 60)
            for member in members():
                assert pas.admin_base(member).startswith("https://") and member.scheme == "https"
                key = certificates.leaf(member.name).key_file
                assert key.stat().st_mode & 0o777 == 0o600, key
            assert certificates.ca_key_file.stat().st_mode & 0o777 == 0o600
            load = TransactionalLoad(tc.client_addresses(), pas.client_addresses(), tls=certificates)
            load.start()
            await _progress(load, 20)

            # 2 -> 3: the new member's leaf is issued when it is added; the moves pull over https.
            await _settle(driver, 3)
            record = driver.load().record
            target = record.member(2)
            assert target is not None and target.admin_url.startswith("https://"), record
            assert any("copy shard" in line for line in lines) and driver.owners()["pas-2"] > 0
            await _progress(load, 20)

            pids = {m.name: m.proc.pid for m in members() if m.proc is not None}
            failures = sum(load.figures.failures.values())
            old_ca = certificates.ca.cert
            rotation = CertificateRotation(certificates, admin, members, lines.append, step_timeout_s=45)
            await rotation.renew_leaves()
            await _progress(load, 20)
            await rotation.rotate_ca()
            await _progress(load, 20)
            assert sum(load.figures.failures.values()) == failures, load.figures.summary()
            assert {m.name: m.proc.pid for m in members() if m.proc is not None} == pids, "no restarts"
            assert len(pids) == 4
            for text in ("renew leaves", "trust-new", "reissue", "retire-old"):
                assert any(text in line and "taken by 4 process(es)" in line for line in lines), lines
        finally:
            if load is not None:
                await load.stop()

        try:
            # New connections: served leaves of the new CA, the bundle holds it alone.
            new_ca = certificates.ca.cert
            assert new_ca != old_ca
            assert pki.load_bundle(certificates.ca_file.read_bytes(), what="ca.crt") == [new_ca]
            new_only = _ca_file(tmp_path / "new-ca.crt", new_ca)
            for member in members():
                served = await asyncio.to_thread(served_fingerprint, member.listen, new_only.context())
                leaf = pki.load_bundle(certificates.leaf(member.name).cert_file.read_bytes(), what="leaf")[0]
                assert served == pki.fingerprint(leaf) and pki.signed_by(leaf, new_ca)
            async with Client(
                coordinators=tc.client_addresses(), stores=pas.client_addresses(), tls=new_only
            ) as client:
                txn = await client.new_transaction()
                await (await client.create_producer("persistent://public/demo/after")).send(b"y", txn=txn)
                await txn.commit()
            old_only = _ca_file(tmp_path / "old-ca.crt", old_ca)
            with pytest.raises(TlsHandshakeError, match="certificate is not signed by a trusted CA"):
                async with Client(coordinators=tc.client_addresses(), stores=[], tls=old_only) as client:
                    await client.new_transaction()
            for member in members():
                assert "Traceback" not in member.log_tail(200), member.name
        finally:
            for group in (tc, pas):
                await group.stop()
                group.kill_all()
