"""A group of local runtime processes driven by the operator's rollout engine, like one custom resource.

`MemberGroup` is to the local fleet what reconcile.py is to the cluster: it translates processes into
the engine's `Observed`, persists the engine's progress (to a state file, write-ahead), and carries out
the one action the engine returns: restart a member at a version, toggle its batch log, roll its
ledgers over, or run the real verifier (`txnkeeper verify-invalidation`, Spark local mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from txnkeeper import statefile
from txnkeeper.contract.admin import COORDINATOR_LOG, PENDING_ACK_LOG, AdminClient, AdminError, BatchLog
from txnkeeper.fleet.certificates import FleetCertificates
from txnkeeper.fleet.process import RuntimeProcess
from txnkeeper.statefile import StateFileError, StateShapeError
from txnkeeper_operator.engine import (
    Action,
    ApplyTemplate,
    ConfigureBatchLog,
    Decision,
    Desired,
    EngineConfig,
    Observed,
    PodState,
    Progress,
    RestartPod,
    RolloverStores,
    RunVerifier,
    Template,
    VerifierReport,
    VerifierState,
    decide,
    describe,
    record_rollover,
)
from txnkeeper_operator.engine.persist import (
    MalformedReportError,
    format_time,
    progress_from_status,
    progress_to_status,
    report_from_json,
)

# The engine's progress (the operator keeps it in status.downgrade) as a checksummed state file; the
# previous release's plain JSON of the same document is still read.
PROGRESS_KIND = "fleet-downgrade-progress"
PROGRESS_VERSION = 1


@dataclass(frozen=True, slots=True)
class Role:
    """What differs between a coordinator group and a store group (mirrors the operator's Kind)."""

    name: str  # --role
    log: BatchLog  # where the admin API keeps this role's batch-log settings
    metrics_prefix: str


COORDINATOR = Role("coordinator", COORDINATOR_LOG, "pulsar_txn_tc")
STORE = Role("store", PENDING_ACK_LOG, "pulsar_txn_pending_ack_store")


def free_port() -> int:
    """A port for a member to keep across restarts (clients and coordinators hold its address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class MemberGroup:
    name: str
    role: Role
    work_dir: Path
    token_file: Path
    admin: AdminClient
    replicas: int
    coordinators: int = 0
    # Store groups: started with placement (--replicas this many; fleet/scaling.py moves their shards).
    placement_replicas: int = 0
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    spark_master: str = "local[2]"
    template: Template | None = None
    members: list[RuntimeProcess] = field(default_factory=list)
    verifier_proc: subprocess.Popen[bytes] | None = None
    last_report: VerifierReport | None = None
    failed_at: datetime | None = None
    failure: str = ""
    history: list[str] = field(default_factory=list)
    # TLS on every member (the fleet's CA; fleet/certificates.py), None: plaintext.
    certificates: FleetCertificates | None = None

    @property
    def state_file(self) -> Path:
        return self.work_dir / f"{self.name}.progress.json"

    @property
    def report_file(self) -> Path:
        return self.work_dir / f"{self.name}.verifier-report.json"

    # ---- persisted progress (what the operator keeps in status.downgrade) ---------------------------

    def load_progress(self) -> Progress:
        """The persisted progress (none yet: a fresh one); a damaged file is a StateFileError naming it."""
        doc = statefile.read(
            self.state_file, PROGRESS_KIND, frozenset({PROGRESS_VERSION}), legacy=statefile.parse_json
        )
        if doc is None or doc.body is None:  # None: no downgrade in progress
            return Progress()
        try:
            return progress_from_status(statefile.obj(doc.body, "downgrade progress"))
        except (StateShapeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateFileError(self.state_file, f"not valid downgrade progress ({exc!r})") from exc

    def save_progress(self, progress: Progress) -> None:
        statefile.write(self.state_file, PROGRESS_KIND, PROGRESS_VERSION, progress_to_status(progress))

    # ---- members ------------------------------------------------------------------------------------

    def _member(self, ordinal: int) -> RuntimeProcess:
        while len(self.members) <= ordinal:
            index = len(self.members)
            extra: list[str] = []
            if self.role is COORDINATOR:
                ids = [c for c in range(self.coordinators) if c % self.replicas == index]
                extra += ["--coordinators", str(self.coordinators)]
                extra += ["--coordinator-ids", ",".join(map(str, ids))]
            elif self.placement_replicas:
                extra += ["--replicas", str(self.placement_replicas)]
            self.members.append(
                RuntimeProcess(
                    name=f"{self.name}-{index}",
                    role=self.role.name,
                    data_dir=self.work_dir / "data" / f"{self.name}-{index}",
                    work_dir=self.work_dir,
                    release="",
                    token_file=self.token_file,
                    extra_args=extra,
                    listen=f"127.0.0.1:{free_port()}",
                    admin_listen=f"127.0.0.1:{free_port()}",
                    certificates=self.certificates,
                )
            )
        return self.members[ordinal]

    def member_process(self, ordinal: int) -> RuntimeProcess:
        return self._member(ordinal)

    def members_started(self) -> list[RuntimeProcess]:
        """The members "the StatefulSet" has (a scale-in removes the highest ordinals)."""
        return [m for m in self.members if m.release]

    async def resize(self, replicas: int) -> None:
        """What a StatefulSet does when its replicas change: start the missing members from the
        template; stop the ones past ``replicas`` and delete their data (the scaling engine shrinks
        only once they hold nothing: whenScaled: Delete)."""
        for ordinal in range(replicas):
            member = self._member(ordinal)
            if not member.running():
                self._start(member)
        for member in self.members[replicas:]:
            if member.release:
                await member.stop()
                member.release = ""
                shutil.rmtree(member.data_dir, ignore_errors=True)
        self.replicas = replicas

    def _start(self, member: RuntimeProcess) -> None:
        assert self.template is not None
        member.release = self.template.version
        member.config_file.write_text(json.dumps({"batchedWrite": self.template.batch.to_block()}))
        member.start()

    def client_addresses(self) -> list[str]:
        return [m.listen for m in self.members]

    @staticmethod
    def admin_base(member: RuntimeProcess) -> str:
        return f"{member.scheme}://{member.admin_listen}"

    # ---- observe -------------------------------------------------------------------------------------

    async def _observe_member(self, ordinal: int, member: RuntimeProcess) -> PodState:
        base = self.admin_base(member)
        if not member.running() or not member.ports_file.exists() or not await self.admin.ready(base):
            return PodState(ordinal, member.name, member.release, False, None)
        try:
            batch = (await self.admin.batch_log(base, self.role.log)).effective()
        except AdminError:
            return PodState(ordinal, member.name, member.release, True, None)
        return PodState(ordinal, member.name, member.release, True, batch)

    def _verifier_state(self) -> VerifierState:
        proc = self.verifier_proc
        running = proc is not None and proc.poll() is None
        if not running and self.report_file.exists():
            try:
                self.last_report = report_from_json(json.loads(self.report_file.read_text()))
            except (ValueError, MalformedReportError):
                self.last_report = None
        # Exit 0 (safe) and 1 (not safe) come with a report; anything else is a failed run, like a
        # failed Job in-cluster, and is retried after the engine's retry interval.
        if proc is not None and not running and proc.returncode not in (0, 1) and self.failed_at is None:
            self.failed_at = datetime.now(UTC)
            log = self.work_dir / f"{self.name}.verifier.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            self.failure = f"verifier exited {proc.returncode}: {' '.join(tail)[:200]}"
        return VerifierState(running, self.last_report, self.failed_at, self.failure)

    async def observe(self, now: datetime) -> Observed:
        pods = await asyncio.gather(
            *(self._observe_member(i, m) for i, m in enumerate(self.members) if m.release)
        )
        return Observed(self.template, tuple(pods), now, self._verifier_state())

    # ---- one reconcile step --------------------------------------------------------------------------

    async def step(self, desired: Desired) -> Decision:
        now = datetime.now(UTC)
        observed = await self.observe(now)
        decision = decide(desired, observed, self.load_progress(), self.engine_config)
        self.save_progress(decision.progress)  # write-ahead, as the operator does
        if decision.action is not None:
            self.history.append(describe(decision.action))
            progress = await self._execute(decision.action, desired, decision.progress)
            self.save_progress(progress)
        return decision

    async def _execute(self, action: Action, desired: Desired, progress: Progress) -> Progress:
        match action:
            case ApplyTemplate(version=version, batch=batch):
                self.template = Template(version, batch)
                for ordinal in range(desired.replicas):
                    member = self._member(ordinal)
                    if not member.running():
                        self._start(member)  # the StatefulSet creating missing pods
            case RestartPod(ordinal=ordinal):
                member = self.members[ordinal]
                await member.stop()
                self._start(member)
            case ConfigureBatchLog(ordinal=ordinal, batch=batch):
                await self.admin.set_batch_log(self.admin_base(self.members[ordinal]), self.role.log, batch)
            case RolloverStores(ordinal=ordinal, pod=pod):
                markers = await self.admin.rollover(self.admin_base(self.members[ordinal]))
                progress = record_rollover(progress, pod, markers)
                listed = ", ".join(f"{store}={ledger}" for store, ledger in sorted(markers.items()))
                self.history.append(f"  LastBatchedLedger on {pod}: {listed or 'no stores'}")
            case RunVerifier(markers=markers, taken_at=taken_at):
                self._run_verifier(markers, taken_at)
        return progress

    def _run_verifier(self, markers: dict[str, int] | Any, taken_at: datetime) -> None:
        # The previous report stays until the new run replaces it (as the ConfigMap does in-cluster):
        # a held downgrade keeps saying why while it is verified again.
        self.failed_at, self.failure = None, ""
        doc = {"takenAt": format_time(taken_at), "stores": dict(markers)}
        endpoints = [f"--endpoint={m.name}={self.admin_base(m)}" for m in self.members]
        log = (self.work_dir / f"{self.name}.verifier.log").open("ab")
        # Over TLS the verifier verifies the members against the fleet's CA and presents its client
        # certificate (TXNKEEPER_TLS_*, what a verifier Job gets from its mounted Secret).
        env = {**os.environ, **(self.certificates.env() if self.certificates is not None else {})}
        try:
            self.verifier_proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "txnkeeper.cli",
                    "verify-invalidation",
                    *endpoints,
                    "--markers-json",
                    json.dumps(doc),
                    "--output",
                    str(self.report_file),
                    "--master",
                    self.spark_master,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        finally:
            log.close()

    # ---- teardown ------------------------------------------------------------------------------------

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.members))
        proc = self.verifier_proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait, 15)

    def kill_all(self) -> None:
        """Last resort (an exception or Ctrl-C): nothing this group started survives."""
        for member in self.members:
            member.kill()
        proc = self.verifier_proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
