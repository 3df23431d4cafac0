"""Drive a real `versus-collector` against a real `versus-cp up`, and submit work over gRPC."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from google.protobuf.timestamp_pb2 import Timestamp
from versus.router.v1 import task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from collector import main as collector_main
from common.grpc.client import sync_channel
from tests.e2e.harness import ControlPlane, run_cli

OP_CLASSES = {
    "read": task_pb2.OP_CLASS_READ,
    "mutate_reconcilable": task_pb2.OP_CLASS_MUTATE_RECONCILABLE,
    "mutate_terminal": task_pb2.OP_CLASS_MUTATE_TERMINAL,
}


# The collector of this tree, run as a module by this interpreter.
THIS_COLLECTOR = (sys.executable, "-m", "collector")


def cli_json(args: list[str], env: dict[str, str]) -> Any:
    done = run_cli([*args, "--json"], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@dataclass
class Collector:
    cp: ControlPlane
    state: Path
    log_path: Path
    site_id: str = ""
    # Devices in a directory several collectors share (VERSUS_STUB_DEVICE_DIR), as at a real site.
    devices: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    # Extra environment for every collector process (enroll and run), e.g. HTTPS_PROXY.
    env: dict[str, str] = field(default_factory=dict)
    # The collector command: this tree's, or a `versus-collector` installed elsewhere.
    command: tuple[str, ...] = THIS_COLLECTOR
    _log: IO[bytes] | None = field(default=None, repr=False)

    def enroll(self, site_id: str = "", issued: dict[str, Any] | None = None) -> str:
        """Enroll into ``site_id``, or into a new site of its own (a name no other test's site has:
        control planes may be shared); with ``issued`` (the output of `tokens issue --json` into
        ``site_id``, perhaps from a while ago), by its enroll command."""
        name = f"site-{self.state.name}-{secrets.token_hex(3)}"
        self.site_id = site_id or self.cp.api.create_site(name)["site"]["site_id"]
        issued = issued or self.cp.api.issue_token(self.site_id)
        argv = [*shlex.split(issued["enroll_command"])[1:], "--state-dir", str(self.state)]
        if self.command == THIS_COLLECTOR and not self.env:
            self._enroll_here(argv, issued["plaintext"])
        else:
            done = subprocess.run(
                [*self.command, *argv],
                input=issued["plaintext"] + "\n",
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
        return str(json.loads((self.state / "identity.json").read_text())["collector_id"])

    def use_gateway(self, url: str) -> None:
        """Reach the gateway at ``url`` from now on (a proxy in front of it, say): the enrolled
        identity's ``gateway_url``, as the collector reads it at start."""
        path = self.state / "identity.json"
        identity = json.loads(path.read_text())
        identity["gateway_url"] = url
        path.write_text(json.dumps(identity))

    def _enroll_here(self, argv: list[str], plaintext: str) -> None:
        """`versus-collector enroll ...` run in this process (its ``main``, the token from a file):
        the same code and the same state directory, without a process importing the collector
        (about 0.5 CPU-s). Used when nothing of the process matters: this tree's collector and no
        environment of its own (a proxy, say). tests/e2e/test_enrollment_flow.py runs the command."""
        token_file = self.state.parent / f"{self.state.name}.token"
        token_file.write_text(plaintext + "\n")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = collector_main.main([*argv, "--token-file", str(token_file)])
        token_file.unlink()
        assert status == 0, err.getvalue()

    def start(self, *extra: str) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*self.command, "run", "--state-dir", str(self.state), "--claim-wait", "2",
             "--grace", "10", "--max-backoff", "1", *extra],
            env=self._env(), stdout=self._log, stderr=self._log,
        )  # fmt: skip

    def _env(self) -> dict[str, str]:
        env = {**self.cp.env, **self.env}
        if self.devices is not None:
            env["VERSUS_STUB_DEVICE_DIR"] = str(self.devices)
        return env

    @property
    def device_dir(self) -> Path:
        return self.devices or self.state / "stub-devices"

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def writes(self, target: str) -> list[dict[str, Any]]:
        """The stub device's own evidence of every write: key, lease epoch, dispatch, time."""
        path = self.device_dir / f"{target}.writes"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def runtime(self) -> dict[str, Any]:
        path = self.state / "runtime.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self._close()
        return code

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def device(self, target: str) -> list[str]:
        path = self.device_dir / target
        return path.read_text().splitlines() if path.exists() else []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Platform:
    """A platform module: submits tasks and watches them over the router's gRPC API."""

    def __init__(self, cp: ControlPlane):
        self.channel = sync_channel(f"127.0.0.1:{cp.port('router')}", cp.mint_token("platform"))
        self.stub = task_router_pb2_grpc.TaskRouterServiceStub(self.channel)

    def submit(self, site_id: str, operation: str, op_class: str, target: str, params: dict[str, Any],
               key: str, provider: str = "stub", deadline_s: float = 300,
               features: Sequence[str] = (), metadata: Sequence[tuple[str, str]] = ()) -> str:  # fmt: skip
        deadline = Timestamp()
        deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=deadline_s))
        reply = self.stub.SubmitTask(pb.SubmitTaskRequest(
            provider=provider, operation=operation, op_class=OP_CLASSES[op_class], target_ref=target,
            site_id=site_id, tenant_id="acme", params=json.dumps(params).encode(), idempotency_key=key,
            deadline=deadline, features=list(features),
        ), timeout=10, metadata=tuple(metadata) or None)  # fmt: skip
        return str(reply.task.task_id)

    def cancel(self, task_id: str, reason: str = "") -> Any:
        return self.stub.CancelTask(pb.CancelTaskRequest(task_id=task_id, reason=reason), timeout=10).task

    def task(self, task_id: str) -> pb.GetTaskResponse:
        return self.stub.GetTask(pb.GetTaskRequest(task_id=task_id), timeout=10)

    def wait_state(self, task_id: str, states: set[str], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            task = self.task(task_id).task
            name = task_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_").lower()
            if name in states:
                return task
            time.sleep(0.1)
        raise AssertionError(f"task {task_id} is {name}, not {states}")

    def close(self) -> None:
        self.channel.close()


class Tasks:
    """Echo tasks, one at a time, to the collector named: returns the error code ("" on success)."""

    def __init__(self, cp: ControlPlane, prefix: str):
        self.platform = Platform(cp)
        self.prefix = prefix
        self.n = 0

    def __call__(self, c: Collector) -> str:
        self.n += 1
        task_id = self.platform.submit(
            c.site_id, "echo", "read", "dev-1", {"n": self.n}, f"{self.prefix}-{self.n}"
        )
        done = {"success", "failed", "expired", "indeterminate"}
        return str(self.platform.wait_state(task_id, done, 90).error_code)


def wait_for(predicate: Callable[[], bool], timeout: float = 30) -> None:
    """Poll ``predicate`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")
