"""One TLS read buffer for the whole process instead of one per connection.

asyncio reads a TLS connection's ciphertext from its socket into a buffer the connection's
``SSLProtocol`` owns (``get_buffer``), then copies those bytes into the connection's OpenSSL
memory BIO (``buffer_updated``) before the event loop runs anything else: the socket transport
calls ``get_buffer``, ``recv_into`` and ``buffer_updated`` in one synchronous step. Nothing is
left in the buffer between two reads, so every connection of a process can read through the
same one. With the standard class each connection keeps its own buffer alive and written
(``SSLProtocol.max_size``: 256 KiB by default, 16 KiB here): 8 KiB of RSS per parked collector
measured at 3,000 (docs/benchmarks.md, "Idle fleet").

The loop builds its TLS protocols as ``asyncio.sslproto.SSLProtocol(...)`` at call time, so
installing the subclass below in that module's namespace changes every TLS connection made
afterwards, accepted or dialled. It relies on two private attributes of the standard class
(``_ssl_buffer`` and ``_ssl_buffer_view``); tests/unit/test_gateway_socket.py fails if a Python
release renames them, and the fallback is only the old memory cost, never a shared buffer in
use by two connections. On uvloop (``VERSUS_EVENT_LOOP``, the default) TLS is uvloop's own and
this changes nothing but the processes on the standard loop (the benchmarks' load generator).
"""

from __future__ import annotations

from asyncio import sslproto
from typing import Any

# A TLS record carries at most 16 KiB of plaintext: a read of that size takes a whole record.
# (32 KiB per connection cost 160 MiB more at 10,000 sockets for no measurable tunnel gain
# when the buffer was per connection; the size is kept while the tunnel's reads are reworked.)
TLS_READ_BUFFER_BYTES = 16 * 1024


class SharedReadBufferSSLProtocol(sslproto.SSLProtocol):
    """``SSLProtocol`` whose socket reads all land in one process-wide buffer."""

    # Also the plaintext read size (``SSLObject.read``), as on the standard class.
    max_size = TLS_READ_BUFFER_BYTES
    _shared = bytearray(TLS_READ_BUFFER_BYTES)
    _shared_view = memoryview(_shared)

    # The standard __init__ assigns a fresh buffer per connection; these swallow the assignment
    # (the fresh one is freed at once) and answer the shared buffer wherever the class reads it.
    @property
    def _ssl_buffer(self) -> bytearray:
        return SharedReadBufferSSLProtocol._shared

    @_ssl_buffer.setter
    def _ssl_buffer(self, _: Any) -> None:
        pass

    @property
    def _ssl_buffer_view(self) -> memoryview:
        return SharedReadBufferSSLProtocol._shared_view

    @_ssl_buffer_view.setter
    def _ssl_buffer_view(self, _: Any) -> None:
        pass

    def get_buffer(self, n: int) -> memoryview:
        # Never grows past the shared buffer (the standard class would allocate a bigger one
        # per connection when asked): the transport reads at most this much per call.
        return SharedReadBufferSSLProtocol._shared_view


def share_tls_read_buffer() -> None:
    """Make every TLS connection this process makes or accepts from now on read through the
    process-wide buffer (idempotent)."""
    if sslproto.SSLProtocol is not SharedReadBufferSSLProtocol:
        sslproto.SSLProtocol = SharedReadBufferSSLProtocol  # type: ignore[misc]
