"""Where Pulsar's clients are sent, declared once: the ``--pulsar-urls`` / ``--pulsar-coordinator-urls``
serve flags and their env (the operator sets the env from the resources' pods), and the config file's
``pulsar`` section, whose one key ``partitionedTopics`` (topic -> partitions) is a structure its reader
(server/pulsar_config.py) checks, each count through ``PARTITIONS``.
"""

from __future__ import annotations

from txnkeeper.contract.settings.schema import Section, Setting

MAX_PARTITIONS = 10_000

PARTITIONS = Setting(
    "partitions",
    "partitions",
    "int",
    None,
    "Partitions of a partitioned topic.",
    minimum=1,
    maximum=MAX_PARTITIONS,
)

PULSAR = Section(
    "pulsar",
    "Pulsar's protocol: the pods' addresses lookups answer, and the partitioned topics.",
    (
        Setting(
            "storeUrls",
            "store_urls",
            "text",
            None,
            "pulsar://host:port of every store pod in ordinal order: what Pulsar lookups of topics answer "
            "(none: this pod's own address).",
            flag="--pulsar-urls",
            env="PULSAR_URLS",
            format="pulsar-urls",
            in_file=False,
            in_cr=False,
        ),
        Setting(
            "coordinatorUrls",
            "coordinator_urls",
            "text",
            None,
            "pulsar://host:port of every coordinator pod in ordinal order: where Pulsar clients find "
            "transaction coordinators, and store pods register their transactions.",
            flag="--pulsar-coordinator-urls",
            env="PULSAR_COORDINATOR_URLS",
            format="pulsar-urls",
            in_file=False,
            in_cr=False,
        ),
    ),
    structured=("partitionedTopics",),
)
