"""The generated modules (memprofd_client._proto, made by gen_stubs.py at
install or build time), imported in one place so that a tree without them
fails with one clear message."""

from typing import Any

try:
    from ._proto import (GRPCIO_TOOLS_VERSION, PROTO_FILES, PROTO_SHA256,  # noqa: F401
                         PROTOBUF_GENCODE_VERSION)
    from ._proto.memprofd.v1 import (memory_pb2, memprofd_pb2, memprofd_pb2_grpc,  # noqa: F401
                                     model_pb2, operation_pb2, snapshot_pb2, train_pb2)
except ImportError as e:  # pragma: no cover - a source tree without its stubs
    raise ImportError(
        "memprofd_client's generated stubs (memprofd_client._proto) are missing: install the "
        "package with pip (pip install ./clients/python generates them), or build the CMake "
        "target memprofd_python_client and put build/clients-python beside clients/python/src "
        "on PYTHONPATH (%s)" % e) from e

__all__ = ["GRPCIO_TOOLS_VERSION", "PROTO_FILES", "PROTO_SHA256", "PROTOBUF_GENCODE_VERSION",
           "MESSAGE_MODULES", "SERVICE", "SERVICE_NAME", "make_stub", "memprofd_pb2_grpc"]

MESSAGE_MODULES = (memory_pb2, memprofd_pb2, model_pb2, operation_pb2, snapshot_pb2, train_pb2)

# The service, as the .proto files declare it.
SERVICE = memprofd_pb2.DESCRIPTOR.services_by_name["Memprofd"]
SERVICE_NAME: str = SERVICE.full_name  # "memprofd.v1.Memprofd"


def make_stub(channel: Any) -> Any:
    """The generated MemprofdStub on `channel` (a grpc.Channel or
    grpc.aio.Channel); untyped, as grpcio-tools writes it."""
    return memprofd_pb2_grpc.MemprofdStub(channel)  # type: ignore[no-untyped-call]
