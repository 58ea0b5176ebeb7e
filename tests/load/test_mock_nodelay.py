"""The loopback mock sets TCP_NODELAY on every accepted connection (read back from the live sockets)."""

from __future__ import annotations

import pytest

from chaos.load.client import make_http_client, stream_request
from chaos.load.mock import ThreadedMockServer
from chaos.model.observations import StreamRecord

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def test_kept_alive_connections_have_tcp_nodelay(mock_server: ThreadedMockServer) -> None:
    async with make_http_client(2) as http:
        for i in range(2):  # the second request reuses the first one's connection
            rec = await stream_request(http, mock_server.base_url + "/completions", {"stream": True, "max_tokens": 2},
                                       StreamRecord(id=f"n{i}", phase="p"), request_timeout=10)
            assert rec.complete
        states = mock_server.nodelay()
        assert http.connects == 1
    assert states == [True]
