"""The executor-side code as one zip, for Spark masters whose executors may not have txnkeeper.

In local mode the executors are this machine's Python workers and import txnkeeper as installed. On a
cluster master they run elsewhere; the code they need (fetch + judge) is deliberately stdlib-only, so
shipping these few modules with `SparkContext.addPyFile` is all it takes, and it also guarantees the
executors judge with exactly the driver's rules.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import txnkeeper

# Everything a partition imports: the package roots, the stdlib-only verifier modules and the
# contract's freshness rule they re-export.
EXECUTOR_MODULES = (
    "__init__.py",
    "contract/__init__.py",
    "contract/freshness.py",
    "verifier/__init__.py",
    "verifier/decide.py",
    "verifier/fetch.py",
    "verifier/freshness.py",
    "verifier/job.py",
    "verifier/model.py",
    "verifier/shipping.py",
    "verifier/spark_k8s.py",
)


def executor_code_zip(directory: Path) -> Path:
    """Write `txnkeeper-verifier.zip` (importable as `txnkeeper.verifier`) into `directory`."""
    root = Path(txnkeeper.__file__).resolve().parent
    target = directory / "txnkeeper-verifier.zip"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for relative in EXECUTOR_MODULES:
            archive.write(root / relative, f"txnkeeper/{relative}")
    return target
