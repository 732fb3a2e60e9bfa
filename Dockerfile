# syntax=docker/dockerfile:1.7
# One image, several entrypoints: `txnkeeper serve` (the pods), `txnkeeper-operator` (the operator),
# `txnkeeper verify-invalidation` (the verifier). Java is only in the `verifier` target, which Spark needs:
#   docker build -t txnkeeper:2.0.0 .                            # runtime + operator (default, last stage)
#   docker build -t txnkeeper-verifier:2.0.0 --target verifier .  # + Java + PySpark
# Both run as uid 10001 with a read-only root filesystem: the pods write only /data (their PV) and /tmp.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtualenv with the package, protobuf code generated from proto/ ---------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv && python -m venv /opt/protoc
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY runtime ./runtime
COPY operator ./operator
# Generated code is a build product (never committed): same generator and plugins as `make proto`.
RUN /opt/protoc/bin/pip install grpcio-tools mypy-protobuf \
 && PYTHONPATH=runtime /opt/protoc/bin/python -m txnkeeper.pb.generate --proto-dir proto --out-root runtime
# `offload`: boto3 for the S3 driver of PIP-76 ledger offload (store pods; the filesystem driver needs nothing).
RUN pip install '.[operator,offload]'

FROM build AS build-verifier
RUN pip install '.[operator,spark,offload]'

# ---- common base: non-root user, no package caches -------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
RUN groupadd --gid 10001 txnkeeper \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin txnkeeper \
 && install -d -o 10001 -g 10001 /data
EXPOSE 6650 8080 8081

# ---- verifier: the runtime plus a JRE and PySpark (Spark local[*] or a cluster master) ---------------------
FROM base AS verifier
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/default-java SPARK_LOCAL_DIRS=/tmp
COPY --from=build-verifier /opt/venv /opt/venv
USER 10001:10001
ENTRYPOINT ["txnkeeper"]
CMD ["verify-invalidation", "--help"]

# ---- runtime (default): pods and operator ------------------------------------------------------------------
FROM base AS runtime
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
VOLUME ["/data"]
# The operator's StatefulSet and Deployment set `command` explicitly; this default just explains itself.
CMD ["txnkeeper", "--help"]
