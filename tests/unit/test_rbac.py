"""The access policy, token handling and CLI exit statuses, fed values directly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.access import api_tokens, rbac
from common.access.rbac import POLICY, Principal, Role
from common.errors import (
    ConfigError,
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from common.grpc import token_files
from common.grpc.server import bearer_token
from tests.support.access import SERVICE_MODULES
from versus_cp.main import exit_status
from versus_cp.output import age, table


def test_the_policy_names_every_rpc_and_nothing_else() -> None:
    every = {
        f"/{service.full_name}/{method.name}"
        for module in SERVICE_MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert set(POLICY) == every


@pytest.mark.parametrize(
    ("role", "method", "allowed"),
    [
        (Role.PLATFORM, "/versus.router.v1.TaskRouterService/SubmitTask", True),
        (Role.PLATFORM, "/versus.router.v1.TunnelService/OpenTunnel", True),
        (Role.PLATFORM, "/versus.fleet.v1.FleetService/ListCollectors", False),
        (Role.PLATFORM, "/versus.router.v1.CollectorBridgeService/Claim", False),
        (Role.VIEWER, "/versus.fleet.v1.FleetService/ListCollectors", True),
        (Role.VIEWER, "/versus.fleet.v1.FleetService/DrainCollector", False),
        (Role.OPERATOR, "/versus.fleet.v1.FleetService/DrainCollector", True),
        (Role.OPERATOR, "/versus.fleet.v1.FleetService/RevokeCollector", False),
        (Role.OPERATOR, "/versus.fleet.v1.FleetService/SetVaultMode", False),
        (Role.COLLECTOR_ADMIN, "/versus.fleet.v1.FleetService/SetVaultMode", True),
        (Role.COLLECTOR_ADMIN, "/versus.router.v1.TaskRouterService/SubmitTask", False),
        (Role.SERVICE, "/versus.router.v1.CollectorBridgeService/Claim", True),
        (Role.SERVICE, "/versus.fleet.v1.FleetService/ListCollectors", False),
        (Role.COLLECTOR_ADMIN, "/versus.nope.v1.Nope/Anything", False),  # unknown methods: nobody
    ],
)
def test_authorize(role: Role, method: str, allowed: bool) -> None:
    principal = Principal("tok_1", "someone", role)
    if allowed:
        rbac.authorize(principal, method)
    else:
        with pytest.raises(PermissionDenied, match=f"role '{role.value}' may not call"):
            rbac.authorize(principal, method)


def test_the_actor_outside_an_rpc_is_the_default_and_inside_it_is_the_principal() -> None:
    assert rbac.current_actor("sweeper") == "sweeper"
    bound = rbac.bind(Principal("tok_9", "alice", Role.OPERATOR))
    try:
        assert rbac.current_actor() == "alice (tok_9)"
    finally:
        rbac.unbind(bound)
    assert rbac.current() is None


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer vsk_abc", "vsk_abc"),
        ("bearer   vsk_abc ", "vsk_abc"),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic dXNlcg==", None),
        ("vsk_abc", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token_parsing(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_tokens_are_random_prefixed_and_only_their_hash_is_kept() -> None:
    a, b = api_tokens.new_plaintext(), api_tokens.new_plaintext()
    assert a != b and a.startswith("vsk_") and len(a) >= 4 + 43
    assert api_tokens.digest(a) != api_tokens.digest(b) and len(api_tokens.digest(a)) == 32


def test_token_files_are_written_private_and_loose_ones_refused(tmp_path: Path) -> None:
    path = tmp_path / "state" / "admin-token"
    assert token_files.read(path) is None
    token_files.write(path, "vsk_secret")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert token_files.read(path) == "vsk_secret"
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="readable by others"):
        token_files.read(path)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (InvalidArgument("x"), 2),
        (Unauthenticated("x"), 3),
        (PermissionDenied("x"), 3),
        (NotFound("x"), 4),
        (Conflict("x"), 5),
        (FailedPrecondition("x"), 5),
        (Unavailable("x"), 1),
    ],
)
def test_cli_exit_statuses(error: Exception, status: int) -> None:
    assert exit_status(error) == status  # type: ignore[arg-type]


def test_tables_align_columns_and_ages_read_shortly() -> None:
    assert table(["A", "LONGER"], [("xx", 1), ("y", None)]).splitlines() == ["A   LONGER", "xx  1", "y"]
    assert [age(None), age(5), age(600), age(7200), age(3 * 86400)] == ["never", "5s", "10m", "2h", "3d"]
