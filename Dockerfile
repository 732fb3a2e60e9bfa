# syntax=docker/dockerfile:1.7
# One image, several entrypoints: `txnkeeper serve` (the pods), `txnkeeper-operator` (the operator),
# `txnkeeper verify-invalidation` (the verifier). Java is only in the `verifier` target, which Spark needs:
#   docker build -t txnkeeper:2.0.0 .                            # runtime + operator (default, last stage)
#   docker build -t txnkeeper-verifier:2.0.0 --target verifier .  # + Java + PySpark
# `make image` builds both (and, where python:3.11-slim-bookworm cannot be pulled, an equivalent
# Debian base first: PYTHON_IMAGE). Both run as uid 10001 with a read-only root filesystem: the pods
# write only /data (their PV) and /tmp.
#
# Layer order: third-party dependencies, then generated protobuf code, then our sources, so that a
# change to runtime/ or operator/ rebuilds only the last, small layer (`pip install --no-deps` of the
# package into a separate root, copied over the dependency venv in the final stages).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- deps: the third-party packages of pyproject.toml, without our code ------------------------------------
FROM ${PYTHON_IMAGE} AS deps-common
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml ./
# requirements: the dependencies of pyproject.toml plus the named extras (tomllib: no tool needed).
RUN printf '%s\n' \
      'import sys, tomllib' \
      'project = tomllib.load(open("pyproject.toml", "rb"))["project"]' \
      'extras = [d for e in sys.argv[1:] for d in project["optional-dependencies"][e]]' \
      'print(*project["dependencies"], *extras, sep="\n")' >/usr/local/bin/requirements.py \
 && python -m venv /opt/venv && /opt/venv/bin/pip install -q --upgrade pip \
 && python /usr/local/bin/requirements.py operator offload >/tmp/requirements.txt \
 && /opt/venv/bin/pip install --no-compile -r /tmp/requirements.txt
# slim: what no pod uses. The installers (nothing is installed at run time), and the kubernetes
# client's generated asyncio twin (kubernetes.aio, 68 MB: the operator uses kopf's own client and the
# synchronous one). Then bytecode for everything left, since the root filesystem is read-only and
# every start would otherwise compile each module again.
RUN printf '%s\n' '#!/bin/sh' 'set -eu' \
      '/opt/venv/bin/pip uninstall -q -y pip setuptools' \
      'rm -rf /opt/venv/lib/python3.11/site-packages/kubernetes/aio' \
      'find /opt/venv -name __pycache__ -prune -exec rm -rf {} +' \
      'python -m compileall -q -j 0 /opt/venv/lib/python3.11/site-packages >/dev/null' >/usr/local/bin/slim-venv \
 && chmod 755 /usr/local/bin/slim-venv

FROM deps-common AS deps
RUN slim-venv

FROM deps-common AS deps-verifier
# pyspark's jars/connect-repl (58 MB) is the Spark Connect REPL's own classpath: never on Spark's (jars/*
# holds only the jar files directly in it), and the jobs use classic PySpark.
RUN python /usr/local/bin/requirements.py operator offload spark >/tmp/requirements.txt \
 && /opt/venv/bin/pip install --no-compile -r /tmp/requirements.txt \
 && rm -rf /opt/venv/lib/python3.11/site-packages/pyspark/jars/connect-repl \
 && slim-venv

# ---- build: protobuf code generated from proto/, then the package (no dependencies) ------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/protoc && /opt/protoc/bin/pip install --no-compile grpcio-tools mypy-protobuf \
 && python -m venv /opt/venv && /opt/venv/bin/pip install --no-compile --upgrade pip setuptools wheel
WORKDIR /src
# Generated code is a build product (never committed): same generator and plugins as `make proto`.
COPY proto ./proto
COPY runtime/txnkeeper/pb/generate.py ./runtime/txnkeeper/pb/generate.py
RUN PYTHONPATH=runtime/txnkeeper/pb /opt/protoc/bin/python -c \
    "import generate, pathlib; generate.generate(pathlib.Path('proto').resolve(), pathlib.Path('runtime').resolve())"
COPY pyproject.toml README.md ./
COPY runtime ./runtime
COPY operator ./operator
# Installed with the venv's path baked in (scripts' shebang /opt/venv/bin/python) under /opt/pkg, so the
# final stages copy just these files over the dependency venv.
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation --no-compile --root /opt/pkg . \
 && find /opt/pkg -name __pycache__ -prune -exec rm -rf {} + \
 && python -m compileall -q -j 0 -d /opt/venv /opt/pkg/opt/venv >/dev/null

# ---- common base: non-root user, no package caches -------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
RUN groupadd --gid 10001 txnkeeper \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin txnkeeper \
 && install -d -o 10001 -g 10001 /data
EXPOSE 6650 8080 8081

# ---- verifier: the runtime plus a JRE and PySpark (Spark local[*] or a cluster master) ---------------------
FROM base AS verifier
# (The JRE's package links its man page: slim bases exclude /usr/share/man, so the directory must exist.)
RUN mkdir -p /usr/share/man/man1 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc/* /usr/share/man/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 SPARK_LOCAL_DIRS=/tmp
COPY --from=deps-verifier /opt/venv /opt/venv
COPY --from=build /opt/pkg/opt/venv /opt/venv
USER 10001:10001
ENTRYPOINT ["txnkeeper"]
CMD ["verify-invalidation", "--help"]

# ---- runtime (default): pods and operator ------------------------------------------------------------------
FROM base AS runtime
COPY --from=deps /opt/venv /opt/venv
COPY --from=build /opt/pkg/opt/venv /opt/venv
USER 10001:10001
VOLUME ["/data"]
# The operator's StatefulSet and Deployment set `command` explicitly; this default just explains itself.
CMD ["txnkeeper", "--help"]
