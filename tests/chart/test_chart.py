"""The Helm chart, checked with a real helm binary (built by `make helm` from the Go module proxy).

Lint is clean, every rendered manifest passes kubernetes-validate --strict for Kubernetes 1.29-1.37,
the CRDs helm installs are exactly crds/, values.schema.json refuses what it should, RBAC is least
privilege, and the example resources satisfy the CRDs' own schemas.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "txnkeeper"
K8S_VERSIONS = [f"1.{minor}.0" for minor in range(29, 38)]


def _helm() -> str | None:
    explicit = os.environ.get("HELM")
    if explicit and Path(explicit).exists():
        return explicit
    cache = Path(os.environ.get("CACHE_DIR", Path.home() / ".cache" / "txnkeeper"))
    candidate = cache / "bin" / "helm"
    return str(candidate) if candidate.exists() else shutil.which("helm")


HELM = _helm()
pytestmark = pytest.mark.skipif(
    HELM is None,
    reason="helm not found: run `make helm` (builds it from the Go module proxy into $CACHE_DIR/bin)",
)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, check=check, timeout=60)


def render(*sets: str, kube: str = "1.29.0") -> list[dict[str, Any]]:
    args = ["template", "t", str(CHART), "--namespace", "tk", "--include-crds", "--kube-version", kube]
    for s in sets:
        args += ["--set", s]
    out = helm(*args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


VALUE_SETS = {
    "defaults": (),
    "namespaced-examples": (
        "examples.enabled=true",
        "operator.watchNamespaces={apps,data}",
        "operator.verbose=true",
    ),
}


def test_lint_is_clean() -> None:
    for sets in VALUE_SETS.values():
        args = ["lint", "--strict", str(CHART), "--kube-version", "1.29.0"]
        for s in sets:
            args += ["--set", s]
        result = helm(*args)
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_rendered_manifests_validate_strictly_on_every_supported_kubernetes(values: str) -> None:
    docs = render(*VALUE_SETS[values])
    builtin = [d for d in docs if not d["apiVersion"].startswith("txnkeeper.io/")]
    assert builtin
    for version in K8S_VERSIONS:
        for doc in builtin:
            kubernetes_validate.validate(doc, version, strict=True)


def test_chart_refuses_kubernetes_older_than_1_29() -> None:
    result = helm("template", "t", str(CHART), "--kube-version", "1.28.0", check=False)
    assert result.returncode != 0 and "kubeVersion" in result.stderr


def test_helm_installs_exactly_the_crds_in_crds_dir() -> None:
    rendered = {d["metadata"]["name"]: d for d in render() if d["kind"] == "CustomResourceDefinition"}
    committed = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        committed[doc["metadata"]["name"]] = doc
    assert rendered == committed


def _plain(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


def test_example_resources_satisfy_the_crd_schemas() -> None:
    docs = render(*VALUE_SETS["namespaced-examples"])
    crds = {d["spec"]["names"]["kind"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    examples = [d for d in docs if d["apiVersion"] == "txnkeeper.io/v1"]
    assert sorted(d["kind"] for d in examples) == ["PendingAckStore", "TransactionCoordinator"]
    for doc in examples:
        schema = crds[doc["kind"]]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        jsonschema.validate(doc["spec"], _plain(schema))


def test_example_store_carries_offload_and_single_key_transactions_at_3x() -> None:
    docs = render(
        "examples.enabled=true",
        "examples.version=3.0.0",
        "examples.offload.driver=filesystem",
        "examples.offload.filesystem.claimName=offload-rwx",
        "examples.singleKeyTransactions.enabled=true",
    )
    crds = {d["spec"]["names"]["kind"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    [store] = [d for d in docs if d["kind"] == "PendingAckStore"]
    assert store["spec"]["offload"] == {"driver": "filesystem", "filesystem": {"claimName": "offload-rwx"}}
    assert store["spec"]["singleKeyTransactions"] == {"enabled": True}
    schema = crds["PendingAckStore"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    jsonschema.validate(store["spec"], _plain(schema))
    [plain] = [d for d in render("examples.enabled=true") if d["kind"] == "PendingAckStore"]
    assert "offload" not in plain["spec"] and "singleKeyTransactions" not in plain["spec"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("operator.reconcileSeconds=0", "reconcileSeconds"),
        ("operator.bogus=1", "bogus"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("operator.watchNamespaces={Bad_NS}", "watchNamespaces"),
        ("examples.version=latest", "version"),
        ("examples.storageSize=0Gi", "storageSize"),
    ],
)
def test_values_schema_rejects_bad_values(bad: str, message: str) -> None:
    result = helm("template", "t", str(CHART), "--kube-version", "1.29.0", "--set", bad, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def _rules(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                yield doc["metadata"]["name"], rule


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_rbac_is_least_privilege(values: str) -> None:
    docs = render(*VALUE_SETS[values])
    for name, rule in _rules(docs):
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(key, []), f"{name} has a wildcard {key}"
        if "secrets" in rule["resources"]:
            # patch: the certificate manager renews the Secrets it made; never list/watch (bulk reads).
            assert set(rule["verbs"]) <= {"get", "create", "patch"}, f"{name} may read every secret in bulk"
        if "delete" in rule["verbs"]:
            assert rule["resources"] == ["pods"], f"{name} deletes more than pods"
        assert (
            "escalate" not in rule["verbs"]
            and "bind" not in rule["verbs"]
            and "impersonate" not in rule["verbs"]
        )
    namespaced = values == "namespaced-examples"
    hook = "helm.sh/hook"
    kinds = {d["kind"] for d in docs if hook not in (d["metadata"].get("annotations") or {})}
    assert ("Role" in kinds) == namespaced


def test_operator_can_grant_the_verifier_role_it_creates() -> None:
    """RBAC escalation prevention: the operator must itself hold every permission it grants."""
    from txnkeeper_operator import builders
    from txnkeeper_operator.resource import Resource

    def cr(master: str) -> Resource:
        return Resource.from_body(
            {
                "kind": "TransactionCoordinator",
                "metadata": {"name": "x", "namespace": "tk", "uid": "u"},
                "spec": {"version": "2.0.0", "verifier": {"sparkMaster": master}},
            }
        )

    operator_rules = [r for name, r in _rules(render()) if name.endswith("-operator")]
    # k8s://: the verifier's Spark driver manages its executor pods (the widest Role it grants).
    granted_rules = [*builders.verifier_role(cr("local[*]"))["rules"]]
    granted_rules += builders.verifier_role(cr("k8s://https://kubernetes.default.svc"))["rules"]
    for granted in granted_rules:
        for resource in granted["resources"]:
            for verb in granted["verbs"]:
                assert any(
                    resource in r["resources"]
                    and verb in r["verbs"]
                    and granted["apiGroups"][0] in r["apiGroups"]
                    for r in operator_rules
                ), f"operator lacks {verb} {resource} that it grants the verifier"


def test_operator_deployment_runs_the_packaged_entry_point_restricted() -> None:
    (deployment,) = [d for d in render() if d["kind"] == "Deployment"]
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["command"] == ["txnkeeper-operator"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    scripts = _pyproject_scripts()
    assert scripts["txnkeeper-operator"] == "txnkeeper_operator.main:main"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TXNKEEPER_IMAGE"] == "ghcr.io/txnkeeper/txnkeeper:2.0.0"


def test_helm_test_hook_runs_the_selfcheck_module() -> None:
    docs = render()
    hooks = [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
    (pod,) = [d for d in hooks if d["kind"] == "Pod"]
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "txnkeeper_operator.selfcheck"]
    from txnkeeper_operator import selfcheck

    assert callable(selfcheck.main)


def _pyproject_scripts() -> dict[str, str]:
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    scripts: dict[str, str] = data["project"]["scripts"]
    return scripts


def test_values_schema_is_valid_json_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)
