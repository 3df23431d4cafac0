"""The operator CLI says how a service could not be reached: refused (not running there) is not the
same trouble as no answer in time (running, but slow or wedged). Real gRPC calls on loopback."""

from __future__ import annotations

import socket
import threading
from concurrent import futures

import grpc
import pytest
from versus.access.v1 import access_pb2, access_pb2_grpc

from common.config.settings import Settings
from common.embedded.process import free_port
from common.errors import Unavailable
from versus_cp import rpc


def _settings(tmp_path: object) -> Settings:
    return Settings(state_dir=tmp_path, api_token="vsk_test")


def test_a_refused_connection_says_so(tmp_path: object) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens
    with pytest.raises(Unavailable) as refused:
        rpc.call(_settings(tmp_path), address, access_pb2_grpc.AccessServiceStub, "WhoAmI",
                 access_pb2.WhoAmIRequest(), timeout_s=5)  # fmt: skip
    message = str(refused.value)
    assert message.startswith(f"cannot reach the service at {address} (")
    assert "no answer within" not in message and "refused" in message.lower()


def test_a_listener_that_is_not_the_service_says_what_grpc_saw(tmp_path: object) -> None:
    with socket.socket() as listener:  # accepts connections, never speaks HTTP/2
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(Unavailable) as odd:
            rpc.call(_settings(tmp_path), address, access_pb2_grpc.AccessServiceStub, "WhoAmI",
                     access_pb2.WhoAmIRequest(), timeout_s=5)  # fmt: skip
    assert "SETTINGS frame" in str(odd.value)


def test_a_service_that_does_not_answer_in_time_says_so(tmp_path: object) -> None:
    release = threading.Event()

    def who_am_i(request: object, context: object) -> access_pb2.WhoAmIResponse:
        release.wait(5)  # a wedged service
        return access_pb2.WhoAmIResponse()

    handler = grpc.method_handlers_generic_handler(
        "versus.access.v1.AccessService",
        {"WhoAmI": grpc.unary_unary_rpc_method_handler(
            who_am_i, request_deserializer=access_pb2.WhoAmIRequest.FromString,
            response_serializer=access_pb2.WhoAmIResponse.SerializeToString,
        )},
    )  # fmt: skip
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        address = f"127.0.0.1:{port}"
        with pytest.raises(Unavailable) as slow:
            rpc.call(_settings(tmp_path), address, access_pb2_grpc.AccessServiceStub, "WhoAmI",
                     access_pb2.WhoAmIRequest(), timeout_s=0.5)  # fmt: skip
        assert f"cannot reach the service at {address} (no answer within 0.5 s)" in str(slow.value)
    finally:
        release.set()
        server.stop(None)
