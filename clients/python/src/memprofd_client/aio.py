"""The asyncio client and its operation handles: Client's calls, each a
coroutine (streams: async iterators)."""

from __future__ import annotations

import asyncio
import os
from typing import (Any, AsyncIterator, Awaitable, Dict, Iterable, List, Optional, Union, cast,
                    overload)

import grpc
import grpc.aio

from . import pb
from ._connect import (DEFAULT_ADDR, ChannelOptions, channel_credentials, channel_options,
                       resolve_token)
from ._follow import (DEFAULT_RECONNECT_TIMEOUT, RETRY_INTERVAL, Deadline, ReportCursor,
                      drained, lost_error, same_operation, successor)
from ._methods import DEFAULT, PROBE_METHOD, ClientState, Enum, Timeout, request
from ._stubs import SERVICE_NAME, make_stub
from .client import Result, _local_file
from .errors import DeadlineExceeded, MemprofdError, NotFound, Unavailable, error_for


class AsyncClient(ClientState):
    """Client for asyncio: the same methods, arguments and exceptions, each a
    coroutine of the same message (`await c.get_status()`); streams are
    async iterators (`async for r in c.watch_operation(id)`). Takes Client's
    arguments. Safe to use from the tasks of an event loop.

    It may be made anywhere, a module's top level included: its gRPC
    channel (grpc.aio binds a channel to one event loop) is made at its
    first call, in the loop that runs it, and made anew when a later call
    runs in another loop (asyncio.run twice). A channel passed in is used
    as it is, in its own loop. `async with` (or close()) closes it.
    """

    def __init__(self, addr: str = DEFAULT_ADDR, *, token: Optional[str] = None,
                 token_file: Optional[str] = None, tls_ca: Optional[str] = None,
                 tls_server_name: Optional[str] = None, insecure: Optional[bool] = None,
                 timeout: Optional[float] = 10.0, stream_timeout: Optional[float] = None,
                 wait_for_ready: bool = True,
                 reconnect_timeout: Optional[float] = DEFAULT_RECONNECT_TIMEOUT,
                 options: ChannelOptions = (),
                 channel: Optional[grpc.aio.Channel] = None) -> None:
        self.addr = addr
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.wait_for_ready = wait_for_ready
        self.reconnect_timeout = reconnect_timeout
        self._closed = False
        token = resolve_token(token, token_file)
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._creds = channel_credentials(addr, tls_ca, insecure) if channel is None else None
        self._tls = self._creds is not None
        self._options = channel_options(SERVICE_NAME, tls_server_name, options)
        self._given = channel is not None
        self._channel: Optional[grpc.aio.Channel] = channel
        self._stub: Any = make_stub(channel) if channel else None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    @property
    def channel(self) -> grpc.aio.Channel:
        """The gRPC channel of the running event loop (made on first use)."""
        self._bind()
        assert self._channel is not None
        return self._channel

    @property
    def stub(self) -> Any:
        """The generated stub on `channel`: plain protos, no token,
        grpc.aio.AioRpcError."""
        self._bind()
        return self._stub

    def _bind(self) -> None:
        if self._closed:
            raise self._closed_error()
        if self._given:
            return
        try:
            loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._channel is not None and (loop is None or loop is self._loop):
            return
        # The channel of a loop that is gone (or none yet): make one here.
        self._loop = loop
        self._channel = (grpc.aio.secure_channel(self.addr, self._creds, self._options)
                         if self._creds is not None
                         else grpc.aio.insecure_channel(self.addr, self._options))
        self._stub = make_stub(self._channel)

    async def close(self) -> None:
        """Closes the channel; calls after it raise FailedPrecondition."""
        self._closed = True
        channel, self._channel = self._channel, None
        if channel is not None and (self._given or self._loop is _running_loop()):
            await channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the calls ---------------------------------------------------------
    async def _unary(self, rpc: str, req: Any, timeout: Timeout,
                     wait_for_ready: Optional[bool] = None) -> Any:
        stub = self.stub
        deadline = self._deadline(timeout)
        ready = self.wait_for_ready if wait_for_ready is None else wait_for_ready
        try:
            return await getattr(stub, rpc)(req, timeout=deadline, metadata=self._metadata,
                                            wait_for_ready=ready)
        except grpc.RpcError as e:
            err = self._call_error(e)
        except grpc.aio.UsageError as e:  # the channel was closed under the call
            raise self._closed_error() from e
        if isinstance(err, DeadlineExceeded):
            err = self._unreached(err, await self._probe(deadline))
        raise err

    async def _probe(self, deadline: Optional[float]) -> Optional[MemprofdError]:
        probe: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(
            PROBE_METHOD)  # see Client._probe
        try:
            await probe(b"", timeout=self._probe_timeout(deadline), wait_for_ready=False)
        except grpc.RpcError as e:
            return self._call_error(e)
        return None

    def _stream(self, rpc: str, req: Any, timeout: Timeout) -> AsyncIterator[Any]:
        return _iterate(self, rpc, req, self._deadline(timeout, stream=True))

    async def _start(self, rpc: str, req: Any, timeout: Timeout) -> "AsyncOperationHandle":
        return _handle(self, await self._unary(rpc, req, timeout))

    # -- status and model --------------------------------------------------
    async def get_status(self, *, timeout: Timeout = DEFAULT) -> pb.ServerStatus:
        """Build info, device, model summary, uptime, serving state (SERVING
        or DRAINING), data-parallel place."""
        return cast(pb.ServerStatus, await self._unary("GetStatus", pb.GetStatusRequest(), timeout))

    async def load_model(self, *, preset: Optional[str] = None, hf_directory: Optional[str] = None,
                   seed: Optional[int] = None,
                   placement: Optional[Iterable[pb.ModulePlacement]] = None,
                   resume: Optional[bool] = None, init_weights: Optional[bool] = None,
                   lora_adapter: Optional[str] = None, base_dtype: Optional[str] = None,
                   timeout: Timeout = DEFAULT) -> "AsyncOperationHandle":
        """Replaces the model (exactly one of preset, hf_directory). Returns an
        operation handle (kind LOAD_MODEL; result: `model`). init_weights: take
        hf_directory's config.json only, with weights initialised from seed.
        lora_adapter: a peft LoRA adapter directory loaded onto the model.
        base_dtype: "bf16" makes and loads the weights in bf16, frozen (the
        model trains LoRA adapters only); "float32"; None: a resumed LoRA
        run's own (resume with lora_adapter), else float32."""
        return await self._start("LoadModel", request(
            pb.LoadModelRequest, preset=preset, hf_directory=hf_directory, seed=seed,
            placement=placement, resume=resume, init_weights=init_weights,
            lora_adapter=lora_adapter, base_dtype=base_dtype), timeout)

    async def describe_model(self, *, timeout: Timeout = DEFAULT) -> pb.ModelInfo:
        """The model with every parameter. FailedPrecondition: no model."""
        return cast(pb.ModelInfo,
                    await self._unary("DescribeModel", pb.DescribeModelRequest(), timeout))

    # -- training ----------------------------------------------------------
    async def train(self, *, steps: Optional[int] = None, batch_size: Optional[int] = None,
              seq_len: Optional[int] = None, learning_rate: Optional[float] = None,
              seed: Optional[int] = None, data: Optional[pb.DataSource] = None,
              gradient_checkpointing: Optional[bool] = None,
              checkpoint_layers: Optional[int] = None,
              offload: Optional[pb.OffloadOptions] = None,
              weight_decay: Optional[float] = None, beta1: Optional[float] = None,
              beta2: Optional[float] = None, adam_eps: Optional[float] = None,
              max_grad_norm: Optional[float] = None,
              grad_accumulation_steps: Optional[int] = None,
              attn_implementation: Optional[str] = None,
              lr_scheduler_type: Optional[str] = None, warmup_steps: Optional[int] = None,
              min_lr_ratio: Optional[float] = None, mixed_precision: Optional[str] = None,
              eval_every_steps: Optional[int] = None,
              eval_data: Optional[pb.DataSource] = None,
              eval_max_batches: Optional[int] = None, resume: Optional[bool] = None,
              loss_chunk_tokens: Optional[int] = None,
              memory_budget_bytes: Optional[int] = None,
              lora_r: Optional[int] = None, lora_alpha: Optional[float] = None,
              lora_use_rslora: Optional[bool] = None, lora_targets: Optional[str] = None,
              lora_dropout: Optional[float] = None, base_dtype: Optional[str] = None,
              timeout: Timeout = DEFAULT) -> "AsyncTrainOperation":
        """Queues a training (TrainRequest's fields; see train.proto) and
        returns its handle: reports(), wait(), cancel(), refresh().
        memory_budget_bytes: run the fastest configuration whose planned peak
        fits (docs/planning.md); the handle's result and first report name it.
        Not retried: a second call would be a second training."""
        return cast(AsyncTrainOperation, await self._start("Train", request(
            pb.TrainRequest, steps=steps, batch_size=batch_size, seq_len=seq_len,
            learning_rate=learning_rate, seed=seed, data=data,
            gradient_checkpointing=gradient_checkpointing,
            checkpoint_layers=checkpoint_layers, offload=offload,
            weight_decay=weight_decay, beta1=beta1, beta2=beta2, adam_eps=adam_eps,
            max_grad_norm=max_grad_norm, grad_accumulation_steps=grad_accumulation_steps,
            attn_implementation=attn_implementation, lr_scheduler_type=lr_scheduler_type,
            warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
            mixed_precision=mixed_precision, eval_every_steps=eval_every_steps,
            eval_data=eval_data, eval_max_batches=eval_max_batches, resume=resume,
            loss_chunk_tokens=loss_chunk_tokens,
            memory_budget_bytes=memory_budget_bytes, lora_r=lora_r, lora_alpha=lora_alpha,
            lora_use_rslora=lora_use_rslora, lora_targets=lora_targets,
            lora_dropout=lora_dropout, base_dtype=base_dtype), timeout))

    def stream_step_reports(self, operation_id: str, *, from_step: Optional[int] = None,
                            timeout: Timeout = DEFAULT) -> AsyncIterator[pb.StepReport]:
        """The raw stream of a TRAIN operation's StepReports from `from_step`;
        a training handle's reports() adds reconnection and resumption."""
        return self._stream("StreamStepReports", request(
            pb.StreamStepReportsRequest, operation_id=operation_id, from_step=from_step),
            timeout)

    async def evaluate(self, *, data: Optional[pb.DataSource] = None,
                 batch_size: Optional[int] = None, seq_len: Optional[int] = None,
                 max_batches: Optional[int] = None, attn_implementation: Optional[str] = None,
                 mixed_precision: Optional[str] = None,
                 loss_chunk_tokens: Optional[int] = None,
                 timeout: Timeout = DEFAULT) -> "AsyncOperationHandle":
        """Mean cross-entropy on held-out tokens. Returns an operation handle
        (kind EVALUATE; result: `evaluate`)."""
        return await self._start("Evaluate", request(
            pb.EvaluateRequest, data=data, batch_size=batch_size, seq_len=seq_len,
            max_batches=max_batches, attn_implementation=attn_implementation,
            mixed_precision=mixed_precision, loss_chunk_tokens=loss_chunk_tokens), timeout)

    async def plan_memory(self, *, preset: Optional[str] = None,
                    hf_config_dir: Optional[str] = None,
                    train: Optional[pb.TrainRequest] = None, target: Optional[str] = None,
                    capacity_bytes: Optional[int] = None,
                    world_size: Optional[int] = None, sharding: Optional[str] = None,
                    timeout: Timeout = DEFAULT) -> "AsyncOperationHandle":
        """Where every byte of one training step would go, before it runs
        (PlanMemoryRequest; see memprofd.proto): the model of `preset`, of
        `hf_config_dir`'s config.json, or (neither) the loaded one; `train` the
        TrainRequest to plan (steps not needed); `target` "cpu" or "cuda";
        `capacity_bytes` for the verdict; `world_size` and `sharding` ("none",
        "optimizer", "gradients") for each rank of a data-parallel run
        (MemoryPlan.ranks). Returns an operation handle (kind PLAN; result:
        `plan`, a MemoryPlan). ResourceExhausted while another plan runs;
        InvalidArgument naming world_size or sharding for a bad value."""
        return await self._start("PlanMemory", request(
            pb.PlanMemoryRequest, preset=preset, hf_config_dir=hf_config_dir, train=train,
            target=target, capacity_bytes=capacity_bytes, world_size=world_size,
            sharding=sharding), timeout)

    # -- snapshots ---------------------------------------------------------
    async def snapshot(self, name: str, *, max_shard_size: Optional[str] = None,
                 dtype: Enum = None, mode: Enum = None, kind: Enum = None,
                 timeout: Timeout = DEFAULT) -> "AsyncOperationHandle":
        """Writes a snapshot under the daemon's --snapshot_root (enums as
        numbers or names: kind="SNAPSHOT_KIND_CHECKPOINT" or "CHECKPOINT").
        Returns an operation handle (kind SNAPSHOT; result: `snapshot`, the
        manifest)."""
        return await self._start("Snapshot", request(
            pb.SnapshotRequest, name=name, max_shard_size=max_shard_size, dtype=dtype,
            mode=mode, kind=kind), timeout)

    async def list_snapshots(self, *, timeout: Timeout = DEFAULT) -> pb.ListSnapshotsResponse:
        """Every published snapshot, oldest first."""
        return cast(pb.ListSnapshotsResponse,
                    await self._unary("ListSnapshots", pb.ListSnapshotsRequest(), timeout))

    async def describe_snapshot(self, name: str, *,
                                timeout: Timeout = DEFAULT) -> pb.SnapshotManifest:
        """A snapshot's manifest. NotFound for an unknown name."""
        return cast(pb.SnapshotManifest, await self._unary(
            "DescribeSnapshot", pb.DescribeSnapshotRequest(name=name), timeout))

    async def delete_snapshot(self, name: str, *,
                        timeout: Timeout = DEFAULT) -> pb.DeleteSnapshotResponse:
        """Deletes a snapshot. FailedPrecondition for one the model maps or a
        LoadModel in flight reads."""
        return cast(pb.DeleteSnapshotResponse, await self._unary(
            "DeleteSnapshot", pb.DeleteSnapshotRequest(name=name), timeout))

    # -- operations --------------------------------------------------------
    async def get_operation(self, id: str, *, timeout: Timeout = DEFAULT) -> pb.Operation:
        """The operation as it stands. NotFound for an unknown id."""
        return cast(pb.Operation, await self._unary("GetOperation", pb.GetOperationRequest(id=id),
                                              timeout))

    async def list_operations(self, *, kind: Enum = None, active_only: Optional[bool] = None,
                        timeout: Timeout = DEFAULT) -> pb.ListOperationsResponse:
        """Operations, newest first (`kind`: only that kind; `active_only`:
        only those not done)."""
        return cast(pb.ListOperationsResponse, await self._unary("ListOperations", request(
            pb.ListOperationsRequest, kind=kind, active_only=active_only), timeout))

    async def cancel_operation(self, id: str, *, timeout: Timeout = DEFAULT) -> pb.Operation:
        """Asks an operation to stop; returns it as it stands.
        FailedPrecondition when it is done already."""
        return cast(pb.Operation, await self._unary(
            "CancelOperation", pb.CancelOperationRequest(id=id), timeout))

    async def wait_operation(self, id: str, *, timeout_ms: Optional[int] = None,
                       timeout: Timeout = DEFAULT) -> pb.Operation:
        """Returns when the operation is done or timeout_ms passed (0 or None:
        the daemon's maximum, 60 s). The default deadline is the client's
        timeout on top of timeout_ms."""
        if isinstance(timeout, type(DEFAULT)) and self.timeout is not None:
            timeout = self.timeout + (timeout_ms or 60000) / 1000.0
        return cast(pb.Operation, await self._unary("WaitOperation", request(
            pb.WaitOperationRequest, id=id, timeout_ms=timeout_ms), timeout))

    def watch_operation(self, id: str, *,
                        timeout: Timeout = DEFAULT) -> AsyncIterator[pb.Operation]:
        """A stream of the operation: at once, then on every change, ending
        after the message with done true."""
        return self._stream("WatchOperation", pb.WatchOperationRequest(id=id), timeout)

    async def operations(self, *, kind: Enum = None, active_only: Optional[bool] = None,
                   timeout: Timeout = DEFAULT) -> List[pb.Operation]:
        """list_operations' list itself, newest first."""
        return list((await self.list_operations(kind=kind, active_only=active_only,
                                                timeout=timeout)).operations)

    async def operation(self, id: str, *, timeout: Timeout = DEFAULT) -> "AsyncOperationHandle":
        """A handle on an operation that exists already (by its id); a
        TrainOperation for a training."""
        return _handle(self, await self.get_operation(id, timeout=timeout))

    # -- memory ------------------------------------------------------------
    async def get_memory_stats(self, *, all_ranks: Optional[bool] = None,
                         timeout: Timeout = DEFAULT) -> pb.MemoryStats:
        """The devices' memory, the categories and the last step's phase peaks."""
        return cast(pb.MemoryStats, await self._unary("GetMemoryStats", request(
            pb.GetMemoryStatsRequest, all_ranks=all_ranks), timeout))

    async def reset_peak_memory(self, *, timeout: Timeout = DEFAULT) -> pb.ResetPeakMemoryResponse:
        """Resets the devices' peak counters."""
        return cast(pb.ResetPeakMemoryResponse, await self._unary(
            "ResetPeakMemory", pb.ResetPeakMemoryRequest(), timeout))

    async def start_memory_recording(self, *, max_entries: Optional[int] = None,
                               timeout: Timeout = DEFAULT) -> pb.StartMemoryRecordingResponse:
        """Starts recording allocations for dump_memory_history."""
        return cast(pb.StartMemoryRecordingResponse, await self._unary(
            "StartMemoryRecording",
            request(pb.StartMemoryRecordingRequest, max_entries=max_entries), timeout))

    async def stop_memory_recording(self, *, clear: Optional[bool] = None,
                              timeout: Timeout = DEFAULT) -> pb.StopMemoryRecordingResponse:
        """Stops recording (`clear`: and forgets what was recorded)."""
        return cast(pb.StopMemoryRecordingResponse, await self._unary(
            "StopMemoryRecording", request(pb.StopMemoryRecordingRequest, clear=clear), timeout))

    async def get_memory_breakdown(self, *, by: Optional[str] = None, phase: Optional[str] = None,
                             top: Optional[int] = None,
                             timeout: Timeout = DEFAULT) -> pb.MemoryBreakdown:
        """The last step's peak memory by module, op or category."""
        return cast(pb.MemoryBreakdown, await self._unary("GetMemoryBreakdown", request(
            pb.GetMemoryBreakdownRequest, by=by, phase=phase, top=top), timeout))

    async def diff_memory(self, *, step_a: int, step_b: int, top: Optional[int] = None,
                    timeout: Timeout = DEFAULT) -> pb.MemoryDiff:
        """What grew between two of the last 16 finished steps."""
        return cast(pb.MemoryDiff, await self._unary("DiffMemory", request(
            pb.DiffMemoryRequest, step_a=step_a, step_b=step_b, top=top), timeout))

    async def get_last_oom_report(self, *, timeout: Timeout = DEFAULT) -> pb.OomReport:
        """NotFound when no step ran out of memory; oom_report() gives None then."""
        return cast(pb.OomReport, await self._unary(
            "GetLastOomReport", pb.GetLastOomReportRequest(), timeout))

    @overload
    def dump_memory_history(self, path: None = None, *,
                            timeout: Timeout = DEFAULT) -> AsyncIterator[pb.DumpChunk]: ...

    @overload
    def dump_memory_history(self, path: str, *, timeout: Timeout = DEFAULT) -> Awaitable[int]: ...

    def dump_memory_history(self, path: Optional[str] = None, *, timeout: Timeout = DEFAULT
                            ) -> Union[AsyncIterator[pb.DumpChunk], Awaitable[int]]:
        """Without `path`: the async stream of DumpChunks. With it: an
        awaitable that writes their data to `path` (through path + ".part")
        and returns the bytes written. FailedPrecondition when nothing was
        recorded, or when `path` cannot be written (also an OSError)."""
        stream: AsyncIterator[pb.DumpChunk] = self._stream(
            "DumpMemoryHistory", pb.DumpMemoryHistoryRequest(), timeout)
        if path is None:
            return stream
        return _write(stream, path)

    async def memory(self, *, all_ranks: Optional[bool] = None,
               timeout: Timeout = DEFAULT) -> pb.MemoryStats:
        """get_memory_stats. With all_ranks (rank 0 of a data-parallel run)
        every rank's figures are in `.ranks`."""
        return await self.get_memory_stats(all_ranks=all_ranks, timeout=timeout)

    async def rank_memory(self, *, timeout: Timeout = DEFAULT) -> Dict[int, pb.RankMemory]:
        """Every rank's RankMemory, by rank ({0: ...}); one entry when the
        daemon runs alone. FailedPrecondition on a rank other than 0."""
        stats = await self.get_memory_stats(all_ranks=True, timeout=timeout)
        return {r.rank: r for r in stats.ranks}

    async def memory_breakdown(self, *, by: Optional[str] = None, phase: Optional[str] = None,
                         top: Optional[int] = None,
                         timeout: Timeout = DEFAULT) -> pb.MemoryBreakdown:
        """get_memory_breakdown."""
        return await self.get_memory_breakdown(by=by, phase=phase, top=top, timeout=timeout)

    async def memory_top(self, top: int = 20, *, by: Optional[str] = None,
                   phase: Optional[str] = None,
                   timeout: Timeout = DEFAULT) -> List[pb.MemoryBreakdownRow]:
        """The `top` largest MemoryBreakdownRows by module (or by="op" /
        "category"), largest peak first: memprofctl memory top's rows."""
        return list((await self.get_memory_breakdown(by=by, phase=phase, top=top,
                                                     timeout=timeout)).rows)

    async def memory_diff(self, step_a: int, step_b: int, *, top: Optional[int] = None,
                    timeout: Timeout = DEFAULT) -> pb.MemoryDiff:
        """diff_memory: what grew between two of the last 16 finished steps."""
        return await self.diff_memory(step_a=step_a, step_b=step_b, top=top, timeout=timeout)

    async def oom_report(self, *, timeout: Timeout = DEFAULT) -> Optional[pb.OomReport]:
        """The newest OOM report, None when no step ran out of memory."""
        try:
            return await self.get_last_oom_report(timeout=timeout)
        except NotFound:
            return None



