#!/usr/bin/env python3
"""Regenerate the Python protobuf/gRPC code from proto/ (`make proto`).

    python scripts/gen_proto.py [--out DIR]

proto/shadowtopic/<path>/x.proto generates <out>/<path>/x_pb2.py (+ .pyi, + x_pb2_grpc.py for
services), <out> being source/, the folder of the package `shadowtopic`: so
`proto/shadowtopic/pb/v1/admin.proto` becomes `shadowtopic.pb.v1.admin_pb2` in
source/pb/v1/admin_pb2.py, and protoc's own imports work without rewriting.
tests/test_source/wire/test_proto_fresh.py fails when the checked-in code differs from a fresh
generation.
"""
import argparse
import pathlib
import shutil
import sys
import tempfile

import grpc_tools
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"


def generate(out: pathlib.Path) -> list[pathlib.Path]:
    """Write the generated files under `out` as the package's folder (out/pb/v1/...)."""
    files = sorted(PROTO.rglob("*.proto"))
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}", *[str(f) for f in files]]
        if protoc.main(args) != 0:
            sys.exit("protoc failed")
        shutil.copytree(pathlib.Path(tmp) / "shadowtopic", out, dirs_exist_ok=True)
    return files


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "source"))
    files = generate(pathlib.Path(p.parse_args().out))
    print(f"generated code for {len(files)} proto files")


if __name__ == "__main__":
    main()
