"""`Dial` (source/security/dial.py): a token reaches the server on every call kind, through
sync and asyncio channels, asked of its source at each call; `token_source` takes a string,
a file (read again at each call) or a callable, and refuses anything else."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from shadowtopic.security.dial import Dial, token_source

KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _handlers(seen: list[str | None]):
    def auth(context) -> bytes:
        value = dict(context.invocation_metadata()).get("authorization")
        seen.append(value)
        return (value or "").encode()

    async def uu(request, context):
        return auth(context)

    async def us(request, context):
        yield auth(context)

    async def su(requests, context):
        async for _ in requests:
            pass
        return auth(context)

    async def ss(requests, context):
        async for _ in requests:
            pass
        yield auth(context)
    return grpc.method_handlers_generic_handler("t.S", {
        "unary_unary": grpc.unary_unary_rpc_method_handler(uu),
        "unary_stream": grpc.unary_stream_rpc_method_handler(us),
        "stream_unary": grpc.stream_unary_rpc_method_handler(su),
        "stream_stream": grpc.stream_stream_rpc_method_handler(ss)})


async def _serve(seen):
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handlers(seen),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_every_call_kind_carries_the_current_token_sync_and_asyncio():
    tokens = iter(f"t{i}" for i in range(100))

    async def main() -> tuple[list, list]:
        seen: list[str | None] = []
        server, url = await _serve(seen)
        try:
            d = Dial(token=lambda: next(tokens))
            async with d.aio_channel(url) as ch:
                for kind in KINDS:
                    call = getattr(ch, kind)(f"/t.S/{kind}")
                    arg = b"x" if kind.startswith("unary") else iter([b"x"])
                    if kind.endswith("stream"):
                        [r async for r in call(arg)]
                    else:
                        await call(arg)
            aio = list(seen)
            seen.clear()

            def sync_calls() -> None:
                with d.channel(url) as ch:
                    for kind in KINDS:
                        call = getattr(ch, kind)(f"/t.S/{kind}")
                        arg = b"x" if kind.startswith("unary") else iter([b"x"])
                        out = call(arg, timeout=5)
                        if kind.endswith("stream"):
                            list(out)
            await asyncio.to_thread(sync_calls)
            return aio, list(seen)
        finally:
            await server.stop(None)
    aio, sync = asyncio.run(main())
    assert aio == [f"Bearer t{i}" for i in range(4)]      # one fresh token per call
    assert sync == [f"Bearer t{i}" for i in range(4, 8)]


def test_without_a_token_no_authorization_is_sent():
    async def main() -> list:
        seen: list[str | None] = []
        server, url = await _serve(seen)
        try:
            async with Dial().aio_channel(url) as ch:
                await ch.unary_unary("/t.S/unary_unary")(b"x")
        finally:
            await server.stop(None)
        return seen
    assert asyncio.run(main()) == [None]


def test_token_source_takes_a_string_a_file_or_a_callable(tmp_path):
    assert token_source("  abc ")() == "abc"
    assert token_source(None) is None
    path = tmp_path / "t"
    path.write_text("one\n")
    read = token_source(path)
    assert read() == "one"
    path.write_text("two")
    assert read() == "two"  # read again at each call
    assert token_source(f"file://{path}")() == "two"
    assert token_source(lambda: "x")() == "x"
    for bad in (b"bytes", 42, "   "):
        with pytest.raises(ValueError):
            token_source(bad)  # type: ignore[arg-type]
