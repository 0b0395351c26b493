"""The asyncio client and its operation handles: Client's calls, each an
awaitable (streams: async iterators)."""

from __future__ import annotations

import asyncio
import os
from typing import AsyncIterator, Optional, Sequence, Tuple

import grpc
import grpc.aio

from . import pb
from ._connect import DEFAULT_ADDR, channel_credentials, channel_options, resolve_token
from ._follow import (DEFAULT_RECONNECT_TIMEOUT, RETRY_INTERVAL, Deadline, ReportCursor,
                      same_operation, successor)
from ._methods import DEFAULT, Timeout, _Api
from ._stubs import memprofd_pb2_grpc
from .errors import DeadlineExceeded, NotFound, Unavailable, error_for, from_rpc_error


class AsyncClient(_Api):
    """Client for asyncio: the same methods, arguments and exceptions, each
    returning an awaitable of the same message (`await c.get_status()`);
    streams are async iterators (`async for r in c.watch_operation(id)`).
    Make it inside the event loop that uses it; `async with` closes it.
    Safe to use from the tasks of its one event loop."""

    def __init__(self, addr: str = DEFAULT_ADDR, *, token: Optional[str] = None,
                 token_file: Optional[str] = None, tls_ca: Optional[str] = None,
                 tls_server_name: Optional[str] = None, insecure: Optional[bool] = None,
                 timeout: Optional[float] = 10.0, stream_timeout: Optional[float] = None,
                 reconnect_timeout: Optional[float] = DEFAULT_RECONNECT_TIMEOUT,
                 options: Sequence[Tuple[str, object]] = (),
                 channel: Optional[grpc.aio.Channel] = None):
        self.addr = addr
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.reconnect_timeout = reconnect_timeout
        token = resolve_token(token, token_file)
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        if channel is None:
            creds = channel_credentials(addr, tls_ca, insecure)
            opts = channel_options(tls_server_name, options)
            channel = (grpc.aio.secure_channel(addr, creds, opts) if creds is not None
                       else grpc.aio.insecure_channel(addr, opts))
        self.channel = channel
        self.stub = memprofd_pb2_grpc.MemprofdStub(channel)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- _Api's hooks ------------------------------------------------------
    async def _unary(self, rpc, request, timeout, wait_for_ready=False):
        try:
            return await getattr(self.stub, rpc)(request, timeout=self._deadline(timeout),
                                                 metadata=self._metadata,
                                                 wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _stream(self, rpc, request, timeout):
        call = getattr(self.stub, rpc)(request, timeout=self._deadline(timeout, stream=True),
                                       metadata=self._metadata)
        return _iterate(call)

    async def _start(self, rpc, request, timeout):
        return _handle(self, await self._unary(rpc, request, timeout))

    async def _then(self, value, fn):
        return fn(await value)

    # -- helpers -----------------------------------------------------------
    async def operation(self, id: str, *, timeout: Timeout = DEFAULT) -> "AsyncOperationHandle":
        """A handle on an operation that exists already (by its id)."""
        return _handle(self, await self.get_operation(id, timeout=timeout))

    async def oom_report(self, *, timeout: Timeout = DEFAULT) -> Optional[pb.OomReport]:
        """The newest OOM report, None when no step ran out of memory."""
        try:
            return await self.get_last_oom_report(timeout=timeout)
        except NotFound:
            return None

    def dump_memory_history(self, path: Optional[str] = None, *, timeout: Timeout = DEFAULT):
        """Without `path`: the async stream of DumpChunks. With it: an
        awaitable that writes their data to `path` (through path + ".part")
        and returns the bytes written."""
        stream = self._stream("DumpMemoryHistory", pb.DumpMemoryHistoryRequest(), timeout)
        if path is None:
            return stream
        return _write(stream, path)


async def _write(stream, path: str) -> int:
    part = path + ".part"
    written = 0
    try:
        with open(part, "wb") as f:
            async for chunk in stream:
                f.write(chunk.data)
                written += len(chunk.data)
        os.replace(part, path)
    finally:
        if os.path.exists(part):
            os.remove(part)
    return written


async def _iterate(call) -> AsyncIterator:
    try:
        async for message in call:
            yield message
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None
    finally:
        call.cancel()


def _handle(client, operation):
    if operation.kind == pb.OPERATION_KIND_TRAIN:
        return AsyncTrainOperation(client, operation)
    return AsyncOperationHandle(client, operation)


class AsyncOperationHandle:
    """OperationHandle for asyncio: refresh(), cancel() and wait() are
    coroutines, watch() an async iterator. Used by one task at a time."""

    def __init__(self, client: AsyncClient, operation: pb.Operation):
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
        field = self.operation.WhichOneof("result")
        return getattr(self.operation, field) if field else None

    async def refresh(self) -> pb.Operation:
        try:
            await self._update(await self.client.get_operation(self.id))
        except NotFound:
            await self._restarted(Deadline(self.client.reconnect_timeout))
        return self.operation

    async def cancel(self) -> pb.Operation:
        await self._update(await self.client.cancel_operation(self.id))
        return self.operation

    async def wait(self, timeout: Optional[float] = None, *, check: bool = True) -> pb.Operation:
        deadline = Deadline(timeout)
        while not self.operation.done:
            if deadline.passed():
                raise DeadlineExceeded("operation %s not done after %ss" % (self.id, timeout))
            ms = max(1, int(deadline.left(60.0) * 1000))
            try:
                await self._update(await self.client.wait_operation(self.id, timeout_ms=ms))
            except Unavailable:
                await self._reconnect()
            except NotFound:
                await self._restarted(Deadline(self.client.reconnect_timeout))
        if check and self.operation.state == pb.OPERATION_STATE_FAILED:
            raise error_for(self.operation.error.code, self.operation.error.message,
                            self.operation)
        return self.operation

    async def watch(self) -> AsyncIterator[pb.Operation]:
        async for op in self.client.watch_operation(self.id):
            await self._update(op)
            yield op

    async def _update(self, op: pb.Operation) -> None:
        if same_operation(self.operation, op):
            self.operation = op
        else:
            await self._restarted(Deadline(self.client.reconnect_timeout))

    async def _reconnect(self) -> None:
        deadline = Deadline(self.client.reconnect_timeout)
        while True:
            try:
                op = await self.client._unary("GetOperation", pb.GetOperationRequest(id=self.id),
                                              deadline.left(5.0), wait_for_ready=True)
                await self._update(op)
                return
            except NotFound:
                await self._restarted(deadline)
                return
            except (Unavailable, DeadlineExceeded):
                if deadline.passed():
                    raise Unavailable("memprofd at %s did not come back within %ss"
                                      % (self.client.addr, self.client.reconnect_timeout)) from None
                await asyncio.sleep(RETRY_INTERVAL)

    async def _restarted(self, deadline: Deadline) -> None:
        raise NotFound("operation %s was lost: the daemon at %s restarted"
                       % (self.id, self.client.addr), operation=self.operation)


class AsyncTrainOperation(AsyncOperationHandle):
    """TrainOperation for asyncio: `async for r in handle.reports()`."""

    def __init__(self, client: AsyncClient, operation: pb.Operation):
        super().__init__(client, operation)
        self.followed = [operation.id]
        self.lost_global_steps: list = []

    async def reports(self, from_step: int = 1) -> AsyncIterator[pb.StepReport]:
        cursor = ReportCursor(from_step)
        self.lost_global_steps = cursor.lost_global_steps
        while True:
            opened = self.operation
            try:
                async for report in self.client.stream_step_reports(
                        self.id, from_step=cursor.next_step):
                    if cursor.accept(report):
                        yield report
                await self.refresh()
                if self.operation.done and same_operation(opened, self.operation):
                    return
                await asyncio.sleep(RETRY_INTERVAL)
            except Unavailable:
                await self._reconnect()
            except NotFound:
                await self._restarted(Deadline(self.client.reconnect_timeout))
            if not same_operation(opened, self.operation):
                cursor.switched()

    async def _restarted(self, deadline: Deadline) -> None:
        lost = self.operation
        while True:
            try:
                found = successor(lost, await self.client.operations(
                    kind=pb.OPERATION_KIND_TRAIN))
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
            await asyncio.sleep(RETRY_INTERVAL)
