"""One exception class per gRPC status code, carrying the daemon's message.

Every call of Client and AsyncClient raises a subclass of MemprofdError
instead of grpc.RpcError; an operation that failed raises the class of its
OperationError's code from wait() (with `.operation` set). Catch the family
you can act on: NotFound for an unknown id or snapshot, InvalidArgument for a
request to fix, FailedPrecondition for a daemon in the wrong state (no model,
an operation already done), Unavailable for a daemon that is down or
draining, Unauthenticated for a missing or wrong token.
"""

from __future__ import annotations

from typing import Optional

import grpc

__all__ = [
    "MemprofdError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
    "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
    "error_for",
]


class MemprofdError(Exception):
    """A call or an operation that did not succeed. `code` is the
    grpc.StatusCode, `message` the daemon's status message (what was wrong and
    what to do), `operation` the failed Operation message when an operation
    failed (None for a call that failed)."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, code: Optional[grpc.StatusCode] = None,
                 operation=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.operation = operation

    def __str__(self) -> str:
        return "%s: %s" % (self.code.name, self.message)


class Cancelled(MemprofdError):
    code = grpc.StatusCode.CANCELLED


class Unknown(MemprofdError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(MemprofdError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(MemprofdError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(MemprofdError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(MemprofdError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(MemprofdError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(MemprofdError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(MemprofdError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(MemprofdError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(MemprofdError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(MemprofdError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(MemprofdError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(MemprofdError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(MemprofdError):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(MemprofdError):
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
    Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)}
_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def error_for(code, message: str, operation=None) -> MemprofdError:
    """The exception for a status `code` (a grpc.StatusCode or its number, as
    OperationError.code carries it)."""
    if not isinstance(code, grpc.StatusCode):
        code = _BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    cls = _BY_CODE.get(code, MemprofdError)
    return cls(message, code=code, operation=operation)


def from_rpc_error(e: grpc.RpcError) -> MemprofdError:
    """The exception for a failed call (grpc.RpcError or grpc.aio.AioRpcError)."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else None
    return error_for(code, details or str(e))
