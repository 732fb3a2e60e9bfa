"""txnkeeper's code as one zip, for Spark masters whose executors may not have txnkeeper.

In local mode the executors are this machine's Python workers and import txnkeeper as installed. On a
cluster master (standalone, Kubernetes) they run elsewhere; the code both jobs run there
(verify-invalidation's fetch + judge, verify-offload's segment checks over the filesystem blob store) is
deliberately stdlib-only, so shipping it with `SparkContext.addPyFile` is all it takes, and it also
guarantees the executors judge with exactly the driver's rules. The zip holds the whole package, not
just those modules: it goes in front of the executors' sys.path, so a partial one would hide an
installed txnkeeper from any other job of the same application. (The S3 driver also needs boto3 on the
executors: the verifier image has it.)
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any

import txnkeeper
from txnkeeper.verifier.model import VerifierInfraError

ARCHIVE_NAME = "txnkeeper-verifier.zip"
_shipped: set[str] = set()
_shipping = threading.Lock()


def executor_modules(root: Path) -> list[str]:
    """Paths (relative to the txnkeeper package) of every module shipped: all of them."""
    return sorted(
        str(path.relative_to(root)) for path in root.rglob("*.py") if "__pycache__" not in path.parts
    )


def executor_code_zip(directory: Path) -> Path:
    """Write `txnkeeper-verifier.zip` (importable as `txnkeeper`) into `directory`."""
    root = Path(txnkeeper.__file__).resolve().parent
    target = directory / ARCHIVE_NAME
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for relative in executor_modules(root):
            archive.write(root / relative, f"txnkeeper/{relative}")
    return target


def ship_executor_code(context: Any) -> None:
    """Add the zip to a non-local SparkContext, once per application (a second file of the same name
    would clash in the executors' work directories)."""
    if str(context.master).startswith("local"):
        return
    with _shipping:
        application = str(context.applicationId)
        if application in _shipped:
            return
        directory = Path(tempfile.mkdtemp(prefix="txnkeeper-verifier-"))
        # Spark's file server reads the zip from here for as long as the application may start
        # executors, so it goes when the driver process does, not when this call returns.
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        try:
            context.addPyFile(str(executor_code_zip(directory)))
        except Exception as exc:
            raise VerifierInfraError(f"cannot ship the verifier code to the executors: {exc}") from exc
        _shipped.add(application)
