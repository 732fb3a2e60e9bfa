"""The zip shipped to remote executors is enough on its own: fetch and judge, and the offload audit's
segment checks, with only the stdlib."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from txnkeeper.ledger.offload.restore import inventory
from txnkeeper.verifier.model import VerifierInfraError
from txnkeeper.verifier.registration import wait_seconds
from txnkeeper.verifier.shipping import executor_code_zip
from txnkeeper.verifier.synthetic import PodAnswer, SyntheticPods, pod_document, store_entry

PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from txnkeeper.verifier.job import FetchSettings, check_pods
from txnkeeper.verifier.model import PodEndpoint
assert sys.modules["txnkeeper"].__file__.startswith(sys.argv[1]), sys.modules["txnkeeper"].__file__
endpoint = PodEndpoint("tc-0", sys.argv[2])
[(outcome, verdicts)] = check_pods([endpoint], {"log0": 7}, FetchSettings(timeout_s=5))
print(json.dumps([outcome.ok, [v.safe for v in verdicts], [v.reason for v in verdicts]]))
"""


def test_executor_zip_runs_without_site_packages(pods: SyntheticPods, tmp_path: Path) -> None:
    endpoint = pods.add_pod("tc-0", PodAnswer.document(pod_document("tc-0", [store_entry("log0", [8])])))
    archive = executor_code_zip(tmp_path)
    # -S: no site-packages at all, so neither the installed txnkeeper nor aiohttp/pyspark can help.
    completed = subprocess.run(
        [sys.executable, "-S", "-c", PROBE, str(archive), str(endpoint.url)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    ok, safe, reasons = json.loads(completed.stdout)
    assert ok is True and safe == [True]
    assert reasons == ["oldest ledger 8 > LastBatchedLedger 7; no live batched entries"]


OFFLOAD_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from txnkeeper.verifier.offload_audit import SegmentRef, check_partition
assert sys.modules["txnkeeper"].__file__.startswith(sys.argv[1]), sys.modules["txnkeeper"].__file__
refs = [SegmentRef("pas-0", "t", uuid, "Offloaded") for uuid in json.loads(sys.argv[3])]
settings = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": sys.argv[2]}
[(executor, results)] = check_partition(refs, settings, 100)
print(json.dumps([executor.executor, [r.sampled for r in results], [list(r.findings) for r in results]]))
"""


def test_executor_zip_runs_the_offload_audit_without_site_packages(
    tiered: tuple[Path, Path], tmp_path: Path
) -> None:
    root, tier = tiered
    uuids = [s["uuid"] for s in inventory(root).to_json()["stores"][0]["segmentList"]]
    archive = executor_code_zip(tmp_path)
    completed = subprocess.run(
        [sys.executable, "-S", "-c", OFFLOAD_PROBE, str(archive), str(tier), json.dumps(uuids)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    executor, sampled, findings = json.loads(completed.stdout)
    assert executor == "unknown"  # not in a Spark task: said so, not guessed
    assert len(sampled) == len(uuids) >= 2 and all(n > 0 for n in sampled)
    assert findings == [[]] * len(uuids)


CLEANUP_PROBE = """
import os, sys
from txnkeeper.verifier.shipping import ship_executor_code

class Context:  # the two attributes and the one call ship_executor_code uses of a SparkContext
    master = "spark://127.0.0.1:7077"
    applicationId = "app-1"
    def addPyFile(self, path):
        assert os.path.isfile(path)
        print(os.path.dirname(path))

ship_executor_code(Context())
"""


def test_the_shipped_zip_is_removed_when_the_driver_exits() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", CLEANUP_PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    directory = Path(completed.stdout.strip())
    assert directory.name.startswith("txnkeeper-verifier-")
    assert not directory.exists()


@pytest.mark.parametrize("text", ["0", "-1", "x", "1e9", "nan"])
def test_a_bad_executor_wait_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(VerifierInfraError, match="TXNKEEPER_VERIFIER_EXECUTOR_WAIT_SECONDS"):
        wait_seconds({"TXNKEEPER_VERIFIER_EXECUTOR_WAIT_SECONDS": text})
    assert wait_seconds({}) == 240.0 and wait_seconds({"TXNKEEPER_VERIFIER_EXECUTOR_WAIT_SECONDS": "8"}) == 8
