"""Regenerates the committed protocol code from protos/ (the one way to do it).

Usage: python scripts/genproto.py [--check]

Writes membership/v1/membership_pb2.py, *_pb2_grpc.py and typed stubs
(*.pyi, via mypy-protobuf) and the same for arbiter/v1. With --check, writes
into a temporary folder and exits 1 when the committed files differ (the
staleness test runs this).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = [Path("membership/v1/membership.proto"), Path("arbiter/v1/peer.proto")]


def generate(out: Path) -> list[Path]:
    """Runs protoc (grpcio-tools) for every proto into ``out``; returns the files written."""
    from grpc_tools import protoc  # imported here: only a test/dev dependency

    include = Path(protoc.__file__).parent / "_proto"
    # mypy-protobuf's plugins live beside the interpreter (a venv's bin/).
    bindir = Path(sys.executable).parent
    written: list[Path] = []
    for proto in PROTOS:
        (out / proto.parent).mkdir(parents=True, exist_ok=True)
        args = [
            "protoc",
            f"-I{ROOT / 'protos'}",
            f"-I{include}",
            f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            str(ROOT / "protos" / proto),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {proto}")
        written += sorted((out / proto.parent).glob("*_pb2*"))
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
        stale = []
        for f in files:
            rel = f.relative_to(tmp)
            target = ROOT / rel
            if args.check:
                if not target.exists() or not filecmp.cmp(f, target, shallow=False):
                    stale.append(str(rel))
            else:
                shutil.copyfile(f, target)
        if args.check and stale:
            print("stale generated code: " + ", ".join(stale), file=sys.stderr)
            print("run: python scripts/genproto.py", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
