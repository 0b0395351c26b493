"""One exception class per gRPC status code, carrying the daemon's message.

Every error the package raises is a MemprofdError: calls of Client and
AsyncClient raise a subclass instead of grpc.RpcError; an operation that
failed raises the class of its OperationError's code from wait() (with
`.operation` set); and the package's own checks (a bad argument, a closed
client, a token file others may read) raise the class of the code the daemon
would have answered. Where a builtin exception applies, the class is also
that builtin (InvalidArgument is a ValueError, NotFound a LookupError...),
so code written against the builtins keeps working. Catch the family you can
act on: NotFound for an unknown id or snapshot, InvalidArgument for a
request to fix, FailedPrecondition for a daemon (or client) in the wrong
state (no model, an operation already done, a closed client), Unavailable
for a daemon that is down or draining, Unauthenticated for a missing or
wrong token.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Type, Union

import grpc

from . import pb

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
                 operation: Optional[pb.Operation] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.operation = operation

    def __str__(self) -> str:
        return "%s: %s" % (self.code.name, self.message)


class Cancelled(MemprofdError):
    """The call or operation was cancelled."""

    code = grpc.StatusCode.CANCELLED


class Unknown(MemprofdError):
    """An error the daemon did not classify."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(MemprofdError, ValueError):
    """A request (or argument) to fix: the message names the field. Also a ValueError."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(MemprofdError, TimeoutError):
    """The call's deadline (or a handle's wait) passed. Also a TimeoutError."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(MemprofdError, LookupError):
    """An unknown operation id or snapshot name. Also a LookupError."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(MemprofdError):
    """A snapshot of that name exists."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(MemprofdError):
    """A path outside the daemon's roots, or one it may not read."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(MemprofdError):
    """Out of memory (an operation), or a limit reached (a call)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(MemprofdError):
    """The daemon (or this client) is in the wrong state for the call."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(MemprofdError):
    """Work the daemon stopped: a second training, or one stopped by a drain."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(MemprofdError):
    """A value past the end of what exists."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(MemprofdError):
    """A capability this daemon does not have."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(MemprofdError):
    """A failure inside the daemon."""

    code = grpc.StatusCode.INTERNAL


class Unavailable(MemprofdError, ConnectionError):
    """The daemon is down, unreachable or draining. Also a ConnectionError."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(MemprofdError):
    """A corrupt or truncated file."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(MemprofdError):
    """A missing or wrong bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: Dict[grpc.StatusCode, Type[MemprofdError]] = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
    Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)}
_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}
_ALSO: Dict[Tuple[Type[MemprofdError], Type[Exception]], Type[MemprofdError]] = {}


def error_for(code: Union[grpc.StatusCode, int], message: str,
              operation: Optional[pb.Operation] = None) -> MemprofdError:
    """The exception for a status `code` (a grpc.StatusCode or its number, as
    OperationError.code carries it)."""
    if not isinstance(code, grpc.StatusCode):
        code = _BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    cls = _BY_CODE.get(code, MemprofdError)
    return cls(message, code=code, operation=operation)


def also(cls: Type[MemprofdError], builtin: Type[Exception], message: str) -> MemprofdError:
    """An instance of `cls` that is also a `builtin` (TypeError for an
    argument of the wrong type, ValueError for a closed client, OSError for a
    local file), so that both kinds of handler catch it."""
    combined = _ALSO.get((cls, builtin))
    if combined is None:
        if issubclass(cls, builtin):
            combined = cls
        else:
            combined = type(cls.__name__, (cls, builtin), {"__module__": __name__,
                                                         "__doc__": cls.__doc__})
        _ALSO[(cls, builtin)] = combined
    return combined(message)


def from_rpc_error(e: Any) -> MemprofdError:
    """The exception for a failed call (grpc.RpcError or grpc.aio.AioRpcError)."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else None
    return error_for(code, details or str(e))
