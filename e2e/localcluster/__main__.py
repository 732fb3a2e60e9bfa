"""Command line for the local control plane: `python -m e2e.localcluster up|down|status|kubeconfig`.

Why: the Makefile's cluster-up/cluster-down targets and humans use the same entry point as the pytest
session fixture, so there is one way to start and stop the cluster.
"""

from __future__ import annotations

import argparse
import sys

from . import controlplane
from .config import Layout, state_dir


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.localcluster", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start etcd, the control plane and the node agent (idempotent)")
    up.add_argument("--timeout", type=float, default=180.0)
    down = sub.add_parser("down", help="stop everything; delete the state unless --keep-state")
    down.add_argument("--keep-state", action="store_true")
    sub.add_parser("status", help="exit 0 when the API server answers /readyz")
    sub.add_parser("kubeconfig", help="print the admin kubeconfig path")
    args = parser.parse_args()
    if args.cmd == "up":
        controlplane.up(timeout=args.timeout)
        print(Layout(state_dir()).admin_kubeconfig)
    elif args.cmd == "down":
        controlplane.down(purge=not args.keep_state)
    elif args.cmd == "status":
        ok = controlplane.is_up()
        print("up" if ok else "down")
        return 0 if ok else 1
    elif args.cmd == "kubeconfig":
        print(Layout(state_dir()).admin_kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
