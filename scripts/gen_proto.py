#!/usr/bin/env python3
"""Regenerate the Python protobuf/gRPC code from proto/ (`make proto`).

    python scripts/gen_proto.py [--out DIR]

proto/<path>/x.proto generates <out>/<path>/x_pb2.py (+ .pyi, + x_pb2_grpc.py for services),
so `proto/source/pb/v1/admin.proto` becomes `source.pb.v1.admin_pb2` and protoc's own imports
work without rewriting. tests/test_source/test_proto_fresh.py fails when the checked-in code
differs from a fresh generation.
"""
import argparse
import pathlib
import sys

from grpc_tools import protoc
import grpc_tools

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"


def generate(out: pathlib.Path) -> list[pathlib.Path]:
    files = sorted(PROTO.rglob("*.proto"))
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *[str(f) for f in files]]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    return files


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT))
    files = generate(pathlib.Path(p.parse_args().out))
    print(f"generated code for {len(files)} proto files")


if __name__ == "__main__":
    main()
