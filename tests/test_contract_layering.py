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
# client in the contract package used by both"); aiohttp is a dependency of the operator anyway. The
# TLS client settings read a refused certificate's expiry and names with cryptography, and pki.py issues
# certificates with it (a dependency of the package since issue 28: the operator reaches pods over HTTPS
# with them and its certificate engine issues them).
ALLOWED_BEYOND_STDLIB = {"admin.py": {"aiohttp"}, "tls.py": {"cryptography"}, "pki.py": {"cryptography"}}


def test_contract_modules_import_only_the_standard_library() -> None:
    modules = sorted((ROOT / "runtime/txnkeeper/contract").rglob("*.py"))  # settings/ too
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


def _documented_tree() -> str:
    text = (ROOT / "docs/contracts.md").read_text(encoding="utf-8")
    section = text.split("## 0. Packages and layers", 1)[1]
    return section.split("```", 2)[1].split("operator/txnkeeper_operator/", 1)[0]


def test_the_documented_layers_are_the_enforced_ones() -> None:
    """§0's tree lists every runtime package once, in the order of pyproject's layers contract."""
    import re
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c.get("type") == "layers")
    layers = [re.split(r"\s*[|:]\s*", layer) for layer in contract["layers"]]
    tree = _documented_tree()

    def first_row(name: str) -> int:
        found = re.search(rf"^\s+{re.escape(name)}(/|\.py)", tree, re.MULTILINE)
        if found is None:
            found = re.search(rf"\b{re.escape(name)}(/|\.py)", tree)
        assert found is not None, f"{name} is in pyproject's layers but not in docs/contracts.md §0"
        return found.start()

    positions = [max(first_row(name) for name in layer) for layer in layers]
    starts = [min(first_row(name) for name in layer) for layer in layers]
    for upper, lower, names in zip(positions, starts[1:], layers[1:], strict=False):
        assert upper < lower, f"docs/contracts.md §0 does not list the layer above {names} before it"
    packages = {
        p.name if p.is_dir() else p.stem
        for p in (ROOT / "runtime/txnkeeper").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")
    }
    layered = {name for layer in layers for name in layer}
    assert packages - layered <= {"__main__"}, f"runtime modules outside every layer: {packages - layered}"
