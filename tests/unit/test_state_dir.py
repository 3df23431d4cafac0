from __future__ import annotations

import stat
from pathlib import Path

import pytest

from common.config.state_dir import StateLock, ensure_writable, write_private
from common.errors import ConfigError, StartupError


def test_creates_missing_directory_private(tmp_path: Path) -> None:
    target = ensure_writable(tmp_path / "a" / "state")
    assert target.is_dir()
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


@pytest.mark.parametrize("kind", ["parent_is_file", "proc"])
def test_unwritable_location_is_a_config_error(tmp_path: Path, kind: str) -> None:
    if kind == "parent_is_file":
        blocker = tmp_path / "file"
        blocker.write_text("x")
        path = blocker / "state"
    else:
        path = Path("/proc/versus-state")
    with pytest.raises(ConfigError, match=r"state directory .* is not writable"):
        ensure_writable(path)


def test_lock_is_exclusive(tmp_path: Path) -> None:
    first, second = StateLock(tmp_path), StateLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(StartupError, match="in use by pid"):
            second.acquire()
    finally:
        first.release()
    second.acquire()
    second.release()


def test_write_private_is_atomic_and_0600(tmp_path: Path) -> None:
    path = tmp_path / "k" / "key.pem"
    write_private(path, b"one")
    write_private(path, b"two")
    assert path.read_bytes() == b"two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["key.pem"]


def test_ports_from_a_range_skip_taken_ones() -> None:
    import socket

    from common.embedded import process

    taken, released = socket.socket(), socket.socket()
    taken.bind(("127.0.0.1", 0))
    released.bind(("127.0.0.1", 0))
    busy, free = taken.getsockname()[1], released.getsockname()[1]
    released.close()
    try:
        process.use_port_range(busy, busy)
        with pytest.raises(OSError, match="no 1 free ports"):
            process.free_port()
        process.use_port_range(free, free)
        assert process.free_ports(1) == [free]
        assert process.free_port() == free  # in turn, wrapping around the range
    finally:
        taken.close()
        process._port_range = None
