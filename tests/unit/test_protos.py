"""The stale-stub check: committed stubs match a fresh generation, and a proto edit is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools import protos

pytestmark = pytest.mark.timeout(120)


def test_committed_stubs_match_a_fresh_generation() -> None:
    assert protos.check(protos.PROTO_ROOT, protos.GEN_ROOT) == []


def test_editing_a_proto_without_regenerating_is_detected(tmp_path: Path) -> None:
    edited = tmp_path / "protos"
    shutil.copytree(protos.PROTO_ROOT, edited)
    target = edited / "versus" / "router" / "v1" / "task_router.proto"
    target.write_text(
        target.read_text().replace(
            "message GetTaskRequest {\n  string task_id = 1;\n}",
            "message GetTaskRequest {\n  string task_id = 1;\n  bool include_history = 2;\n}",
        )
    )
    problems = protos.check(edited, protos.GEN_ROOT)
    assert any(p.startswith("stale: router/v1/task_router_pb2.py") for p in problems)
    assert any(p.startswith("stale: router/v1/task_router_pb2.pyi") for p in problems)


def test_a_new_proto_file_is_reported_missing(tmp_path: Path) -> None:
    edited = tmp_path / "protos"
    shutil.copytree(protos.PROTO_ROOT, edited)
    extra = edited / "versus" / "fleet" / "v1" / "extra.proto"
    extra.write_text('syntax = "proto3";\npackage versus.fleet.v1;\nmessage Extra {}\n')
    problems = protos.check(edited, protos.GEN_ROOT)
    assert "missing: fleet/v1/extra_pb2.py" in problems
