"""``kubectl txnkeeper VERB ...``: arguments, output and exit codes (0 done, 1 failed, 2 bad usage).

Every failure is one ``error:`` line on stderr saying what was asked, what went wrong and what to do;
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import yaml

from txnkeeper_operator import naming
from txnkeeper_operator.kubectl_plugin import actions, certs, reads, refs, views
from txnkeeper_operator.kubectl_plugin.connect import Cluster, connect
from txnkeeper_operator.kubectl_plugin.failures import EXIT_FAILED, EXIT_USAGE, PluginError

PROG = "kubectl txnkeeper"
DEBUG_ENV = "KUBECTL_TXNKEEPER_DEBUG"
RESOURCE_HELP = "tc NAME, pas NAME, KIND/NAME (kinds: " + refs.KNOWN + ")"


def _connection_options(parser: argparse.ArgumentParser, default: Any) -> None:
    # Accepted before and after the verb, as kubectl accepts its flags anywhere; SUPPRESS on the
    # verbs' copies keeps a value given before the verb.
    parser.add_argument(
        "--kubeconfig", default=default, help="kubeconfig file (default $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", default=default, help="kubeconfig context (default the current one)")
    parser.add_argument("-n", "--namespace", default=default, help="namespace (default the context's)")


def _verb(sub: Any, name: str, help_: str, **kwargs: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_, **kwargs)
    _connection_options(parser, argparse.SUPPRESS)
    return parser


def _resource_arg(parser: argparse.ArgumentParser, optional: bool) -> None:
    parser.set_defaults(need_name=not optional)
    parser.add_argument(
        "resource", nargs="*" if optional else "+", metavar="RESOURCE",
        help=RESOURCE_HELP + (" (omitted: every resource in the namespace)" if optional else ""),
    )  # fmt: skip


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=PROG,
        description="Status and controls of txnkeeper's TransactionCoordinators and PendingAckStores.",
    )
    _connection_options(top, None)
    sub = top.add_subparsers(dest="verb", required=True, metavar="VERB")

    status = _verb(sub, "status", "phase, conditions, pods (version, format level, batch log, offload), "
                   "downgrade, verifier report, offload audit, placement")  # fmt: skip
    _resource_arg(status, optional=True)
    status.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    status.set_defaults(run=run_status)

    rollout = sub.add_parser("rollout", help="rollout history")
    rollout_sub = rollout.add_subparsers(dest="rollout_verb", required=True, metavar="VERB")
    history = _verb(rollout_sub, "history", "the resource's Events, oldest first, and its last action")
    _resource_arg(history, optional=False)
    history.set_defaults(run=run_history)

    verify = sub.add_parser("verify", help="run the invalidation verifier")
    verify_sub = verify.add_subparsers(dest="verify_verb", required=True, metavar="VERB")
    now = _verb(verify_sub, "now", "create a Job from the resource's verifier CronJob (as kubectl create "
                "job --from=cronjob/NAME-verifier); the operator reads its report into status")  # fmt: skip
    _resource_arg(now, optional=False)
    now.set_defaults(run=run_verify_now)

    for name, paused in (("pause", True), ("resume", False)):
        p = _verb(sub, name, f"{'set' if paused else 'remove'} the {naming.PAUSE_ANNOTATION} annotation")
        _resource_arg(p, optional=False)
        p.set_defaults(run=run_pause if paused else run_resume)

    cert = _verb(sub, "certs", "expiry of the certificates in txnkeeper's TLS Secrets (tls.crt, ca.crt); "
                 "exit 1 if one is expired or unreadable")  # fmt: skip
    _resource_arg(cert, optional=True)
    cert.add_argument(
        "-l", "--selector", default=certs.DEFAULT_SELECTOR, help="label selector of the Secrets"
    )
    cert.set_defaults(run=run_certs)
    return top


# ---- verbs (each returns the exit code) ---------------------------------------------------------------


def _one(args: argparse.Namespace) -> refs.Ref:
    (ref,) = args.refs
    assert isinstance(ref, refs.Ref)
    return ref


def run_status(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    wanted: list[refs.Ref] = args.refs
    objs = reads.resources(cluster, wanted)
    single = len(wanted) == 1 and wanted[0].name is not None
    if args.output in ("json", "yaml"):
        doc: Any = objs[0] if single else {"apiVersion": "v1", "kind": "List", "items": objs}
        if args.output == "json":
            out.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        else:
            out.write(yaml.safe_dump(doc, sort_keys=True))
        return 0
    if not objs:
        out.write(
            f"No txnkeeper resources ({', '.join(str(r) for r in wanted)})"
            f" in namespace {cluster.namespace}.\n"
        )
        return 0
    out.write("\n\n".join(views.status_text(o) for o in objs) + "\n")
    return 0


def run_history(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    ref = _one(args)
    assert ref.name is not None
    obj = reads.get_resource(cluster, ref.kind, ref.name)
    out.write(views.history_text(obj, reads.events_of(cluster, obj)) + "\n")
    return 0


def run_verify_now(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    ref = _one(args)
    assert ref.name is not None
    obj = reads.get_resource(cluster, ref.kind, ref.name)
    job, note = actions.verify_now(cluster, ref, obj)
    out.write(
        f"job.batch/{job['metadata']['name']} created from cronjob/{naming.verifier(ref.name)}"
        f" in namespace {cluster.namespace}\n"
        f"  its report goes to configmap/{naming.report_config_map(ref.name)}; the operator shows it as"
        f" status.lastVerifierReport (kubectl txnkeeper status {ref.kind.short} {ref.name})\n"
        f"  {note}\n"
    )
    return 0


def _pause(cluster: Cluster, args: argparse.Namespace, out: TextIO, paused: bool) -> int:
    ref = _one(args)
    assert ref.name is not None
    before = reads.get_resource(cluster, ref.kind, ref.name)
    was = (
        str((before["metadata"].get("annotations") or {}).get(naming.PAUSE_ANNOTATION, "")).lower() == "true"
    )
    after = actions.set_paused(cluster, ref, paused)
    phase = (after.get("status") or {}).get("phase", "-")
    if paused:
        what = "was already paused" if was else f"paused ({naming.PAUSE_ANNOTATION}=true set)"
        then = f"the operator observes and reports but changes nothing until `{PROG} resume {ref}`"
    else:
        what = f"resumed ({naming.PAUSE_ANNOTATION} removed)" if was else "was not paused"
        then = "the operator reconciles it again"
    out.write(f"{ref} {what}: {then}; phase before the operator reacts: {phase}\n")
    return 0


def run_pause(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    return _pause(cluster, args, out, True)


def run_resume(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    return _pause(cluster, args, out, False)


def run_certs(cluster: Cluster, args: argparse.Namespace, out: TextIO) -> int:
    selector = str(args.selector)
    for ref in args.refs:
        if ref.name is not None:
            selector += f",app.kubernetes.io/instance={ref.name}"
    rows = certs.list_rows(cluster, selector)
    out.write(certs.certs_text(rows, cluster.namespace, selector) + "\n")
    return EXIT_FAILED if certs.any_unusable(rows) else 0


# ---- entry point --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:  # argparse printed usage or help
        return int(exit_.code or 0) if isinstance(exit_.code, int) else EXIT_USAGE
    run: Callable[[Cluster, argparse.Namespace, TextIO], int] = args.run
    try:
        # Names first: a misspelt kind is reported as such, cluster or not.
        args.refs = refs.parse(args.resource, need_name=args.need_name)
        cluster = connect(
            getattr(args, "kubeconfig", None),
            getattr(args, "context", None),
            getattr(args, "namespace", None),
        )
        return run(cluster, args, out)
    except refs.UsageError as problem:
        err.write(f"error: {problem}\n")
        return EXIT_USAGE
    except PluginError as problem:
        err.write(f"error: {problem}\n")
        return problem.code
    except KeyboardInterrupt:
        return 130
    except Exception as problem:  # a bug of ours: still one line, the traceback on request
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc(file=err)
        err.write(
            f"error: internal error: {type(problem).__name__}: {problem} (set {DEBUG_ENV}=1 for details)\n"
        )
        return EXIT_FAILED
