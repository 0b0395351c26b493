"""What Client and AsyncClient share, apart from their I/O: the table of RPC
methods, the DEFAULT timeout marker, how a request is built from keyword
arguments, and how a failed call becomes a MemprofdError.

Each RPC of memprofd.v1.Memprofd is a method of both clients named as the
RPC in snake_case (RPC_METHODS), taking the request's fields as keyword
arguments of the same names; an argument left None is not set, so the
daemon's default holds (proto3 `optional` fields) or the field keeps its
zero value. Every method takes `timeout`: seconds until the call's deadline,
None for no deadline, unset (DEFAULT) for the client's default (`timeout`
for unary calls, `stream_timeout` for streams).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Type, TypeVar, Union, cast

import grpc
from google.protobuf.message import Message

from ._connect import tls_hint
from ._stubs import SERVICE
from .errors import (Cancelled, DeadlineExceeded, InvalidArgument, MemprofdError, Unavailable,
                     also, from_rpc_error)


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()
"""The `timeout` argument's default: the client's own timeout."""

Timeout = Union[float, None, _Default]
# An enum field's value: its number, its full name ("SNAPSHOT_KIND_CHECKPOINT")
# or the name without the enum's prefix ("CHECKPOINT").
Enum = Union[int, str, None]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


RPC_METHODS: Dict[str, str] = {m.name: _snake(m.name) for m in SERVICE.methods}
"""RPC name -> method name on both clients ("GetStatus" -> "get_status")."""

# What a call that waited for a daemon until its deadline asks, without
# waiting, to learn whether the daemon can be reached at all (and why not):
# a method the daemon does not have (UNIMPLEMENTED when it answers) and the
# retry policy does not retry.
PROBE_METHOD = "/%s/ConnectionProbe" % SERVICE.full_name

M = TypeVar("M", bound=Message)
_REPEATED = 3  # FieldDescriptor.LABEL_REPEATED


def enum_value(field: Any, value: Union[int, str]) -> int:
    """`value` of enum field `field` (a FieldDescriptor) as its number.
    InvalidArgument listing the valid names for an unknown name."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise also(InvalidArgument, TypeError, "%s must be a %s name or number, not %r" % (
            field.name, field.enum_type.name, value))
    if isinstance(value, int):
        return value
    values = field.enum_type.values_by_name
    prefix = _snake(field.enum_type.name).upper() + "_"
    if value in values:
        return int(values[value].number)
    if prefix + value in values:
        return int(values[prefix + value].number)
    names = [v.name for v in field.enum_type.values if not v.name.endswith("_UNSPECIFIED")]
    raise InvalidArgument("unknown %s %r for %s; valid names: %s (or without the %s prefix)" % (
        field.enum_type.name, value, field.name, ", ".join(names), prefix))


def request(cls: Type[M], **fields: Any) -> M:
    """A `cls` message with the fields that are not None. Enum fields take
    numbers or names (enum_value). A value of the wrong type is
    InvalidArgument (also a TypeError), naming the field."""
    by_name = cls.DESCRIPTOR.fields_by_name
    values: Dict[str, Any] = {}
    for name, value in fields.items():
        if value is None:
            continue
        field = by_name[name]
        if field.enum_type is not None and cast(Any, field).label != _REPEATED:
            value = enum_value(field, value)
        values[name] = value
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        builtin = TypeError if isinstance(e, TypeError) else ValueError
        raise also(InvalidArgument, builtin, "%s: %s" % (cls.DESCRIPTOR.name, e)) from None


class ClientState:
    """What both clients keep besides their channel: the address, the
    defaults of their calls, the token's metadata, whether the channel uses
    TLS, and whether it ever connected (for the errors of a daemon that
    never answered)."""

    addr: str
    timeout: Optional[float]
    stream_timeout: Optional[float]
    reconnect_timeout: Optional[float]
    wait_for_ready: bool
    _metadata: tuple[tuple[str, str], ...]
    _tls: bool
    _closed: bool

    def _deadline(self, timeout: Timeout, stream: bool = False) -> Optional[float]:
        if isinstance(timeout, _Default):
            return self.stream_timeout if stream else self.timeout
        return timeout

    def _closed_error(self) -> MemprofdError:
        from .errors import FailedPrecondition
        return also(FailedPrecondition, ValueError,
                    "this memprofd client (%s) is closed; make a new one" % self.addr)

    def _call_error(self, e: Any) -> MemprofdError:
        """The exception for a failed call `e` (grpc.RpcError). A call the
        daemon cancelled (gRPC cancels the calls in flight when a server
        shuts down; the package never cancels a call it waits on) is
        Unavailable: the daemon is going away, retry once it is back. A TLS
        handshake failure says what to pass."""
        err = from_rpc_error(e)
        if isinstance(err, Cancelled):
            err = Unavailable("memprofd at %s cancelled the call (%s): it is shutting down"
                              % (self.addr, err.message))
        if isinstance(err, Unavailable):
            err.message = tls_hint(err.message, self._tls)
            err.args = (err.message,)
        return err

    def _unreached(self, err: MemprofdError, probe: Optional[MemprofdError]) -> MemprofdError:
        """A call whose deadline passed (waiting for the channel, or retried
        until then): when a quick call that neither waits nor is retried
        (`probe`) finds the daemon unreachable, Unavailable saying so (down,
        a wrong address, or TLS against plaintext), else `err` (a daemon
        that is there but slow)."""
        if not isinstance(err, DeadlineExceeded) or not isinstance(probe, Unavailable):
            return err
        return Unavailable("memprofd at %s could not be reached within the call's deadline: %s"
                           % (self.addr, probe.message))

    @staticmethod
    def _probe_timeout(deadline: Optional[float]) -> float:
        return min(1.0, deadline) if deadline else 1.0


def is_rpc_error(e: BaseException) -> bool:
    """True for grpc.RpcError (and grpc.aio.AioRpcError, one of its kind)."""
    return isinstance(e, grpc.RpcError)
