"""`txnkeeper demo`: the whole lifecycle on this machine, driven by the operator's own rollout engine.

Three coordinator processes and two store processes start at release 1.0.0 (format level 1) under
transactional load; the fleet upgrades them to 2.0.0 one at a time with the batch log off, enables
batching member by member, shows what batching does to the logs, scales the stores out to three
(the operator's scaling engine moves shards to the new member while clients follow redirects) and
rebalances, rotates the certificates under load (new leaves, then a new CA in three steps), then
downgrades back to 1.0.0: batching off, every ledger rolled over, the Spark verifier run until it
proves no batched entry is still live (a transaction deliberately left open holds the gate until it
commits), and only then the old release, which itself refuses to start on live batched data. Every
process is stopped at the end, also on error or Ctrl-C.

TLS is on unless --no-tls: the fleet makes its own CA and a leaf per process (WORK_DIR/tls,
fleet/certificates.py), every listener serves TLS, members reach each other with mutual TLS, and every
client of the demo (the load, admin calls, shard moves, the Spark verifier) verifies the CA.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp

from txnkeeper.client.client import Client
from txnkeeper.client.transaction import Transaction
from txnkeeper.contract.admin import AdminClient, AdminError
from txnkeeper.fleet.certificates import FleetCertificates
from txnkeeper.fleet.display import Display
from txnkeeper.fleet.group import COORDINATOR, STORE, MemberGroup
from txnkeeper.fleet.load import TransactionalLoad
from txnkeeper.fleet.process import RuntimeProcess
from txnkeeper.fleet.rotation import CertificateRotation, RotationError
from txnkeeper.fleet.scaling import ScalingDriver
from txnkeeper.protocol.rpc import ClientTls
from txnkeeper_operator.engine import BatchSettings, Decision, Desired, EngineConfig, Phase

OLD, NEW = "1.0.0", "2.0.0"
# PIP-160's defaults except the delay: at this demo's light load a 1 ms window rarely holds two records.
BATCHED = BatchSettings(enabled=True, max_records=512, max_size_bytes=4 * 1024 * 1024, max_delay_millis=10)
RECONCILE_PERIOD_S = 0.25
HELD_TXN_TIMEOUT_MS = 90_000
SCALE_DEADLINE_S = 120


class DemoError(RuntimeError):
    """A stage did not reach its goal in time; the message says where it stopped."""


@dataclass
class Fleet:
    groups: list[MemberGroup]
    display: Display
    load: TransactionalLoad | None = None
    certificates: FleetCertificates | None = None  # TLS on (fleet/certificates.py)

    async def drive(
        self,
        desired: dict[str, Desired],
        deadline_s: float,
        goal: Phase = Phase.READY,
        on_step: Callable[[dict[str, Decision]], Awaitable[None]] | None = None,
    ) -> bool:
        """Reconcile every group until all reach ``goal`` with nothing left to do, or the deadline;
        ``on_step`` sees every round's decisions (the demo's scripted user acts through it)."""
        deadline = time.monotonic() + deadline_s
        last: dict[str, Decision] = {}
        while time.monotonic() < deadline:
            states: dict[str, str] = {}
            for group in self.groups:
                seen = len(group.history)
                try:
                    decision = await group.step(desired[group.name])
                except AdminError as err:
                    self.display.line(f"{group.name:>3}: action failed, retrying: {err}")
                    continue
                last[group.name] = decision
                self.display.decision(group, decision, seen)
                states[group.name] = _summary(group, decision)
            self.display.status(self.groups, states, self.load.figures if self.load else None)
            if on_step is not None:
                await on_step(last)
            if len(last) == len(self.groups) and all(
                d.phase == goal and d.action is None for d in last.values()
            ):
                return True
            await asyncio.sleep(RECONCILE_PERIOD_S)
        return False


def _summary(group: MemberGroup, decision: Decision) -> str:
    members = " ".join(m.release for m in group.members)
    return f"{decision.phase} [{members}]"


def batch_figures(metrics: str, prefix: str) -> dict[str, float]:
    """Records per batch and flush triggers, summed over labels, from a member's Prometheus text."""
    figures: dict[str, float] = {}
    for name in (
        "bufferedwriter_batch_records_sum",
        "bufferedwriter_batch_records_count",
        "bufferedwriter_flush_trigger_max_records_total",
        "bufferedwriter_flush_trigger_max_size_total",
        "bufferedwriter_flush_trigger_max_delay_total",
        "bufferedwriter_flush_trigger_large_data_total",
    ):
        total = 0.0
        for match in re.finditer(rf"^{prefix}_{name}(?:{{[^}}]*}})? (\S+)$", metrics, re.MULTILINE):
            total += float(match.group(1))
        figures[name] = total
    return figures


