"""How the broker's services read a stream's requests (source/broker/memory.py `reader`):
from the gRPC context when the service has one, from the request iterator when a test drives
it with a plain iterator and passes None; the choice is by that argument, not by probing the
context for attributes."""
from __future__ import annotations

import ast
from pathlib import Path

import grpc

from shadowtopic.broker.memory import reader

ROOT = Path(__file__).resolve().parents[3]


class ReadingContext:
    """The part of a grpc.aio stream context `reader` uses: `read()` until grpc.aio.EOF."""

    def __init__(self, requests: list[bytes]):
        self.requests = list(requests)

    async def read(self):
        return self.requests.pop(0) if self.requests else grpc.aio.EOF


async def untouched():
    raise AssertionError("the request iterator was read although a context was given")
    yield b""  # an async generator


async def plain(requests: list[bytes]):
    for r in requests:
        yield r


async def drain(next_request) -> list[bytes]:
    out = []
    for _ in range(10):  # bounded: a reader that never ends fails the test
        data = await next_request()
        if data is None:
            return out
        out.append(data)
    raise AssertionError(f"no end after {out}")


def test_with_a_context_the_requests_come_from_it_and_the_iterator_is_not_read(arun):
    got = arun(drain(reader(untouched(), ReadingContext([b"a", b"b"]))))
    assert got == [b"a", b"b"]


def test_without_a_context_the_requests_come_from_the_iterator(arun):
    assert arun(drain(reader(plain([b"x", b"y", b"z"]), None))) == [b"x", b"y", b"z"]


def probes(path: Path) -> list[str]:
    """The hasattr/getattr/setattr calls in `path` whose object is a servicer context."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr", "setattr") and node.args
                and "context" in ast.unparse(node.args[0]).lower()):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_service_probes_its_grpc_context_for_attributes():
    files = [p for folder in ("source", "shadow", "compaction")
             for p in sorted((ROOT / folder).rglob("*.py")) if "/pb/" not in str(p)]
    assert len(files) > 50
    assert [line for p in files for line in probes(p)] == []
