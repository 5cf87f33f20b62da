"""Listening sockets: what agl's server and policy server accept connections on."""

from __future__ import annotations

import asyncio
import socket

from agl.core.net import bind


def test_connections_accepted_on_asyncios_own_loop_send_without_delay() -> None:
    """A response written in two parts must not wait for the client's delayed ACK (Nagle): asyncio's loop, unlike
    uvloop, sets TCP_NODELAY only on sockets made with protocol IPPROTO_TCP, which accepted sockets inherit."""

    async def check() -> int:
        listener = bind("127.0.0.1", 0)
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def accepted(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listener)
        try:
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            nodelay = await asyncio.wait_for(seen, 10)
            writer.close()
            return nodelay
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(check()) != 0
