"""docs/contracts.md §0: the operator imports nothing of the runtime but ``txnkeeper.contract``, and the
contract modules import only the standard library and each other (the admin client also aiohttp), so
sharing them drags no runtime internals along."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_operator_imports_only_the_runtimes_contract_modules() -> None:
    offending = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "operator/txnkeeper_operator").rglob("*.py")
        for name in _imports(path)
        if (name == "txnkeeper" or name.startswith("txnkeeper."))
        and not name.startswith("txnkeeper.contract")
    )
    assert offending == []


# The admin-API client is the one contract module that speaks HTTP (issue 15: "one stdlib/aiohttp
# client in the contract package used by both"); aiohttp is a dependency of the operator anyway.
ALLOWED_BEYOND_STDLIB = {"admin.py": {"aiohttp"}}


def test_contract_modules_import_only_the_standard_library() -> None:
    modules = sorted((ROOT / "runtime/txnkeeper/contract").glob("*.py"))
    assert modules, "the contract package is missing"
    offending = sorted(
        f"{path.name}: {name}"
        for path in modules
        for name in _imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and not name.startswith("txnkeeper.contract")
        and name.split(".")[0] not in ALLOWED_BEYOND_STDLIB.get(path.name, set())
    )
    assert offending == []
