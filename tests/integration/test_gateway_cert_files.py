"""A gateway on operator-supplied certificate files loads replaced files without a restart, over a
real TLS listener: the next handshake presents the new certificate, a broken pair changes nothing."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from common.config.state_dir import write_private, write_public
from common.trust.ca_store import CaStore
from common.trust.tls import issue_server_cert, san_entries
from gateway.tls_reload import follow_cert_files

pytestmark = pytest.mark.timeout(30)


class _Server:
    should_exit = False


def _issue(store: CaStore, cert: Path, key: Path, name: str) -> None:
    chain, private = issue_server_cert(store, name, san_entries([name, "127.0.0.1"]))
    write_private(key, private)
    write_public(cert, chain)


async def _presented(port: int, ca: Path) -> str:
    client = ssl.create_default_context(cafile=str(ca))
    client.check_hostname = False
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


async def test_replaced_files_are_presented_at_the_next_handshake(tmp_path: Path) -> None:
    store = CaStore(tmp_path / "state")
    ca = tmp_path / "ca.pem"
    ca.write_text("".join(store.load_or_create().pems("gateway")))
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    _issue(store, cert, key, "first.versus.internal")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = listener.sockets[0].getsockname()[1]
    server = _Server()
    follower = asyncio.create_task(follow_cert_files(context, cert, key, server, interval_s=0.05))
    try:
        assert await _presented(port, ca) == "CN=first.versus.internal"
        key.write_text("not a key")  # half a replacement: the old pair stays in use
        await asyncio.sleep(0.3)
        assert await _presented(port, ca) == "CN=first.versus.internal"
        _issue(store, cert, key, "second.versus.internal")
        for _ in range(100):
            if await _presented(port, ca) == "CN=second.versus.internal":
                break
            await asyncio.sleep(0.05)
        assert await _presented(port, ca) == "CN=second.versus.internal"
    finally:
        server.should_exit = True
        await follower
        listener.close()
        await listener.wait_closed()
