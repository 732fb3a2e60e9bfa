# txnkeeper build, test and demo entry points. Everything a fresh machine needs is installed from here:
# the virtualenv (.venv), generated protobuf code, and (for the chart and cluster tests) binaries built
# from the Go module proxy into $(CACHE_DIR), which outlives clones so reruns are fast.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CACHE_DIR ?= $(HOME)/.cache/txnkeeper
export CACHE_DIR

INSTALLED := $(VENV)/.installed
GENERATED := runtime/txnkeeper/pb/.generated
PROTOS := $(wildcard proto/*.proto)
# Pulsar's wire protocol (docs/pulsar-protocol.md): PulsarApi.proto as Apache ships it in the Go client's
# module, taken from the Go module proxy (pinned by version and hash, cached in $(CACHE_DIR)) into
# proto/pulsar/ (not committed; the image build copies proto/ whole). Only its package line is changed.
PULSAR_GO_VERSION := v0.19.0
PULSAR_GO_SHA256 := 1e7c5dffd32240e24dcb31dd52480010b9a0009c21c3ccc2d5b5b73764b696fb
PULSAR_API_PROTO := proto/pulsar/PulsarApi.proto
PYTEST_ARGS ?=
# Each pytest run's JUnit report, read by the digest at the end of `make test`.
REPORTS := build/test-reports

.PHONY: all install proto lint deadcode typecheck unit test demo soak bench bench-pulsar clean
.PHONY: k8s-bins kind-components image kind-node kind-up kind-down image-down cluster-down
.PHONY: test-prereqs e2e e2e-if-possible unit-compute unit-wallclock

all: test

$(INSTALLED): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,operator,spark,spark-source,offload]'
	@touch $@

install: $(INSTALLED) $(GENERATED)

$(GENERATED): $(PROTOS) $(PULSAR_API_PROTO) $(INSTALLED) runtime/txnkeeper/pb/generate.py
	$(BIN)/python -m txnkeeper.pb.generate --proto-dir proto --out-root runtime
	@touch $@

$(PULSAR_API_PROTO): proto/fetch_pulsar_api.sh
	bash proto/fetch_pulsar_api.sh $(PULSAR_GO_VERSION) $(PULSAR_GO_SHA256) $@

proto: $(GENERATED)

lint: install deadcode
	$(BIN)/ruff check runtime operator tests e2e bench
	$(BIN)/ruff format --check runtime operator tests e2e bench
	# The import contract (docs/contracts.md section 0): layer order, forbidden imports, no cycles.
	$(BIN)/lint-imports --no-cache

# Dead code (vulture over the code and what uses it: tests and benches): an unused name is removed, or,
# when a framework uses it by name (kopf, asyncio, pytest, http.server, protobuf), listed with its user
# in deadcode_whitelist.py.
deadcode: install
	$(BIN)/vulture runtime operator e2e tests bench deadcode_whitelist.py --min-confidence 60 \
	  --exclude '*_pb2.py,*_pb2.pyi'

typecheck: install
	$(BIN)/mypy

# The 25 slowest tests are listed at the end: the suite's wall time is what keeps a warm `make test`
# under 20 minutes, and this is where it goes.
unit: install
	$(BIN)/pytest --durations=25 --junitxml=$(REPORTS)/unit.xml $(PYTEST_ARGS)

# `make test` splits the unit suite in two pytest runs side by side: the few tests that mostly wait on
# real time (marker `wallclock`: the minute-long tier outages, retention by age) together with the
# Spark tests (marker `spark`, much of it JVMs starting), and the rest. Each run spreads its test
# files over UNIT_WORKERS pytest-xdist workers (a file stays on one worker, so a module's fixture is
# still set up once): alone, one worker used 0.76 of a core (821 CPU-s in 1,084 s, 2026-11-29), the
# rest of its time waiting on its pods, JVMs and sockets.
UNIT_WORKERS ?= 2
UNIT_NICE ?=
# pytest's options for N xdist workers, by file (none for 0 or 1: one process).
xdist = $(if $(filter-out 0 1,$(1)),-n $(1) --dist loadfile,)
unit-compute: install
	$(UNIT_NICE) $(BIN)/pytest $(call xdist,$(UNIT_WORKERS)) --durations=25 -m 'not wallclock and not spark' --junitxml=$(REPORTS)/unit.xml $(PYTEST_ARGS)

unit-wallclock: install
	$(UNIT_NICE) $(BIN)/pytest $(call xdist,$(UNIT_WORKERS)) -m 'wallclock or spark' --junitxml=$(REPORTS)/unit-wallclock.xml $(PYTEST_ARGS)

# The README's test command: lint, strict typing, every build the tests need, then every test (soak
# tests in their bounded form) side by side with the cluster tests on kind when this machine can run
# them: the e2e suite mostly waits on pods, rollouts and Spark, the unit suite mostly computes, so
# together they take little longer than the longer of the two. Each one's output is printed whole when
# it ends (-O); the run fails if any does. Last comes the digest of all three (tests/tools/failure_digest.py):
# counts, and each failed test with its error, where a CI log that keeps only its end still shows them.
# The unit runs are not niced by default (UNIT_NICE="nice -n 10" gives the kind cluster, which the
# kernel weighs as one process against each of ours, the CPU first): beside two un-niced CPU hogs a
# niced test pod missed its 30-s readiness deadline (docs/ci.md).
test: lint typecheck test-prereqs
	@rm -f $(REPORTS)/*.xml; status=0; \
	$(MAKE) --no-print-directory -j3 -O unit-compute unit-wallclock e2e-if-possible PREREQS_DONE=1 \
	  || status=$$?; \
	$(BIN)/python tests/tools/failure_digest.py unit=$(REPORTS)/unit.xml \
	  unit-wallclock=$(REPORTS)/unit-wallclock.xml e2e=$(REPORTS)/e2e.xml; exit $$status

# --- Containers and cluster tests (e2e/README.md): images, a kind cluster, the e2e suite -----------
# Every Go build (Kubernetes, kind and its component images, helm, MinIO) shares one module cache and
# one build cache under $(CACHE_DIR)/go, so a package common to two of them is compiled once.
export GOMODCACHE := $(CACHE_DIR)/go/mod
export GOCACHE := $(CACHE_DIR)/go/build
E2E_ARGS ?=
# The e2e suite's pytest-xdist workers on the one cluster (e2e/conftest.py says what they share); 1 runs
# it in one process.
E2E_WORKERS ?= 2
E2E_STATE := e2e/.state

# kube-apiserver, kubectl and the node binaries (kubelet, kubeadm, kube-proxy, ...) at the release of
# e2e/k8s/go.mod, into $(CACHE_DIR)/k8s (cold: long, see e2e/README.md; warm: a hash check).
k8s-bins:
	bash e2e/scripts/build-k8s.sh >/dev/null

# kind itself, etcd, CoreDNS, local-path-provisioner and pause, into $(CACHE_DIR)/kind/bin.
kind-components:
	bash e2e/kind/components.sh >/dev/null

# The runtime and verifier images (a container engine is started as root where none runs).
image: $(PULSAR_API_PROTO)
	bash e2e/kind/image.sh

# The kind node image kindest/node:v<release>, assembled from the builds above.
kind-node: k8s-bins kind-components
	bash e2e/kind/node-image.sh >/dev/null

# A kind cluster with the project's images loaded; prints the environment to use it (also written to
# e2e/.state/kind.env: `eval "$$(cat e2e/.state/kind.env)"`).
kind-up: kind-node
	@bash e2e/kind/up.sh

kind-down:
	bash e2e/kind/down.sh

# Stop the container engine e2e/kind/engine.sh started (deleting the kind cluster first).
image-down: kind-down
	bash e2e/kind/engine.sh down

cluster-down: image-down

# Why the Java client peer cannot be built here (empty: it can): it needs a JDK and Maven.
JAVA_SKIP := $(shell command -v javac >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1 || \
  echo "javac or mvn is not installed, so the Pulsar Java client tests will be skipped")
# Why this machine cannot build the Kubernetes binaries (empty: it can). Go builds them all.
CLUSTER_SKIP := $(shell command -v go >/dev/null 2>&1 || \
  echo "Go is not installed, so Kubernetes cannot be built from the Go module proxy")
# Why the e2e suite cannot run on kind here (empty: it can): it needs the Go builds and a container
# engine, an existing one or, as root, one started by e2e/kind/engine.sh. Evaluated when used.
KIND_SKIP = $(or $(CLUSTER_SKIP),$(shell bash e2e/kind/engine.sh why))

# The e2e suite on kind: the cluster is created (reused if up), the suite runs, the cluster is deleted
# (E2E_KEEP_CLUSTER=1 keeps it). KUBECONFIG, DOCKER_HOST and the image names come from up.sh. When the
# suite fails, the cluster's state (node container, control-plane restarts and logs) is printed first.
# up.sh's progress lines also go to $(REPORTS)/e2e.setup.log: when the cluster cannot be set up, the
# test digest quotes why from there.
e2e: install helm kind-node
	@mkdir -p $(REPORTS); rm -f $(REPORTS)/e2e.setup.log
	@E2E_SETUP_LOG=$(REPORTS)/e2e.setup.log bash e2e/kind/up.sh >/dev/null
	@status=0; (eval "$$(cat $(E2E_STATE)/kind.env)" && $(BIN)/pytest e2e $(call xdist,$(E2E_WORKERS)) --durations=15 --junitxml=$(REPORTS)/e2e.xml $(E2E_ARGS)) || status=$$?; \
	if [ $$status -ne 0 ]; then bash e2e/kind/diagnose.sh; fi; \
	if [ -z "$${E2E_KEEP_CLUSTER:-}" ]; then bash e2e/kind/down.sh; fi; exit $$status

e2e-if-possible:
	@if [ -n "$(KIND_SKIP)" ]; then echo "e2e: SKIPPED: $(KIND_SKIP)"; \
	else echo "e2e: on kind (real containers under a real kubelet; e2e/README.md)"; \
	  $(MAKE) --no-print-directory e2e; fi

# Everything the test run builds, before the unit run: helm (the chart checks), MinIO (the S3 offload
# tests), promtool and Prometheus (the monitoring tests), cert-manager's Certificate CRD (fetched only), kube-apiserver and etcd
# (tests/operator/test_op_apiserver.py), and for the e2e suite the node binaries, kind's components and the project's images. Three at a time: the Go builds are
# CPU-bound, the images mostly wait on the package index, so they overlap well on two cores.
test-prereqs:
	@if [ -n "$(CLUSTER_SKIP)" ]; then echo "Go builds: SKIPPED: $(CLUSTER_SKIP);" \
	  "the chart, S3 offload and API-server tests will be skipped"; \
	else $(MAKE) --no-print-directory -j3 -O $(HELM_STAMP) $(MINIO_STAMP) $(PROMETHEUS_STAMP) $(PULSAR_GO_PEER_STAMP) \
	  $(CERT_MANAGER_STAMP) \
	  $(if $(JAVA_SKIP),,$(PULSAR_JAVA_STAMP) $(PULSAR_PEER_STAMP)) k8s-bins kind-components \
	  $(if $(KIND_SKIP),,image); fi

# `make unit` alone builds them first; `make test` has (PREREQS_DONE), before running unit and e2e
# side by side, so that the two never start the same build.
unit unit-compute unit-wallclock: $(if $(PREREQS_DONE),,test-prereqs)

# Longer soak/crash runs than the bounded ones every test run includes: first the fault soak's JSON
# verdict (tests/fault/soak.py: SOAK_KILLS SIGKILLs, bit flips and truncations of every file kind; it
# fails if any silent loss, wrong data or bad refusal was seen), then the cluster soak's
# (tests/fault/cluster_soak.py: CLUSTER_SOAK_KILLS SIGKILLs of real coordinator and store pods under
# client-API load; docs/fault-testing.md says how long 1,000 take), then every soak-marked test with
# SOAK_SCALE times its bounded kills. SOAK_ARGS and CLUSTER_SOAK_ARGS add options (e.g. --seed N).
SOAK_KILLS ?= 1000
CLUSTER_SOAK_KILLS ?= 1000
SOAK_SCALE ?= 10
SOAK_ARGS ?=
CLUSTER_SOAK_ARGS ?=
soak: install
	@status=0; $(BIN)/python -m tests.fault.soak --kills $(SOAK_KILLS) --json $(SOAK_ARGS) || status=$$?; \
	$(BIN)/python -m tests.fault.cluster_soak --kills $(CLUSTER_SOAK_KILLS) --json $(CLUSTER_SOAK_ARGS) \
	  || status=$$?; \
	SOAK_SCALE=$(SOAK_SCALE) $(BIN)/pytest -m soak $(PYTEST_ARGS) && exit $$status

bench: install
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b; done

demo: install
	$(BIN)/txnkeeper demo

# --- Pulsar side by side (bench/pulsar_peer/README.md): optional, not part of `make test` -----------
# Pulsar's jars from Maven Central only (settings.xml mirrors every repository to Central) into
# $(CACHE_DIR)/pulsar-peer/lib; the stamp names the pom's hash so an edited pom re-resolves.
# `make test` resolves them too: tests/runtime/test_pulsar_perf.py runs pulsar-perf against txnkeeper.
export PULSAR_PEER_LIB := $(CACHE_DIR)/pulsar-peer/lib
PULSAR_PEER_STAMP := $(CACHE_DIR)/pulsar-peer/.resolved-$(shell sha256sum bench/pulsar_peer/pom.xml | cut -c1-16)
PULSAR_PEER_ARGS ?=

$(PULSAR_PEER_STAMP): bench/pulsar_peer/pom.xml bench/pulsar_peer/settings.xml
	@mkdir -p $(CACHE_DIR)/pulsar-peer && rm -rf $(PULSAR_PEER_LIB) $(CACHE_DIR)/pulsar-peer/.resolved-*
	nice -n 19 mvn -B -q -s bench/pulsar_peer/settings.xml -f bench/pulsar_peer/pom.xml \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(PULSAR_PEER_LIB)
	@touch $@

bench-pulsar: install $(PULSAR_PEER_STAMP)
	$(BIN)/python bench/pulsar_peer/run.py --lib $(PULSAR_PEER_LIB) $(PULSAR_PEER_ARGS)

clean:
	rm -rf $(VENV) $(E2E_STATE) proto/pulsar runtime/txnkeeper/pb/*_pb2.py runtime/txnkeeper/pb/*_pb2.pyi $(GENERATED) .mypy_cache .ruff_cache .pytest_cache

# --- Chart checks (tests/chart): a real helm, built from the Go module proxy into $(CACHE_DIR)/bin ----
HELM_VERSION ?= v3.21.4
HELM := $(CACHE_DIR)/bin/helm
HELM_STAMP := $(CACHE_DIR)/bin/.helm-$(HELM_VERSION)
export HELM
.PHONY: helm chart crds

$(HELM_STAMP):
	@mkdir -p $(CACHE_DIR)/bin
	GOBIN=$(CACHE_DIR)/bin nice -n 19 go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	@rm -f $(CACHE_DIR)/bin/.helm-* && touch $@

helm:
	@if command -v go >/dev/null 2>&1; then $(MAKE) --no-print-directory $(HELM_STAMP); \
	else echo "helm: SKIPPED: Go is not installed, so helm cannot be built; tests/chart will be skipped"; fi


chart: install helm
	$(BIN)/pytest tests/chart tests/operator/test_op_crds.py $(PYTEST_ARGS)

# Regenerate crds/ and the chart's identical copy from operator/txnkeeper_operator/crdgen.py.
crds: install
	$(BIN)/python -m txnkeeper_operator.crdgen crds helm/txnkeeper/crds

# --- Offload tests (tests/offload): a real MinIO, built from the Go module proxy into $(CACHE_DIR)/bin --
# Only for tests: MinIO is never shipped in the image or the chart. The S3 driver's tests start it on
# 127.0.0.1 with a temporary directory and skip with a reason when the binary is missing.
MINIO_VERSION ?= v0.0.0-20260212201848-7aac2a2c5b7c
MINIO := $(CACHE_DIR)/bin/minio
MINIO_STAMP := $(CACHE_DIR)/bin/.minio-$(MINIO_VERSION)
export MINIO
.PHONY: minio

$(MINIO_STAMP):
	@mkdir -p $(CACHE_DIR)/bin
	GOBIN=$(CACHE_DIR)/bin GOFLAGS=-mod=mod nice -n 19 go install github.com/minio/minio@$(MINIO_VERSION)
	@rm -f $(CACHE_DIR)/bin/.minio-* && touch $@

minio:
	@if command -v go >/dev/null 2>&1; then $(MAKE) --no-print-directory $(MINIO_STAMP); \
	else echo "minio: SKIPPED: Go is not installed, so MinIO cannot be built; the S3 offload tests will be skipped"; fi

# --- Monitoring checks (tests/monitoring): promtool and Prometheus, built from the Go module proxy ------
# Only for tests (the chart ships the rules and dashboards, not Prometheus): promtool checks and unit-tests
# the chart's alert rules, a real Prometheus scrapes real pods (docs/monitoring.md). Built without the
# builtinassets tag: no web UI, the HTTP API the tests query works without it. Cold: ~8 min on 2 cores.
PROMETHEUS_VERSION ?= v0.316.0
PROMTOOL := $(CACHE_DIR)/bin/promtool
PROMETHEUS := $(CACHE_DIR)/bin/prometheus
PROMETHEUS_STAMP := $(CACHE_DIR)/bin/.prometheus-$(PROMETHEUS_VERSION)
export PROMTOOL PROMETHEUS
.PHONY: prometheus monitoring

$(PROMETHEUS_STAMP):
	@mkdir -p $(CACHE_DIR)/bin
	GOBIN=$(CACHE_DIR)/bin nice -n 19 go install github.com/prometheus/prometheus/cmd/promtool@$(PROMETHEUS_VERSION) \
	  github.com/prometheus/prometheus/cmd/prometheus@$(PROMETHEUS_VERSION)
	@rm -f $(CACHE_DIR)/bin/.prometheus-* && touch $@

prometheus:
	@if command -v go >/dev/null 2>&1; then $(MAKE) --no-print-directory $(PROMETHEUS_STAMP); \
	else echo "prometheus: SKIPPED: Go is not installed; the monitoring tests will be skipped"; fi

# The monitoring checks alone (docs/monitoring.md): the chart's templates, promtool, a real Prometheus.
monitoring: install helm prometheus
	$(BIN)/pytest tests/monitoring tests/chart/test_chart_monitoring.py $(PYTEST_ARGS)

# --- cert-manager's Certificate CRD (tests/operator/test_op_certificates.py), from the Go module proxy --
# The operator's cert-manager mode makes Certificate objects; the test apiserver validates them against
# the real CRD (no cert-manager controller runs). Fetched into $(CACHE_DIR), never committed.
CERT_MANAGER_VERSION ?= v1.21.2
CERT_MANAGER_SUM := h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=
CERT_MANAGER_CRDS := $(CACHE_DIR)/cert-manager/$(CERT_MANAGER_VERSION)
CERT_MANAGER_STAMP := $(CERT_MANAGER_CRDS)/.fetched
export CERT_MANAGER_CRDS
.PHONY: cert-manager-crds

$(CERT_MANAGER_STAMP): tests/operator/fetch_cert_manager_crds.sh
	bash tests/operator/fetch_cert_manager_crds.sh $(CERT_MANAGER_VERSION) $(CERT_MANAGER_SUM) $(CERT_MANAGER_CRDS)
	@touch $@

cert-manager-crds:
	@if command -v go >/dev/null 2>&1; then $(MAKE) --no-print-directory $(CERT_MANAGER_STAMP); \
	else echo "cert-manager CRDs: SKIPPED: Go is not installed; the cert-manager mode tests will be skipped"; fi

# --- Pulsar's Go client as a test peer (tests/peers/pulsar-go): transactions driven by Apache's own Go
# client (tests/runtime/test_pulsar_go.py). Built from the Go module proxy into $(CACHE_DIR)/bin; the
# stamp names the hash of the program and its go.sum, so an edit rebuilds it.
PULSAR_GO_PEER := $(CACHE_DIR)/bin/pulsar-txnpeer
PULSAR_GO_PEER_STAMP := $(CACHE_DIR)/bin/.pulsar-txnpeer-$(shell cat tests/peers/pulsar-go/*.go tests/peers/pulsar-go/go.sum | sha256sum | cut -c1-16)
export PULSAR_GO_PEER

# Pulsar's Java client as a test peer (tests/peers/pulsar-java, tests/runtime/test_pulsar_java.py):
# Maven Central only, into $(CACHE_DIR)/pulsar-java/lib, TxnPeer.java compiled against it.
PULSAR_JAVA_DIR := $(CACHE_DIR)/pulsar-java
PULSAR_JAVA_STAMP := $(PULSAR_JAVA_DIR)/.built-$(shell cat tests/peers/pulsar-java/pom.xml tests/peers/pulsar-java/*.java | sha256sum | cut -c1-16)
export PULSAR_JAVA_PEER_CP := $(PULSAR_JAVA_DIR)/classes:$(PULSAR_JAVA_DIR)/lib/*

$(PULSAR_JAVA_STAMP): bench/pulsar_peer/settings.xml
	@rm -rf $(PULSAR_JAVA_DIR) && mkdir -p $(PULSAR_JAVA_DIR)/classes
	nice -n 19 mvn -B -q -s bench/pulsar_peer/settings.xml -f tests/peers/pulsar-java/pom.xml \
	  dependency:copy-dependencies -DoutputDirectory=$(PULSAR_JAVA_DIR)/lib
	nice -n 19 javac -d $(PULSAR_JAVA_DIR)/classes -cp '$(PULSAR_JAVA_DIR)/lib/*' tests/peers/pulsar-java/TxnPeer.java
	@touch $@

$(PULSAR_GO_PEER_STAMP):
	@mkdir -p $(CACHE_DIR)/bin
	cd tests/peers/pulsar-go && GOFLAGS=-modcacherw GOTOOLCHAIN=local nice -n 19 go build -mod=readonly \
	  -trimpath -o $(PULSAR_GO_PEER) .
	@rm -f $(CACHE_DIR)/bin/.pulsar-txnpeer-* && touch $@

