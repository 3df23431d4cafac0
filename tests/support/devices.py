"""Real devices for driver tests: an SSH server (asyncssh) and an HTTPS API (uvicorn), on loopback threads."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import asyncssh
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from common.embedded.process import free_port
from common.trust.tls import ensure_gateway_tls


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class SshDevice:
    """An SSH server accepting one user/password and running the commands it is sent."""

    username = "ops"
    password = "device-pw"

    def __init__(self) -> None:
        self.port = free_port()
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.commands: list[str] = []
        self._loop = _LoopThread()
        self._server = self._loop.run(self._start())

    async def _start(self) -> Any:
        device = self

        class Server(asyncssh.SSHServer):
            def begin_auth(self, username: str) -> bool:
                return True

            def password_auth_supported(self) -> bool:
                return True

            def validate_password(self, username: str, password: str) -> bool:
                return username == device.username and password == device.password

            def public_key_auth_supported(self) -> bool:
                return True

            def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
                expected = device.client_key.export_public_key()
                return username == device.username and key.export_public_key() == expected

        async def handle(process: asyncssh.SSHServerProcess[str]) -> None:
            command = str(process.command or "")
            device.commands.append(command)
            done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)  # noqa: S602
            process.stdout.write(done.stdout)
            process.stderr.write(done.stderr)
            process.exit(done.returncode)

        return await asyncssh.listen(
            "127.0.0.1",
            self.port,
            server_factory=Server,
            server_host_keys=[self.host_key],
            process_factory=handle,
        )

    @property
    def public_host_key(self) -> str:
        return self.host_key.export_public_key().decode().strip()

    def credentials(self) -> dict[str, Any]:
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "username": self.username,
            "password": self.password,
            "host_key": self.public_host_key,
        }

    def write_client_key(self, path: Path) -> Path:
        """The client's private key in OpenSSH format, for the `ssh` command line client."""
        path.write_bytes(self.client_key.export_private_key("openssh"))
        path.chmod(0o600)
        return path

    def close(self) -> None:
        self._server.close()
        self._loop.close()


class HttpsDevice:
    """A small HTTPS API that records the requests it receives."""

    def __init__(self, directory: Path):
        self.tls = ensure_gateway_tls(directory, "localhost", [])
        self.port = free_port()
        self.requests: list[tuple[str, str, str]] = []

        async def endpoint(request: Request) -> JSONResponse:
            self.requests.append((request.method, request.url.path, request.headers.get("authorization", "")))
            return JSONResponse({"device": "lb-1", "method": request.method, "path": request.url.path})

        app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST", "PUT", "DELETE"])])
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            ssl_certfile=str(self.tls.cert_file),
            ssl_keyfile=str(self.tls.key_file),
            log_config=None,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def credentials(self, bearer: str) -> dict[str, Any]:
        return {
            "base_url": f"https://localhost:{self.port}",
            "ca_file": str(self.tls.ca_file),
            "bearer": bearer,
        }

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class EchoDevice:
    """A TCP server that echoes every byte back and closes its side after the client's EOF."""

    def __init__(self) -> None:
        self.port = free_port()
        self._loop = _LoopThread()
        self._server = self._loop.run(asyncio.start_server(self._echo, "127.0.0.1", self.port))

    @staticmethod
    async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    def close(self) -> None:
        self._server.close()
        self._loop.close()
