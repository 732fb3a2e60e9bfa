"""Runs inside a pod's private mount and UTS namespaces: bind-mounts volumes, sets the hostname, execs.

Why: a container sees its volumes at their mountPath (/var/lib/txnkeeper, the service-account token
directory, ...). The node agent starts this script under `unshare --mount --uts`, so the bind mounts
and the hostname (the pod name, as in a real container) are private to the pod's process tree and
vanish with it. Only the standard library is used: it runs before the container's environment exists.

Usage: python podinit.py SPEC.json   (SPEC: mounts, hostname, cwd, argv, env)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    os.unlink(sys.argv[1])  # it holds the environment, Secret values included
    # A checkout may live under a directory a pod mounts over (a clone in /tmp, and an emptyDir at
    # /tmp): mounting there would hide the interpreter, the container's program and the other volumes'
    # sources. Such a mount is skipped; for /tmp the process is pointed at the volume through TMPDIR.
    needed = [sys.executable, spec["argv"][0], __file__, *(m["source"] for m in spec["mounts"])]
    needed_real = [os.path.realpath(path) for path in needed]
    for m in spec["mounts"]:
        src, dst = m["source"], m["target"]
        dst_real = os.path.realpath(dst)
        if any(path == dst_real or path.startswith(dst_real.rstrip("/") + "/") for path in needed_real):
            print(f"podinit: not mounting {src} at {dst}: it would hide this node's files", file=sys.stderr)
            if dst_real == "/tmp":
                spec["env"]["TMPDIR"] = src
            continue
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if not os.path.exists(dst):
                open(dst, "a").close()  # a file mount point (subPath onto a file)
        subprocess.run(["mount", "--bind", src, dst], check=True)
        if m.get("readOnly"):
            subprocess.run(["mount", "-o", "remount,bind,ro", dst], check=True)
    socket.sethostname(spec["hostname"])
    os.makedirs(spec["cwd"], exist_ok=True)  # container runtimes create a missing workingDir
    os.chdir(spec["cwd"])
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


if __name__ == "__main__":
    main()
