"""Where the bearer token comes from and how the channel is made, with
memprofctl's names (--addr, --token_file, --tls_ca) and the daemon's rule for
token files (server/auth.cc)."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc

from .errors import FailedPrecondition, InvalidArgument

DEFAULT_ADDR = "127.0.0.1:50051"  # memprofctl's --addr default
TOKEN_ENV = "MEMPROFD_TOKEN"

ChannelOptions = Sequence[Tuple[str, Union[str, int]]]

# The unary RPCs that change nothing, so that a call the daemon may or may
# not have received can be sent again: gRPC retries these (RETRY_POLICY) when
# they fail UNAVAILABLE. Calls that start work (Train, Snapshot, LoadModel,
# Evaluate, PlanMemory) or change state (CancelOperation, DeleteSnapshot,
# ResetPeakMemory, Start/StopMemoryRecording) are never retried: a second
# Train would be a second training. Streams are resumed by the handles instead.
IDEMPOTENT_RPCS = (
    "GetStatus", "DescribeModel", "ListSnapshots", "DescribeSnapshot", "GetOperation",
    "ListOperations", "WaitOperation", "GetMemoryStats", "GetMemoryBreakdown", "DiffMemory",
    "GetLastOomReport",
)
# Up to 5 attempts, 0.1 s then doubling up to 1 s apart, within the call's
# deadline (gRPC's retry policy, grpc.io/docs/guides/retry).
RETRY_POLICY = {
    "maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def service_config(service: str) -> str:
    """The channel's service config (JSON): RETRY_POLICY on IDEMPOTENT_RPCS."""
    return json.dumps({"methodConfig": [{
        "name": [{"service": service, "method": m} for m in IDEMPOTENT_RPCS],
        "retryPolicy": RETRY_POLICY,
    }]})


def default_channel_options(service: str) -> List[Tuple[str, Union[str, int]]]:
    """What every channel the package makes gets, before the caller's options:
    - a subchannel of its own (gRPC shares subchannels between the channels
      of a process by default, so a new client right after a daemon restart
      would wait out the old one's reconnect backoff instead of connecting);
    - a reconnect backoff of 250 ms up to 1 s, so a restarted daemon is found
      within a second, not gRPC's default of up to two minutes;
    - the retry policy (service_config)."""
    return [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config(service)),
    ]


def read_token_file(path: str) -> str:
    """The token: the file's first line, trimmed. Raises FailedPrecondition,
    as memprofd does for its --auth_token_file, when the file cannot be read,
    is not a regular file, holds no token, or other users may read or write
    it (mode & 0o027: only the owner and, read-only, its group may)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise FailedPrecondition("cannot read token file '%s' (%s)" % (path, e.strerror)) from None
    try:
        st = os.fstat(fd)  # the file checked is the file read
        if not stat.S_ISREG(st.st_mode):
            raise FailedPrecondition("cannot read token file '%s': it must be a regular file" % path)
        if st.st_mode & 0o027:
            raise FailedPrecondition(
                "token file '%s' has mode %04o: other users can read or change the token; run "
                "chmod 600 on it (or 0400)" % (path, st.st_mode & 0o7777))
        with os.fdopen(os.dup(fd), "rb") as f:
            text = f.read(1 << 20).decode("utf-8", errors="replace")
    finally:
        os.close(fd)
    token = text.split("\n", 1)[0].strip()
    if not token:
        raise FailedPrecondition("token file '%s' holds no token on its first line" % path)
    return token


def resolve_token(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    """The first of: `token` ("" means none, and stops the search), the first
    line of `token_file`, $MEMPROFD_TOKEN. None when there is none."""
    if token is not None:
        return token or None
    if token_file:
        return read_token_file(token_file)
    return os.environ.get(TOKEN_ENV) or None


def is_loopback(addr: str) -> bool:
    """True for an address on this host: 127.0.0.0/8, ::1, localhost, or a
    unix socket (gRPC target forms: host:port, [v6]:port, dns:///, ipv4:, unix:)."""
    if addr.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if addr.startswith(scheme):
            addr = addr[len(scheme):]
            break
    if addr.startswith("["):
        host = addr[1:addr.find("]")] if "]" in addr else addr[1:]
    elif addr.count(":") == 1:
        host = addr.rsplit(":", 1)[0]
    else:
        host = addr  # a bare IPv6 address or a host without a port
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def channel_credentials(addr: str, tls_ca: Optional[str],
                        insecure: Optional[bool]) -> Optional[grpc.ChannelCredentials]:
    """None for plaintext. TLS when `tls_ca` (a PEM file of root certificates)
    is given; plaintext when `insecure` is true; with neither, plaintext on
    loopback and TLS with the system's roots elsewhere (a bearer token never
    crosses a network in the clear unless asked to). InvalidArgument for
    tls_ca with insecure=True; FailedPrecondition when tls_ca cannot be read."""
    if tls_ca:
        if insecure:
            raise InvalidArgument("tls_ca and insecure=True contradict each other: pass one")
        try:
            with open(tls_ca, "rb") as f:
                roots = f.read()
        except OSError as e:
            raise FailedPrecondition(
                "cannot read tls_ca '%s' (%s)" % (tls_ca, e.strerror)) from None
        return grpc.ssl_channel_credentials(root_certificates=roots)
    if insecure or (insecure is None and is_loopback(addr)):
        return None
    return grpc.ssl_channel_credentials()


def channel_options(service: str, tls_server_name: Optional[str],
                    options: ChannelOptions) -> List[Tuple[str, Any]]:
    """default_channel_options, the TLS name override, then `options` (which
    win)."""
    out = dict(default_channel_options(service))
    if tls_server_name:
        out["grpc.ssl_target_name_override"] = tls_server_name
    out.update(dict(options))
    return list(out.items())


# What gRPC's connection errors say when a TLS client meets a plaintext
# server (BoringSSL's WRONG_VERSION_NUMBER, the TSI handshake failure).
_TLS_FAILURE_WORDS = ("ssl", "handshake", "tsi_", "wrong_version_number", "tls")


def tls_hint(details: str, tls: bool) -> str:
    """`details` of a connection failure, with what to do when it is a TLS
    handshake failure of a TLS channel (most often: the daemon serves
    plaintext, so insecure=True, or TLS with another CA, so tls_ca=)."""
    if not tls or not any(w in details.lower() for w in _TLS_FAILURE_WORDS):
        return details
    return ("%s (the TLS handshake failed: if the daemon serves plaintext, pass "
            "insecure=True; if it serves TLS, pass its CA as tls_ca=)" % details)
