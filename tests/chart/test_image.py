"""The Dockerfile, checked without a Docker engine: what it copies exists and is not ignored, every
command the chart and the operator run is an entry point the image installs, it runs as non-root, and
Java lands only in the verifier target."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from txnkeeper.cli import build_parser
from txnkeeper_operator import builders
from txnkeeper_operator.engine import BatchSettings, Template
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _stages() -> dict[str, str]:
    """Stage name -> its instructions (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    stages: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            name = match.group(1)
            stages[name] = ""
        elif name is not None and line.strip() and not line.lstrip().startswith("#"):
            stages[name] += line.strip() + "\n"
    return stages


def _ignored(path: str) -> bool:
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_stages_and_default_target() -> None:
    stages = _stages()
    assert list(stages)[-1] == "runtime", "the default build (no --target) must be the runtime image"
    assert {"deps-common", "deps", "deps-verifier", "build", "base", "verifier", "runtime"} <= set(stages)


def test_copied_sources_exist_and_are_in_the_build_context() -> None:
    sources = []
    for line in _stages()["build"].splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources += line.split()[1:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source), f"{source} is excluded by .dockerignore"
    assert _ignored(".venv") and _ignored(".git") and _ignored("tests")


def test_final_images_run_as_non_root() -> None:
    for stage in ("verifier", "runtime"):
        users = re.findall(r"^USER\s+(\S+)", _stages()[stage], re.MULTILINE)
        assert users and users[-1].split(":")[0] == "10001", stage


def test_java_only_where_spark_needs_it() -> None:
    stages = _stages()
    assert "jre" in stages["verifier"] and "spark" in stages["deps-verifier"]
    for stage in ("deps-common", "deps", "build", "base", "runtime"):
        assert "jre" not in stages[stage] and "jdk" not in stages[stage]
        assert "spark" not in stages[stage].replace("SPARK_LOCAL_DIRS", "")


def test_dependencies_come_before_sources() -> None:
    """A change to runtime/ or operator/ must not reinstall the dependencies: they are installed in
    stages that copy only pyproject.toml, and the final stages copy the dependency venv before the
    package."""
    stages = _stages()
    for stage in ("deps-common", "deps", "deps-verifier"):
        copies = [line for line in stages[stage].splitlines() if line.startswith("COPY ")]
        assert all(line.split()[1:-1] == ["pyproject.toml"] for line in copies), (stage, copies)
    for stage, deps in (("runtime", "deps"), ("verifier", "deps-verifier")):
        copies = [line for line in stages[stage].splitlines() if line.startswith("COPY --from=")]
        assert [c.split()[1] for c in copies] == [f"--from={deps}", "--from=build"], (stage, copies)


def test_every_command_the_cluster_runs_is_installed_by_the_image(capsys: pytest.CaptureFixture[str]) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    cr = Resource.from_body(
        {
            "kind": "TransactionCoordinator",
            "metadata": {"name": "x", "namespace": "n", "uid": "u"},
            "spec": {"version": "2.0.0"},
        }
    )
    settings = OperatorSettings()
    sts = builders.statefulset(cr, Template("2.0.0", BatchSettings()), settings)
    job = builders.verifier_job(cr, settings, 1)
    runtime = sts["spec"]["template"]["spec"]["containers"][0]
    verifier = job["spec"]["template"]["spec"]["containers"][0]
    assert runtime["command"][0] in scripts and verifier["command"][0] in scripts
    for subcommand in (runtime["args"][0], verifier["args"][0]):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([subcommand, "--help"])
        assert exited.value.code == 0, f"`txnkeeper {subcommand}` is not a subcommand"
    deployment = (ROOT / "helm/txnkeeper/templates/deployment.yaml").read_text()
    (command,) = re.findall(r'command: \["([^"]+)"\]', deployment)
    assert command in scripts
    assert scripts["txnkeeper-operator"] == "txnkeeper_operator.main:main"


def test_values_point_at_both_images() -> None:
    values = yaml.safe_load((ROOT / "helm/txnkeeper/values.yaml").read_text())
    assert values["image"]["repository"] != values["verifierImage"]["repository"]
    assert OperatorSettings().verifier_image.startswith(values["verifierImage"]["repository"])
    assert OperatorSettings().image.startswith(values["image"]["repository"])


@pytest.mark.parametrize("pod", ["x-0", "x-1", "x-2"])
def test_statefulset_command_line_is_accepted_by_the_runtime(pod: str, tmp_path: Path) -> None:
    """The pod's exact args (with the kubelet's $(VAR) expansion and the mounted files) make a valid
    runtime configuration: coordinator ids split by ordinal, start-up batch settings from the ConfigMap."""
    from txnkeeper.server.serve import build_config

    on = BatchSettings(enabled=True, max_records=64, max_size_bytes=65536, max_delay_millis=3)
    cr = Resource.from_body(
        {
            "kind": "TransactionCoordinator",
            "metadata": {"name": "x", "namespace": "n", "uid": "u"},
            "spec": {"version": "2.0.0", "replicas": 3, "coordinators": 7},
        }
    )
    sts = builders.statefulset(cr, Template("2.0.0", on), OperatorSettings())
    (config_file := tmp_path / "config.json").write_text(builders.config_map(cr, on)["data"]["config.json"])
    (token_file := tmp_path / "token").write_text("secret")
    # As the operator's Secret volume mounts it: serve refuses a token file others can read.
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    token_file.chmod(next(v["secret"]["defaultMode"] for v in volumes if "secret" in v))
    files = {"/data": str(tmp_path / "data"), "/etc/txnkeeper/config/config.json": str(config_file)}
    files["/etc/txnkeeper/token/token"] = str(token_file)
    (secret_file := tmp_path / "cluster-secret").write_text("the-namespace-cluster-secret")
    secret_file.chmod(next(v["secret"]["defaultMode"] for v in volumes if "secret" in v))
    files["/etc/txnkeeper/cluster/secret"] = str(secret_file)
    args = [
        files.get(a, a).replace("$(POD_NAME)", pod)
        for a in sts["spec"]["template"]["spec"]["containers"][0]["args"]
    ]
    config = build_config(build_parser().parse_args(args))
    ordinal = int(pod.rsplit("-", 1)[1])
    assert config.coordinator_ids == tuple(c for c in range(7) if c % 3 == ordinal)
    assert config.txnlog_batch.enabled and config.txnlog_batch.max_records == 64
    assert (config.release, config.pod_name, config.admin_token) == ("2.0.0", pod, "secret")
    assert config.cluster_secret == b"the-namespace-cluster-secret"
