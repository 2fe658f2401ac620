"""A gRPC server process with one echo stream (`/t.Echo/Stream`), for tests of the client's
channel against a server that stops answering. `python -m support.echo_server PORT` (tests/
on PYTHONPATH) prints "up" once it listens on 127.0.0.1:PORT. It uses the brokers' server
options."""
from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import grpc

from shadowtopic.broker.memory import server_options

METHOD = "/t.Echo/Stream"


async def _echo(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


async def main(port: int) -> None:
    server = grpc.aio.server(options=server_options())
    handler = grpc.method_handlers_generic_handler(
        "t.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(_echo)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("up", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