async def _figures(groups: list[MemberGroup], admin: AdminClient, display: Display) -> None:
    for group in groups:
        for member in group.members:
            base = group.admin_base(member)
            try:
                figures = batch_figures(await admin.metrics(base), group.role.metrics_prefix)
                ledgers = await admin.ledgers(base)
            except AdminError as err:
                display.line(f"{member.name}: figures unavailable: {err}")
                continue
            batches = figures["bufferedwriter_batch_records_count"]
            records = figures["bufferedwriter_batch_records_sum"]
            per_batch = records / batches if batches else 0.0
            live = [s.get("liveEntries", {}) for s in ledgers.get("stores", [])]
            batched = sum(int(x.get("batched", 0)) for x in live)
            unbatched = sum(int(x.get("unbatched", 0)) for x in live)
            triggers = ", ".join(
                f"{k.removeprefix('bufferedwriter_flush_trigger_').removesuffix('_total')}={int(v)}"
                for k, v in figures.items()
                if k.startswith("bufferedwriter_flush_trigger") and v
            )
            display.line(
                f"{member.name}: {int(records)} records in {int(batches)} batched entries "
                f"({per_batch:.1f} records/entry; flushes by {triggers or 'none yet'}); "
                f"live entries now: {batched} batched, {unbatched} unbatched in {len(live)} store(s)"
            )


async def run_demo(work_dir: Path, display: Display, load_seconds: float, *, tls: bool = True) -> int:
    token_file = work_dir / "admin-token"
    token_file.write_text(secrets.token_urlsafe(24))
    token_file.chmod(0o600)  # serve refuses a token file others can read
    config = EngineConfig(verifier_retry=timedelta(seconds=3), verifier_timeout=timedelta(seconds=90))
    certificates = FleetCertificates.create(work_dir / "tls") if tls else None
    if certificates is not None:
        display.line(
            f"TLS: on (CA {certificates.ca_file}; every listener, mutual TLS between members;"
            " --no-tls turns it off)"
        )
    else:
        display.line("TLS: off (--no-tls)")
    async with aiohttp.ClientSession() as session:
        admin = AdminClient(
            session,
            timeout_seconds=10,
            token=token_file.read_text(),
            tls=certificates.client_context() if certificates is not None else None,
        )
        tc = MemberGroup("tc", COORDINATOR, work_dir, token_file, admin, replicas=3, coordinators=3)
        pas = MemberGroup("pas", STORE, work_dir, token_file, admin, replicas=2, placement_replicas=2)
        for group in (tc, pas):
            group.engine_config = config
            group.certificates = certificates
        fleet = Fleet([tc, pas], display, certificates=certificates)
        try:
            return await _lifecycle(fleet, admin, load_seconds, token_file.read_text())
        finally:
            if fleet.load is not None:
                await fleet.load.stop()
            for group in fleet.groups:
                await group.stop()
            for group in fleet.groups:
                group.kill_all()
            leftovers = [m.name for g in fleet.groups for m in g.members if m.running()]
            display.line(f"stopped every process{'; LEFT RUNNING: ' + str(leftovers) if leftovers else ''}")


