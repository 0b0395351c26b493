"""The blocking client and its operation handles."""

from __future__ import annotations

import os
import time
from typing import Iterator, Optional, Sequence, Tuple

import grpc

from . import pb
from ._connect import DEFAULT_ADDR, channel_credentials, channel_options, resolve_token
from ._follow import (DEFAULT_RECONNECT_TIMEOUT, RETRY_INTERVAL, Deadline, ReportCursor,
                      same_operation, successor)
from ._methods import DEFAULT, Timeout, _Api
from ._stubs import memprofd_pb2_grpc
from .errors import DeadlineExceeded, NotFound, Unavailable, error_for, from_rpc_error


class Client(_Api):
    """A blocking client of one memprofd daemon: every RPC as a method (see
    _methods.RPC_METHODS) plus helpers. Thread-safe (the gRPC channel is);
    each operation handle belongs to one thread.

    addr: the daemon's gRPC address, host:port (memprofctl's --addr).
    token / token_file: the bearer token; without either, $MEMPROFD_TOKEN;
        token="" sends none. A token file others may read is refused
        (FailedPrecondition), as the daemon refuses its own.
    tls_ca: PEM root certificates: use TLS (memprofctl's --tls_ca).
        tls_server_name overrides the name checked in the certificate.
    insecure: True for plaintext anywhere; None (default): plaintext on
        loopback, TLS with the system's roots elsewhere.
    timeout: the default deadline of unary calls, seconds (memprofctl's
        --timeout_ms=10000); stream_timeout: of streams (None: no deadline).
    reconnect_timeout: how long handles wait for a daemon that went away.
    options: extra gRPC channel options; channel: use this channel instead.
    """

    def __init__(self, addr: str = DEFAULT_ADDR, *, token: Optional[str] = None,
                 token_file: Optional[str] = None, tls_ca: Optional[str] = None,
                 tls_server_name: Optional[str] = None, insecure: Optional[bool] = None,
                 timeout: Optional[float] = 10.0, stream_timeout: Optional[float] = None,
                 reconnect_timeout: Optional[float] = DEFAULT_RECONNECT_TIMEOUT,
                 options: Sequence[Tuple[str, object]] = (),
                 channel: Optional[grpc.Channel] = None):
        self.addr = addr
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.reconnect_timeout = reconnect_timeout
        token = resolve_token(token, token_file)
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        if channel is None:
            creds = channel_credentials(addr, tls_ca, insecure)
            opts = channel_options(tls_server_name, options)
            channel = (grpc.secure_channel(addr, creds, opts) if creds is not None
                       else grpc.insecure_channel(addr, opts))
        self.channel = channel
        # The generated stub: plain protos, no token, grpc.RpcError.
        self.stub = memprofd_pb2_grpc.MemprofdStub(channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- _Api's hooks ------------------------------------------------------
    def _unary(self, rpc, request, timeout, wait_for_ready=False):
        try:
            return getattr(self.stub, rpc)(request, timeout=self._deadline(timeout),
                                           metadata=self._metadata,
                                           wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _stream(self, rpc, request, timeout):
        call = getattr(self.stub, rpc)(request, timeout=self._deadline(timeout, stream=True),
                                       metadata=self._metadata)
        return _iterate(call)

    def _start(self, rpc, request, timeout):
        return _handle(self, self._unary(rpc, request, timeout))

    def _then(self, value, fn):
        return fn(value)

    # -- helpers -----------------------------------------------------------
    def operation(self, id: str, *, timeout: Timeout = DEFAULT) -> "OperationHandle":
        """A handle on an operation that exists already (by its id)."""
        return _handle(self, self.get_operation(id, timeout=timeout))

    def oom_report(self, *, timeout: Timeout = DEFAULT) -> Optional[pb.OomReport]:
        """The newest OOM report, None when no step ran out of memory."""
        try:
            return self.get_last_oom_report(timeout=timeout)
        except NotFound:
            return None

    def dump_memory_history(self, path: Optional[str] = None, *, timeout: Timeout = DEFAULT):
        """Without `path`: the stream of DumpChunks. With it: writes their data
        to `path` (a PyTorch memory-snapshot pickle for memory_viz; through
        path + ".part", renamed when complete) and returns the bytes written.
        FailedPrecondition when nothing was recorded."""
        stream = self._stream("DumpMemoryHistory", pb.DumpMemoryHistoryRequest(), timeout)
        if path is None:
            return stream
        part = path + ".part"
        written = 0
        try:
            with open(part, "wb") as f:
                for chunk in stream:
                    f.write(chunk.data)
                    written += len(chunk.data)
            os.replace(part, path)
        finally:
            if os.path.exists(part):
                os.remove(part)
        return written


def _iterate(call) -> Iterator:
    try:
        for message in call:
            yield message
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None
    finally:
        call.cancel()  # a stream left early; no-op when it ended


def _handle(client, operation):
    if operation.kind == pb.OPERATION_KIND_TRAIN:
        return TrainOperation(client, operation)
    return OperationHandle(client, operation)


class OperationHandle:
    """A long-running operation (LOAD_MODEL, TRAIN, SNAPSHOT, EVALUATE, PLAN).
    `operation` is the latest Operation message seen. Not thread-safe.

    Waiting survives a daemon that goes away for up to the client's
    reconnect_timeout; when it comes back without the operation (a restart),
    the operation is lost: NotFound (a training handle follows the resumed
    run instead, see TrainOperation)."""

    def __init__(self, client: Client, operation: pb.Operation):
        self.client = client
        self.operation = operation

    def __repr__(self) -> str:
        return "<%s %s %s>" % (type(self).__name__, self.id,
                               pb.OperationState.Name(self.operation.state))

    @property
    def id(self) -> str:
        return self.operation.id

    @property
    def done(self) -> bool:
        return self.operation.done

    @property
    def state(self) -> int:
        return self.operation.state

    def result(self):
        """The typed result (TrainResult, SnapshotManifest, ModelInfo,
        EvaluateResult, MemoryPlan) once done, else None."""
        field = self.operation.WhichOneof("result")
        return getattr(self.operation, field) if field else None

    def refresh(self) -> pb.Operation:
        """Fetches the operation anew and returns it."""
        try:
            self._update(self.client.get_operation(self.id))
        except NotFound:
            self._restarted(Deadline(self.client.reconnect_timeout))
        return self.operation

    def cancel(self) -> pb.Operation:
        """Asks the daemon to stop it (training stops at the next step
        boundary); returns the operation as it stands. FailedPrecondition
        when it is done already."""
        self._update(self.client.cancel_operation(self.id))
        return self.operation

    def wait(self, timeout: Optional[float] = None, *, check: bool = True) -> pb.Operation:
        """Blocks until the operation is done (at most `timeout` seconds:
        DeadlineExceeded) and returns it. With `check`, a FAILED operation
        raises the exception of its error's code (ResourceExhausted for out
        of memory...) with `.operation` set; CANCELLED returns normally."""
        deadline = Deadline(timeout)
        while not self.operation.done:
            if deadline.passed():
                raise DeadlineExceeded("operation %s not done after %ss" % (self.id, timeout))
            ms = max(1, int(deadline.left(60.0) * 1000))
            try:
                self._update(self.client.wait_operation(self.id, timeout_ms=ms))
            except Unavailable:
                self._reconnect()
            except NotFound:
                self._restarted(Deadline(self.client.reconnect_timeout))
        if check and self.operation.state == pb.OPERATION_STATE_FAILED:
            raise error_for(self.operation.error.code, self.operation.error.message,
                            self.operation)
        return self.operation

    def watch(self) -> Iterator[pb.Operation]:
        """The operation on every change of state or progress, until done."""
        for op in self.client.watch_operation(self.id):
            self._update(op)
            yield op

    # -- following the operation -------------------------------------------
    def _update(self, op: pb.Operation) -> None:
        if same_operation(self.operation, op):
            self.operation = op
        else:  # the id names another operation now: the daemon restarted
            self._restarted(Deadline(self.client.reconnect_timeout))

    def _reconnect(self) -> None:
        """After UNAVAILABLE: waits for the daemon and re-reads the operation."""
        deadline = Deadline(self.client.reconnect_timeout)
        while True:
            try:
                op = self.client._unary("GetOperation", pb.GetOperationRequest(id=self.id),
                                        deadline.left(5.0), wait_for_ready=True)
                self._update(op)
                return
            except NotFound:
                self._restarted(deadline)
                return
            except (Unavailable, DeadlineExceeded):
                if deadline.passed():
                    raise Unavailable("memprofd at %s did not come back within %ss"
                                      % (self.client.addr, self.client.reconnect_timeout)) from None
                time.sleep(RETRY_INTERVAL)

    def _restarted(self, deadline: Deadline) -> None:
        raise NotFound("operation %s was lost: the daemon at %s restarted"
                       % (self.id, self.client.addr), operation=self.operation)


class TrainOperation(OperationHandle):
    """A TRAIN operation. Besides an OperationHandle's calls, reports()
    iterates over its step reports. Across a daemon restart it follows the
    run into the first TRAIN operation created after its own (the
    Train(resume=True) that continues it from its last checkpoint) within the
    client's reconnect_timeout; `followed` lists the ids it went through."""

    def __init__(self, client: Client, operation: pb.Operation):
        super().__init__(client, operation)
        self.followed = [operation.id]
        self.lost_global_steps: list = []

    def reports(self, from_step: int = 1) -> Iterator[pb.StepReport]:
        """The StepReports from `from_step` (1-based within this operation),
        live until the run is done. Reconnects after UNAVAILABLE and follows
        a resumed run after a restart, never repeating a report (global_step
        only grows); see memprofd_client._follow."""
        cursor = ReportCursor(from_step)
        self.lost_global_steps = cursor.lost_global_steps
        while True:
            opened = self.operation
            try:
                for report in self.client.stream_step_reports(self.id,
                                                              from_step=cursor.next_step):
                    if cursor.accept(report):
                        yield report
                self.refresh()
                if self.operation.done and same_operation(opened, self.operation):
                    return
                time.sleep(RETRY_INTERVAL)  # ended early (a draining daemon): read on
            except Unavailable:
                self._reconnect()
            except NotFound:
                self._restarted(Deadline(self.client.reconnect_timeout))
            if not same_operation(opened, self.operation):
                cursor.switched()

    def _restarted(self, deadline: Deadline) -> None:
        lost = self.operation
        while True:
            try:
                found = successor(lost, self.client.operations(kind=pb.OPERATION_KIND_TRAIN))
            except (Unavailable, DeadlineExceeded):
                found = None
            if found is not None:
                self.operation = found
                self.followed.append(found.id)
                return
            if deadline.passed():
                raise NotFound("training %s was lost when the daemon at %s restarted, and no "
                               "training resumed it (Train with resume) within %ss"
                               % (lost.id, self.client.addr, self.client.reconnect_timeout),
                               operation=lost)
            time.sleep(RETRY_INTERVAL)
