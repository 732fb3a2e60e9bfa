"""A pod's TLS settings, declared once: the ``--tls-*`` serve flags, their ``TXNKEEPER_TLS_*`` env (what
the operator sets) and the config file's ``tls`` section (docs/contracts.md §6 "TLS").

Only each value on its own is declared here; the rules between them (a certificate needs its key, a
CA file is needed for peers and client certificates) and the checks of the files themselves are
server/tls_settings.py's. Not CR fields: the operator renders its own ``spec.tls`` into the env.
"""

from __future__ import annotations

from txnkeeper.contract.settings.schema import Section, Setting
from txnkeeper.contract.tls import DEFAULT_RELOAD_INTERVAL_S, LISTENERS

CLIENT_AUTH_MODES = ("none", "request", "require")
MIN_RELOAD_INTERVAL_S = 0.05
MAX_RELOAD_INTERVAL_S = 3600
_AUTH_ERROR = "{where} is {value}: give none, request or require"


def _file(key: str, field: str, flag: str, env: str, description: str) -> Setting:
    return Setting(
        key,
        field,
        "text",
        None,
        description,
        flag=flag,
        env=env,
        in_cr=False,
        range_text="a file path",
    )


TLS = Section(
    "tls",
    "TLS of a pod's listeners: its certificate, key and CA files, which listeners use them, client "
    "certificates, and how often the files are checked for a rotation.",
    (
        _file(
            "certFile",
            "cert_file",
            "--tls-cert-file",
            "TLS_CERT_FILE",
            "PEM certificate (chain; the leaf first) of this pod; with it the listeners speak TLS.",
        ),
        _file("keyFile", "key_file", "--tls-key-file", "TLS_KEY_FILE", "Its PEM private key."),
        _file(
            "caFile",
            "ca_file",
            "--tls-ca-file",
            "TLS_CA_FILE",
            "PEM CA bundle: verifies peer pods and client certificates; may hold several CAs, all trusted.",
        ),
        Setting(
            "listeners",
            "listeners",
            "list",
            list(LISTENERS),
            "Which listeners use TLS once a certificate is given (a list in the file, comma-separated as a "
            "flag or env).",
            flag="--tls-listeners",
            env="TLS_LISTENERS",
            choices=LISTENERS,
            in_cr=False,
            error="{where}: give one or more of " + ", ".join(LISTENERS) + ", got {value}",
        ),
        Setting(
            "clientAuth.client",
            "client_auth",
            "enum",
            "none",
            "Client protocol port: none, request (verified if sent) or require a client certificate.",
            flag="--tls-client-auth",
            env="TLS_CLIENT_AUTH",
            choices=CLIENT_AUTH_MODES,
            in_cr=False,
            error=_AUTH_ERROR,
        ),
        Setting(
            "clientAuth.admin",
            "admin_client_auth",
            "enum",
            "none",
            "Admin API port: none, request or require a client certificate.",
            flag="--tls-admin-client-auth",
            env="TLS_ADMIN_CLIENT_AUTH",
            choices=CLIENT_AUTH_MODES,
            in_cr=False,
            error=_AUTH_ERROR,
        ),
        Setting(
            "reloadIntervalSeconds",
            "reload_interval_s",
            "number",
            DEFAULT_RELOAD_INTERVAL_S,
            "Seconds between checks of the files for a rotation.",
            flag="--tls-reload-interval",
            env="TLS_RELOAD_INTERVAL",
            minimum=MIN_RELOAD_INTERVAL_S,
            maximum=MAX_RELOAD_INTERVAL_S,
            unit="s",
            in_cr=False,
            error="{where} is {value}: must be seconds between 0.05 and 3600 (default "
            + f"{DEFAULT_RELOAD_INTERVAL_S:g})",
        ),
    ),
    unknown_error="{where} has unknown keys {unknown}; known: {known}",
)