async def _lifecycle(fleet: Fleet, admin: AdminClient, load_seconds: float, token: str) -> int:
    display = fleet.display
    tc, pas = fleet.groups

    def want(version: str, batch: BatchSettings) -> dict[str, Desired]:
        return {"tc": Desired(version, 3, batch), "pas": Desired(version, pas.replicas, batch)}

    display.stage(f"1/6 install: 3 coordinators + 2 stores at {OLD} (format level 1: unbatched only)")
    if not await fleet.drive(want(OLD, BatchSettings()), 60):
        raise DemoError("the fleet did not become ready at the old release")
    fleet.load = TransactionalLoad(tc.client_addresses(), pas.client_addresses(), tls=fleet.certificates)
    fleet.load.start()
    display.line(f"transactional load started on {len(fleet.load.topics)} topics")
    await asyncio.sleep(load_seconds)
    display.line(f"load: {fleet.load.figures.summary()}")

    display.stage(f"2/6 upgrade to {NEW} with batchedWrite.enabled=true (roll unbatched, then enable)")
    if not await fleet.drive(want(NEW, BATCHED), 90):
        raise DemoError("the upgrade did not finish")
    display.line(f"load: {fleet.load.figures.summary()}")

    display.stage("3/6 batching figures after a few seconds of load")
    await asyncio.sleep(load_seconds)
    await _figures(fleet.groups, admin, display)

    display.stage("4/6 scale the stores 2 -> 3 under load, then a rebalance (the operator's scaling engine)")
    await _scale_out(fleet, ScalingDriver(pas, admin, token, display.line), 3)
    display.line(f"load: {fleet.load.figures.summary()}")

    display.stage("5/6 rotate the certificates under load: new leaves, then a new CA in three steps")
    await _rotate(fleet, admin)

    display.stage(f"6/6 downgrade to {OLD}: disable, roll ledgers over, verify with Spark, then roll back")
    # A transaction left open across the downgrade keeps its batched log records live: the gate must
    # hold until it ends. The scripted user commits it once the operator says what it is waiting for.
    held = await HeldTransaction.begin(tc.client_addresses(), pas.client_addresses(), fleet.certificates)
    display.line(f"a transaction {held.txn_id} is left open: its batched log records stay live")

    async def release_when_blocked(decisions: dict[str, Decision]) -> None:
        if held.is_open and any(d.phase == Phase.DOWNGRADE_BLOCKED for d in decisions.values()):
            display.line(f"the operator holds the downgrade; the user ends {held.txn_id}")
            display.line(await held.commit())

    try:
        done = await fleet.drive(want(OLD, BatchSettings()), 150, on_step=release_when_blocked)
    finally:
        await held.close()
    display.line(f"load: {fleet.load.figures.summary()}")
    for group in fleet.groups:
        report = group.last_report
        if report is not None:
            verdict = "safe" if report.safe else "not safe"
            display.line(
                f"{group.name:>3}: last verifier report {verdict}, {len(report.stores)} store(s), "
                f"generated {report.generated_at:%H:%M:%S}"
            )
    if not done:
        display.line("downgrade still HELD at the gate (the verifier has not proven it safe): nothing rolled")
        return 1
    versions = {m.release for g in fleet.groups for m in g.members}
    display.line(
        f"downgrade complete: every member runs {', '.join(sorted(versions))} and opened its stores at "
        "format level 1 (a level-1 runtime refuses to start on a live batched entry)"
    )
    return 0


async def _rotate(fleet: Fleet, admin: AdminClient) -> None:
    """What the operator's certificate manager does, on the fleet (fleet/rotation.py): every step
    waits until each process reports it took the new files; none restarts, open connections stay."""
    display = fleet.display
    if fleet.certificates is None or fleet.load is None:
        display.line("TLS is off (--no-tls): nothing to rotate")
        return
    groups = fleet.groups

    def members() -> list[RuntimeProcess]:
        return [m for g in groups for m in g.members_started() if m.running()]

    pids = {m.name: m.proc.pid for m in members() if m.proc is not None}
    failed = sum(fleet.load.figures.failures.values())
    rotation = CertificateRotation(fleet.certificates, admin, members, display.line)
    try:
        await rotation.renew_leaves()
        await rotation.rotate_ca()
    except RotationError as err:
        raise DemoError(str(err)) from err
    restarted = sorted(m.name for m in members() if m.proc is None or pids.get(m.name) != m.proc.pid)
    display.line(
        f"every process serves a leaf of the new CA ({fleet.certificates.ca.fingerprint[:16]}...);"
        f" restarted: {', '.join(restarted) or 'none'}; load retries during the rotation:"
        f" {sum(fleet.load.figures.failures.values()) - failed}"
    )
    display.line(f"load: {fleet.load.figures.summary()}")