def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _write(stream: AsyncIterator[pb.DumpChunk], path: str) -> int:
    part = path + ".part"
    written = 0
    try:
        with _local_file(part) as f:
            async for chunk in stream:
                f.write(chunk.data)
                written += len(chunk.data)
        os.replace(part, path)
    finally:
        if os.path.exists(part):
            os.remove(part)
    return written


async def _iterate(client: AsyncClient, rpc: str, req: Any,
                   deadline: Optional[float]) -> AsyncIterator[Any]:
    # The call is made at the first iteration, in the loop that iterates.
    call = getattr(client.stub, rpc)(req, timeout=deadline, metadata=client._metadata)
    try:
        async for message in call:
            yield message
    except grpc.RpcError as e:
        raise client._call_error(e) from None
    finally:
        call.cancel()


def _handle(client: AsyncClient, operation: pb.Operation) -> "AsyncOperationHandle":
    if operation.kind == pb.OPERATION_KIND_TRAIN:
        return AsyncTrainOperation(client, operation)
    return AsyncOperationHandle(client, operation)


class AsyncOperationHandle:
    """OperationHandle for asyncio: refresh(), cancel() and wait() are
    coroutines, watch() an async iterator. Used by one task at a time."""

    def __init__(self, client: AsyncClient, operation: pb.Operation) -> None:
        self.client = client
        self.operation = operation

    def __repr__(self) -> str:
        return "<%s %s %s>" % (type(self).__name__, self.id,
                               pb.OperationState.Name(self.operation.state))

    @property
    def id(self) -> str:
        """The operation's id ("op-7"), unique for one daemon's lifetime."""
        return self.operation.id

    @property
    def done(self) -> bool:
        """True once it reached a terminal state."""
        return self.operation.done

    @property
    def state(self) -> int:
        """Its OperationState (pb.OPERATION_STATE_...)."""
        return self.operation.state

    def result(self) -> Optional[Result]:
        """The typed result once done, else None (OperationHandle.result)."""
        field = self.operation.WhichOneof("result")
        return cast(Result, getattr(self.operation, field)) if field else None

    async def refresh(self) -> pb.Operation:
        """Fetches the operation anew and returns it."""
        try:
            await self._update(await self.client.get_operation(self.id))
        except NotFound:
            await self._restarted(Deadline(self.client.reconnect_timeout))
        return self.operation

    async def cancel(self) -> pb.Operation:
        """Asks the daemon to stop it; returns the operation as it stands.
        FailedPrecondition when it is done already."""
        await self._update(await self.client.cancel_operation(self.id))
        return self.operation

    async def wait(self, timeout: Optional[float] = None, *, check: bool = True) -> pb.Operation:
        """Until the operation is done (OperationHandle.wait): at most
        `timeout` seconds (DeadlineExceeded); with `check` a FAILED one
        raises its error's exception."""
        deadline = Deadline(timeout)
        while True:
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
            if not self._follows(self.operation):
                break
            await self._restarted(Deadline(self.client.reconnect_timeout))
        if check and self.operation.state == pb.OPERATION_STATE_FAILED:
            raise error_for(self.operation.error.code, self.operation.error.message,
                            self.operation)
        return self.operation

    async def watch(self) -> AsyncIterator[pb.Operation]:
        """The operation on every change of state or progress, until done."""
        async for op in self.client.watch_operation(self.id):
            await self._update(op)
            yield op

    def _follows(self, op: pb.Operation) -> bool:
        return False

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

    def __init__(self, client: AsyncClient, operation: pb.Operation) -> None:
        super().__init__(client, operation)
        self.followed: List[str] = [operation.id]
        self.lost_global_steps: List[int] = []

    def result(self) -> Optional[pb.TrainResult]:
        """The TrainResult once done (also when cancelled or stopped by a
        drain), else None."""
        return self.operation.train if self.operation.HasField("train") else None

    async def reports(self, from_step: int = 1) -> AsyncIterator[pb.StepReport]:
        """The StepReports from `from_step`, live until the run is done,
        across disconnections, drains and restarts (TrainOperation.reports)."""
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
                    if not self._follows(self.operation):
                        return
                    await self._restarted(Deadline(self.client.reconnect_timeout))
                else:
                    await asyncio.sleep(RETRY_INTERVAL)
            except Unavailable:
                await self._reconnect()
            except NotFound:
                await self._restarted(Deadline(self.client.reconnect_timeout))
            if not same_operation(opened, self.operation):
                cursor.switched()

    def _follows(self, op: pb.Operation) -> bool:
        return drained(op)

    async def _restarted(self, deadline: Deadline) -> None:
        lost = self.operation
        while True:
            try:
                found = successor(lost, (await self.client.list_operations(
                    kind=pb.OPERATION_KIND_TRAIN, timeout=deadline.left(5.0))).operations)
            except (Unavailable, DeadlineExceeded):
                found = None
            if found is not None:
                self.operation = found
                self.followed.append(found.id)
                return
            if deadline.passed():
                raise lost_error(lost, self.client.addr, self.client.reconnect_timeout)
            await asyncio.sleep(RETRY_INTERVAL)
