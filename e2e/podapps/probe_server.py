"""A tiny HTTP server that runs as a pod in the node tests (shipped to the pod in a ConfigMap).

Why: to prove what the node does for a pod, the pod itself reports it: its environment (downward API,
ConfigMap/Secret env, $(VAR) expansion), argv, hostname, mounted files, and a boot log on its
persistent volume; it serves a readiness endpoint the test can flip, and records SIGTERM on the volume
(or ignores it, to prove the SIGKILL after the grace period). Standard library only.
"""

import json
import os
import signal
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    args = dict(zip(sys.argv[1::2], sys.argv[2::2], strict=False))
    data = args.get("--data", "/data")
    ignore_sigterm = args.get("--ignore-sigterm") == "yes"
    uid = os.environ.get("POD_UID", "?")
    with open(os.path.join(data, "boots.log"), "a") as f:
        f.write(f"{uid} {os.getpid()}\n")
    state = {"ready": True}

    def on_term(_sig: int, _frame: object) -> None:
        with open(os.path.join(data, "shutdown.log"), "a") as f:
            f.write(f"SIGTERM {uid}\n")
        if not ignore_sigterm:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: object) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            if self.path == "/ready":
                self._send(200 if state["ready"] else 503, state)
            elif self.path == "/info":
                files = {}
                for root in (
                    "/etc/probe-secret",
                    "/etc/probe-config",
                    "/var/run/secrets/kubernetes.io/serviceaccount",
                ):
                    if os.path.isdir(root):
                        for name in sorted(os.listdir(root)):
                            path = os.path.join(root, name)
                            if os.path.isfile(path):
                                with open(path) as fh:
                                    files[path] = fh.read()
                with open(os.path.join(data, "boots.log")) as fh:
                    boots = fh.read().split("\n")
                shutdown = ""
                if os.path.exists(os.path.join(data, "shutdown.log")):
                    with open(os.path.join(data, "shutdown.log")) as fh:
                        shutdown = fh.read()
                self._send(
                    200,
                    {
                        "env": dict(os.environ),
                        "argv": sys.argv,
                        "hostname": socket.gethostname(),
                        "hostnameResolvesTo": socket.gethostbyname(socket.gethostname()),
                        "pid": os.getpid(),
                        "cwd": os.getcwd(),
                        "files": files,
                        "boots": [b for b in boots if b],
                        "shutdown": shutdown,
                        "time": time.time(),
                    },
                )
            else:
                self._send(404, {"error": self.path})

        def do_POST(self) -> None:
            if self.path in ("/ready", "/unready"):
                state["ready"] = self.path == "/ready"
                self._send(200, state)
            else:
                self._send(404, {"error": self.path})

        def log_message(self, format: str, *a: object) -> None:
            pass

    server = ThreadingHTTPServer((args.get("--bind", "0.0.0.0"), int(args.get("--port", "8000"))), Handler)
    print(f"serving on {server.server_address}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