async def _scale_out(fleet: Fleet, driver: ScalingDriver, replicas: int) -> None:
    """Scale the store group out and rebalance, as `kubectl scale` and then the rebalance annotation
    do in a cluster: the new member starts, becomes ready, then receives shards one move at a time
    while the load's clients follow the redirects."""
    display = fleet.display
    before = driver.owners()
    for rebalance in (False, True):
        deadline = time.monotonic() + SCALE_DEADLINE_S
        requested = rebalance  # the annotation: removed once the engine says the rebalance is done
        while True:
            decision = await driver.step(replicas, rebalance=requested)
            requested = requested and not decision.rebalance_done
            if decision.phase == "Balanced" and not decision.actions and not requested:
                break
            if time.monotonic() > deadline:
                raise DemoError(f"scaling did not settle: {decision.phase}: {decision.message}")
            await asyncio.sleep(RECONCILE_PERIOD_S)
        rebalance_what = "the requested rebalance" if rebalance else f"the scale-out to {replicas}"
        display.line(f"{driver.group.name}: {rebalance_what} is done: {decision.message}")
    after = driver.owners()
    display.line(
        f"shards per member: before {before}, after {after} (placement epoch {driver.load().record.epoch})"
    )


class HeldTransaction:
    """One transaction with a message produced in it, kept open until ``commit``."""

    def __init__(self, client: Client, txn: Transaction) -> None:
        self._client = client
        self._txn = txn
        self.is_open = True

    @property
    def txn_id(self) -> str:
        return str(self._txn.txn_id)

    @classmethod
    async def begin(
        cls, coordinators: list[str], stores: list[str], tls: ClientTls | None = None
    ) -> HeldTransaction:
        client = Client(coordinators=coordinators, stores=stores, tls=tls)
        try:
            producer = await client.create_producer("persistent://public/demo/held")
            # If the commit below failed, the coordinator's timeout would still end it (and free the gate).
            txn = await client.new_transaction(timeout_ms=HELD_TXN_TIMEOUT_MS)
            await producer.send(b"held across the downgrade", txn=txn)
        except BaseException:
            await client.close()
            raise
        return cls(client, txn)

    async def commit(self) -> str:
        """Commit; returns what happened (a failure is reported, the coordinator's timeout ends it)."""
        self.is_open = False
        try:
            await self._txn.commit()
        except Exception as err:
            return f"commit of {self.txn_id} failed ({type(err).__name__}: {err}); its timeout will end it"
        return f"committed {self.txn_id}"

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.is_open:
                await self._txn.abort()
        await self._client.close()


def run(ns: argparse.Namespace) -> int:
    display = Display()
    work_dir = Path(ns.work_dir) if ns.work_dir else Path(tempfile.mkdtemp(prefix="txnkeeper-demo-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    display.line(f"txnkeeper local fleet demo (work dir {work_dir})")
    try:
        code = asyncio.run(run_demo(work_dir, display, ns.load_seconds, tls=not ns.no_tls))
    except DemoError as err:
        display.line(f"demo FAILED: {err} (logs in {work_dir})")
        code = 2
    except KeyboardInterrupt:
        display.line("interrupted; every process was stopped")
        code = 130
    finally:
        display.close()
    if code == 0 and not ns.keep and not ns.work_dir:
        shutil.rmtree(work_dir, ignore_errors=True)
    return code


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the whole lifecycle (load, upgrade, batching, verified downgrade) on local processes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--work-dir", help="keep data, logs and state here (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir after success")
    parser.add_argument("--load-seconds", type=float, default=4.0, help="load between stages")
    parser.add_argument(
        "--no-tls",
        action="store_true",
        help="plaintext listeners (default: TLS on every listener with a CA of the fleet's own, mutual"
        " TLS between members; certificates in WORK_DIR/tls)",
    )
    parser.set_defaults(func=run)


if __name__ == "__main__":
    from txnkeeper.cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
