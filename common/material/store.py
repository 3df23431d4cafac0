"""The ``key_material`` row in PostgreSQL (common/material/shared.py): read it, claim it, replace it.

Synchronous on purpose: it runs at a service's start, in the key and CA
commands, and from the follower on a worker thread; none of it is a hot path.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from common.db.schema import key_material

ROW = "control-plane"


@dataclass(frozen=True, slots=True)
class MaterialRow:
    material_id: str
    mode: str
    version: int
    sealed_with: str | None
    sealed: bytes | None
    public: bytes | None
    summary: dict[str, Any]
    updated_by: str
    updated_at: Any

    def __repr__(self) -> str:  # the sealed bytes stay out of logs even though they are ciphertext
        return f"MaterialRow({self.material_id!r}, mode={self.mode!r}, version={self.version})"


def host() -> str:
    return socket.gethostname()


def get(conn: Connection, *, for_update: bool = False) -> MaterialRow | None:
    query = select(key_material).where(key_material.c.name == ROW)
    if for_update:
        query = query.with_for_update()
    row = conn.execute(query).mappings().first()
    if row is None:
        return None
    return MaterialRow(
        row["material_id"],
        row["mode"],
        int(row["version"]),
        row["sealed_with"],
        bytes(row["sealed"]) if row["sealed"] is not None else None,
        bytes(row["public"]) if row["public"] is not None else None,
        dict(row["summary"] or {}),
        row["updated_by"],
        row["updated_at"],
    )


def version(conn: Connection) -> int | None:
    """The row's version alone (what the follower polls)."""
    value = conn.execute(select(key_material.c.version).where(key_material.c.name == ROW)).scalar()
    return None if value is None else int(value)


def anchor_local(conn: Connection, material_id: str, summary: dict[str, Any]) -> MaterialRow:
    """Record ``material_id`` as the deployment's local material unless a row exists; the row."""
    conn.execute(
        pg_insert(key_material)
        .values(
            name=ROW, material_id=material_id, mode="local", version=1, summary=summary, updated_by=host()
        )
        .on_conflict_do_nothing(index_elements=["name"])
    )
    row = get(conn)
    assert row is not None
    return row


def put_shared(
    conn: Connection,
    *,
    material_id: str,
    version: int,
    sealed_with: str,
    sealed: bytes,
    public: bytes,
    summary: dict[str, Any],
    exists: bool,
) -> None:
    """Write version ``version`` of the shared material (the caller holds the row's lock)."""
    values = {
        "material_id": material_id,
        "mode": "shared",
        "version": version,
        "sealed_with": sealed_with,
        "sealed": sealed,
        "public": public,
        "summary": summary,
        "updated_by": host(),
        "updated_at": func.now(),
    }
    if exists:
        conn.execute(update(key_material).where(key_material.c.name == ROW).values(**values))
    else:
        conn.execute(insert(key_material).values(name=ROW, **values))
