"""Where the bearer token comes from and how the channel is made, with
memprofctl's names (--addr, --token_file, --tls_ca) and the daemon's rule for
token files (server/auth.cc)."""

from __future__ import annotations

import ipaddress
import os
import stat
from typing import Optional, Sequence, Tuple

import grpc

from .errors import FailedPrecondition

DEFAULT_ADDR = "127.0.0.1:50051"  # memprofctl's --addr default
TOKEN_ENV = "MEMPROFD_TOKEN"

# A restarted daemon is found within a few seconds, not gRPC's default of up
# to two minutes of reconnect backoff.
DEFAULT_CHANNEL_OPTIONS: Tuple[Tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 3000),
)


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
    crosses a network in the clear unless asked to)."""
    if tls_ca:
        if insecure:
            raise ValueError("tls_ca and insecure=True contradict each other")
        with open(tls_ca, "rb") as f:
            return grpc.ssl_channel_credentials(root_certificates=f.read())
    if insecure or (insecure is None and is_loopback(addr)):
        return None
    return grpc.ssl_channel_credentials()


def channel_options(tls_server_name: Optional[str],
                    options: Sequence[Tuple[str, object]]) -> list:
    out = dict(DEFAULT_CHANNEL_OPTIONS)
    if tls_server_name:
        out["grpc.ssl_target_name_override"] = tls_server_name
    out.update(dict(options))
    return list(out.items())
