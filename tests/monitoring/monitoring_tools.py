"""The real tools the monitoring tests run: helm (renders the chart's rules), promtool, Prometheus.

All three are built from the Go module proxy into $CACHE_DIR/bin (`make helm`, `make prometheus`); a
test needing a missing one is skipped with the command that builds it. ``PrometheusServer`` is a real
Prometheus on 127.0.0.1 with its data in a temporary directory, queried over its HTTP API.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "txnkeeper"
DASHBOARDS = CHART / "dashboards"
HERE = Path(__file__).resolve().parent


def binary(name: str, env: str) -> str | None:
    """``$env`` if set and present, else $CACHE_DIR/bin/<name>, else <name> on PATH."""
    explicit = os.environ.get(env)
    if explicit and Path(explicit).exists():
        return explicit
    cache = Path(os.environ.get("CACHE_DIR", Path.home() / ".cache" / "txnkeeper"))
    candidate = cache / "bin" / name
    return str(candidate) if candidate.exists() else shutil.which(name)


HELM = binary("helm", "HELM")
PROMTOOL = binary("promtool", "PROMTOOL")
PROMETHEUS = binary("prometheus", "PROMETHEUS")
HELM_MISSING = "helm not found: run `make helm` (builds it from the Go module proxy into $CACHE_DIR/bin)"
PROMETHEUS_MISSING = (
    "promtool/prometheus not found: run `make prometheus` (builds both from the Go module proxy into"
    " $CACHE_DIR/bin)"
)


def render_rules(*sets: str) -> dict[str, Any]:
    """The chart's PrometheusRule (rendered by the real helm with the flag on) as a Prometheus rule file."""
    assert HELM is not None
    args = [HELM, "template", "t", str(CHART), "--namespace", "tk", "--kube-version", "1.29.0"]
    args += ["--show-only", "templates/prometheusrule.yaml", "--set", "metrics.prometheusRule.enabled=true"]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
    rule = yaml.safe_load(out)
    assert rule["kind"] == "PrometheusRule", out
    return {"groups": rule["spec"]["groups"]}


def alert_names(rules: dict[str, Any]) -> list[str]:
    return [r["alert"] for group in rules["groups"] for r in group["rules"] if "alert" in r]


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panel_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title + legend, PromQL) of every target of every panel."""
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield f"{panel['title']} [{target['legendFormat']}]", target["expr"]


# A metric name in a query: a known prefix, then name characters (label names and functions never
# start with these prefixes).
_METRIC = re.compile(r"\b((?:txnkeeper|pulsar|brk)_[a-zA-Z0-9_]+)")


def metric_names(query: str) -> set[str]:
    return set(_METRIC.findall(query))


def grafana_to_promql(query: str, rate_interval: str) -> str:
    """A dashboard query as Prometheus runs it with every variable at "All" (Grafana's allValue .*)."""
    return (
        query.replace("$__rate_interval", rate_interval)
        .replace("$namespace", ".*")
        .replace("$resource", ".*")
    )


class PrometheusServer:
    """A real Prometheus process (``PROMETHEUS``) on 127.0.0.1, data and config in ``workdir``."""

    def __init__(
        self, workdir: Path, config: dict[str, Any], rules: dict[str, Any] | None, port: int
    ) -> None:
        assert PROMETHEUS is not None
        workdir.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "prometheus.log"
        if rules is not None:
            (workdir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
            config = {**config, "rule_files": [str(workdir / "rules.yaml")]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready within {within}s:\n{self.log()}")

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path} {params}: HTTP {exc.code}: {exc.read().decode()}") from exc
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", (promql, data)
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
