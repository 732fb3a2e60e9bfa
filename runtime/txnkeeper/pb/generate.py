"""Generate the protobuf modules of ``txnkeeper.pb`` from ``proto/``.

It exists so that the Makefile, the Docker build and the drift test all generate the same way: the
.proto files are the source of truth and the Python code is a build product. ``proto/pulsar/`` holds
Pulsar's PulsarApi.proto once ``make proto`` fetched it (proto/fetch_pulsar_api.sh); it is compiled
with the others.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def generate(proto_dir: Path, out_root: Path) -> list[Path]:
    """Compile every ``*.proto`` in ``proto_dir`` into ``out_root/txnkeeper/pb``; return the outputs."""
    from grpc_tools import protoc

    protos = sorted(proto_dir.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files in {proto_dir}: run from the repository root")
    pulsar_dir = proto_dir / "pulsar"
    pulsar = sorted(pulsar_dir.glob("*.proto"))
    if not pulsar:
        raise SystemExit(
            f"no {pulsar_dir}/PulsarApi.proto: `make proto` fetches it (proto/fetch_pulsar_api.sh)"
        )
    (out_root / "txnkeeper" / "pb").mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    # The virtual include path makes generated imports read `from txnkeeper.pb import X_pb2`.
    plugin = Path(sys.executable).parent / "protoc-gen-mypy"
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={plugin}",
        f"-Itxnkeeper/pb={proto_dir}",
        f"-Itxnkeeper/pb={pulsar_dir}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--mypy_out={out_root}",
        *[f"txnkeeper/pb/{p.name}" for p in protos + pulsar],
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed for {proto_dir}")
    out = out_root / "txnkeeper" / "pb"
    return sorted(out.glob("*_pb2.py*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--proto-dir", type=Path, default=Path("proto"))
    parser.add_argument("--out-root", type=Path, default=Path("runtime"))
    ns = parser.parse_args(argv)
    for path in generate(ns.proto_dir.resolve(), ns.out_root.resolve()):
        print(f"generated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
