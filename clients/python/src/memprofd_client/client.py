"""The blocking client and its operation handles."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union, cast, overload

import grpc

from . import pb
from ._connect import (DEFAULT_ADDR, ChannelOptions, channel_credentials, channel_options,
                       resolve_token)
from ._follow import (DEFAULT_RECONNECT_TIMEOUT, RETRY_INTERVAL, Deadline, ReportCursor,
                      drained, lost_error, same_operation, successor)
from ._methods import DEFAULT, PROBE_METHOD, ClientState, Enum, Timeout, request
from ._stubs import SERVICE_NAME, make_stub
from .errors import (DeadlineExceeded, FailedPrecondition, MemprofdError, NotFound, Unavailable,
                     also, error_for)

Result = Union[pb.TrainResult, pb.SnapshotManifest, pb.ModelInfo, pb.EvaluateResult,
               pb.MemoryPlan]


class Client(ClientState):
    """A blocking client of one memprofd daemon: every RPC as a method (see
    RPC_METHODS) plus helpers. Thread-safe (the gRPC channel is); each
    operation handle belongs to one thread.

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
    wait_for_ready: unary calls wait (within their deadline) for a daemon
        that is not reachable yet, instead of failing at once; a call whose
        deadline passes without the daemon ever answering is Unavailable.
    reconnect_timeout: how long handles wait for a daemon that went away.
    options: extra gRPC channel options; channel: use this channel instead.
    """

    def __init__(self, addr: str = DEFAULT_ADDR, *, token: Optional[str] = None,
                 token_file: Optional[str] = None, tls_ca: Optional[str] = None,
                 tls_server_name: Optional[str] = None, insecure: Optional[bool] = None,
                 timeout: Optional[float] = 10.0, stream_timeout: Optional[float] = None,
                 wait_for_ready: bool = True,
                 reconnect_timeout: Optional[float] = DEFAULT_RECONNECT_TIMEOUT,
                 options: ChannelOptions = (), channel: Optional[grpc.Channel] = None) -> None:
        self.addr = addr
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.wait_for_ready = wait_for_ready
        self.reconnect_timeout = reconnect_timeout
        self._closed = False
        token = resolve_token(token, token_file)
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        creds = channel_credentials(addr, tls_ca, insecure) if channel is None else None
        self._tls = creds is not None
        if channel is None:
            opts = channel_options(SERVICE_NAME, tls_server_name, options)
            channel = (grpc.secure_channel(addr, creds, opts) if creds is not None
                       else grpc.insecure_channel(addr, opts))
        self.channel: grpc.Channel = channel
        """The gRPC channel."""
        self.stub = make_stub(channel)
        """The generated stub: plain protos, no token, grpc.RpcError."""

    def close(self) -> None:
        """Closes the channel; calls after it raise FailedPrecondition."""
        self._closed = True
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the calls ---------------------------------------------------------
    def _unary(self, rpc: str, req: Any, timeout: Timeout,
               wait_for_ready: Optional[bool] = None) -> Any:
        if self._closed:
            raise self._closed_error()
        deadline = self._deadline(timeout)
        ready = self.wait_for_ready if wait_for_ready is None else wait_for_ready
        try:
            return getattr(self.stub, rpc)(req, timeout=deadline, metadata=self._metadata,
                                           wait_for_ready=ready)
        except grpc.RpcError as e:
            err = self._call_error(e)
        except ValueError as e:  # the channel was closed under the call
            raise self._closed_error() from e
        if isinstance(err, DeadlineExceeded):
            err = self._unreached(err, self._probe(deadline))
        raise err

    def _probe(self, deadline: Optional[float]) -> Optional[MemprofdError]:
        # A method no policy retries, so that the connection's own error
        # comes back at once; a daemon that answers says UNIMPLEMENTED.
        probe: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(PROBE_METHOD)
        try:
            probe(b"", timeout=self._probe_timeout(deadline), wait_for_ready=False)
        except grpc.RpcError as e:
            return self._call_error(e)
        return None

    def _stream(self, rpc: str, req: Any, timeout: Timeout) -> Iterator[Any]:
        if self._closed:
            raise self._closed_error()
        call = getattr(self.stub, rpc)(req, timeout=self._deadline(timeout, stream=True),
                                       metadata=self._metadata)
        return _iterate(self, call)

    def _start(self, rpc: str, req: Any, timeout: Timeout) -> "OperationHandle":
        return _handle(self, self._unary(rpc, req, timeout))

    # -- status and model --------------------------------------------------
    def get_status(self, *, timeout: Timeout = DEFAULT) -> pb.ServerStatus:
        """Build info, device, model summary, uptime, serving state (SERVING
        or DRAINING), data-parallel place."""
        return cast(pb.ServerStatus, self._unary("GetStatus", pb.GetStatusRequest(), timeout))

    def load_model(self, *, preset: Optional[str] = None, hf_directory: Optional[str] = None,
                   seed: Optional[int] = None,
                   placement: Optional[Iterable[pb.ModulePlacement]] = None,
                   resume: Optional[bool] = None, init_weights: Optional[bool] = None,
                   lora_adapter: Optional[str] = None, base_dtype: Optional[str] = None,
                   timeout: Timeout = DEFAULT) -> "OperationHandle":
        """Replaces the model (exactly one of preset, hf_directory). Returns an
        operation handle (kind LOAD_MODEL; result: `model`). init_weights: take
        hf_directory's config.json only, with weights initialised from seed.
        lora_adapter: a peft LoRA adapter directory loaded onto the model.
        base_dtype: "bf16" makes and loads the weights in bf16, frozen (the
        model trains LoRA adapters only); "float32"; None: a resumed LoRA
        run's own (resume with lora_adapter), else float32."""
        return self._start("LoadModel", request(
            pb.LoadModelRequest, preset=preset, hf_directory=hf_directory, seed=seed,
            placement=placement, resume=resume, init_weights=init_weights,
            lora_adapter=lora_adapter, base_dtype=base_dtype), timeout)

    def describe_model(self, *, timeout: Timeout = DEFAULT) -> pb.ModelInfo:
        """The model with every parameter. FailedPrecondition: no model."""
        return cast(pb.ModelInfo, self._unary("DescribeModel", pb.DescribeModelRequest(), timeout))

    # -- training ----------------------------------------------------------
    def train(self, *, steps: Optional[int] = None, batch_size: Optional[int] = None,
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
              timeout: Timeout = DEFAULT) -> "TrainOperation":
        """Queues a training (TrainRequest's fields; see train.proto) and
        returns its handle: reports(), wait(), cancel(), refresh().
        memory_budget_bytes: run the fastest configuration whose planned peak
        fits (docs/planning.md); the handle's result and first report name it.
        Not retried: a second call would be a second training."""
        return cast(TrainOperation, self._start("Train", request(
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
                            timeout: Timeout = DEFAULT) -> Iterator[pb.StepReport]:
        """The raw stream of a TRAIN operation's StepReports from `from_step`;
        a training handle's reports() adds reconnection and resumption."""
        return self._stream("StreamStepReports", request(
            pb.StreamStepReportsRequest, operation_id=operation_id, from_step=from_step),
            timeout)

    def evaluate(self, *, data: Optional[pb.DataSource] = None,
                 batch_size: Optional[int] = None, seq_len: Optional[int] = None,
                 max_batches: Optional[int] = None, attn_implementation: Optional[str] = None,
                 mixed_precision: Optional[str] = None,
                 loss_chunk_tokens: Optional[int] = None,
                 timeout: Timeout = DEFAULT) -> "OperationHandle":
        """Mean cross-entropy on held-out tokens. Returns an operation handle
        (kind EVALUATE; result: `evaluate`)."""
        return self._start("Evaluate", request(
            pb.EvaluateRequest, data=data, batch_size=batch_size, seq_len=seq_len,
            max_batches=max_batches, attn_implementation=attn_implementation,
            mixed_precision=mixed_precision, loss_chunk_tokens=loss_chunk_tokens), timeout)

    def plan_memory(self, *, preset: Optional[str] = None,
                    hf_config_dir: Optional[str] = None,
                    train: Optional[pb.TrainRequest] = None, target: Optional[str] = None,
                    capacity_bytes: Optional[int] = None,
                    world_size: Optional[int] = None, sharding: Optional[str] = None,
                    timeout: Timeout = DEFAULT) -> "OperationHandle":
        """Where every byte of one training step would go, before it runs
        (PlanMemoryRequest; see memprofd.proto): the model of `preset`, of
        `hf_config_dir`'s config.json, or (neither) the loaded one; `train` the
        TrainRequest to plan (steps not needed); `target` "cpu" or "cuda";
        `capacity_bytes` for the verdict; `world_size` and `sharding` ("none",
        "optimizer", "gradients") for each rank of a data-parallel run
        (MemoryPlan.ranks). Returns an operation handle (kind PLAN; result:
        `plan`, a MemoryPlan). ResourceExhausted while another plan runs;
        InvalidArgument naming world_size or sharding for a bad value."""
        return self._start("PlanMemory", request(
            pb.PlanMemoryRequest, preset=preset, hf_config_dir=hf_config_dir, train=train,
            target=target, capacity_bytes=capacity_bytes, world_size=world_size,
            sharding=sharding), timeout)

    # -- snapshots ---------------------------------------------------------
    def snapshot(self, name: str, *, max_shard_size: Optional[str] = None,
                 dtype: Enum = None, mode: Enum = None, kind: Enum = None,
                 timeout: Timeout = DEFAULT) -> "OperationHandle":
        """Writes a snapshot under the daemon's --snapshot_root (enums as
        numbers or names: kind="SNAPSHOT_KIND_CHECKPOINT" or "CHECKPOINT").
        Returns an operation handle (kind SNAPSHOT; result: `snapshot`, the
        manifest)."""
        return self._start("Snapshot", request(
            pb.SnapshotRequest, name=name, max_shard_size=max_shard_size, dtype=dtype,
            mode=mode, kind=kind), timeout)

    def list_snapshots(self, *, timeout: Timeout = DEFAULT) -> pb.ListSnapshotsResponse:
        """Every published snapshot, oldest first."""
        return cast(pb.ListSnapshotsResponse,
                    self._unary("ListSnapshots", pb.ListSnapshotsRequest(), timeout))

    def describe_snapshot(self, name: str, *, timeout: Timeout = DEFAULT) -> pb.SnapshotManifest:
        """A snapshot's manifest. NotFound for an unknown name."""
        return cast(pb.SnapshotManifest, self._unary(
            "DescribeSnapshot", pb.DescribeSnapshotRequest(name=name), timeout))

    def delete_snapshot(self, name: str, *,
                        timeout: Timeout = DEFAULT) -> pb.DeleteSnapshotResponse:
        """Deletes a snapshot. FailedPrecondition for one the model maps or a
        LoadModel in flight reads."""
        return cast(pb.DeleteSnapshotResponse, self._unary(
            "DeleteSnapshot", pb.DeleteSnapshotRequest(name=name), timeout))

    # -- operations --------------------------------------------------------
    def get_operation(self, id: str, *, timeout: Timeout = DEFAULT) -> pb.Operation:
        """The operation as it stands. NotFound for an unknown id."""
        return cast(pb.Operation, self._unary("GetOperation", pb.GetOperationRequest(id=id),
                                              timeout))

    def list_operations(self, *, kind: Enum = None, active_only: Optional[bool] = None,
                        timeout: Timeout = DEFAULT) -> pb.ListOperationsResponse:
        """Operations, newest first (`kind`: only that kind; `active_only`:
        only those not done)."""
        return cast(pb.ListOperationsResponse, self._unary("ListOperations", request(
            pb.ListOperationsRequest, kind=kind, active_only=active_only), timeout))

    def cancel_operation(self, id: str, *, timeout: Timeout = DEFAULT) -> pb.Operation:
        """Asks an operation to stop; returns it as it stands.
        FailedPrecondition when it is done already."""
        return cast(pb.Operation, self._unary(
            "CancelOperation", pb.CancelOperationRequest(id=id), timeout))

    def wait_operation(self, id: str, *, timeout_ms: Optional[int] = None,
                       timeout: Timeout = DEFAULT) -> pb.Operation:
        """Returns when the operation is done or timeout_ms passed (0 or None:
        the daemon's maximum, 60 s). The default deadline is the client's
        timeout on top of timeout_ms."""
        if isinstance(timeout, type(DEFAULT)) and self.timeout is not None:
            timeout = self.timeout + (timeout_ms or 60000) / 1000.0
        return cast(pb.Operation, self._unary("WaitOperation", request(
            pb.WaitOperationRequest, id=id, timeout_ms=timeout_ms), timeout))

    def watch_operation(self, id: str, *, timeout: Timeout = DEFAULT) -> Iterator[pb.Operation]:
        """A stream of the operation: at once, then on every change, ending
        after the message with done true."""
        return self._stream("WatchOperation", pb.WatchOperationRequest(id=id), timeout)

    def operations(self, *, kind: Enum = None, active_only: Optional[bool] = None,
                   timeout: Timeout = DEFAULT) -> List[pb.Operation]:
        """list_operations' list itself, newest first."""
        return list(self.list_operations(kind=kind, active_only=active_only,
                                         timeout=timeout).operations)

    def operation(self, id: str, *, timeout: Timeout = DEFAULT) -> "OperationHandle":
        """A handle on an operation that exists already (by its id); a
        TrainOperation for a training."""
        return _handle(self, self.get_operation(id, timeout=timeout))

    # -- memory ------------------------------------------------------------
    def get_memory_stats(self, *, all_ranks: Optional[bool] = None,
                         timeout: Timeout = DEFAULT) -> pb.MemoryStats:
        """The devices' memory, the categories and the last step's phase peaks."""
        return cast(pb.MemoryStats, self._unary("GetMemoryStats", request(
            pb.GetMemoryStatsRequest, all_ranks=all_ranks), timeout))

    def reset_peak_memory(self, *, timeout: Timeout = DEFAULT) -> pb.ResetPeakMemoryResponse:
        """Resets the devices' peak counters."""
        return cast(pb.ResetPeakMemoryResponse, self._unary(
            "ResetPeakMemory", pb.ResetPeakMemoryRequest(), timeout))

    def start_memory_recording(self, *, max_entries: Optional[int] = None,
                               timeout: Timeout = DEFAULT) -> pb.StartMemoryRecordingResponse:
        """Starts recording allocations for dump_memory_history."""
        return cast(pb.StartMemoryRecordingResponse, self._unary("StartMemoryRecording", request(
            pb.StartMemoryRecordingRequest, max_entries=max_entries), timeout))

    def stop_memory_recording(self, *, clear: Optional[bool] = None,
                              timeout: Timeout = DEFAULT) -> pb.StopMemoryRecordingResponse:
        """Stops recording (`clear`: and forgets what was recorded)."""
        return cast(pb.StopMemoryRecordingResponse, self._unary("StopMemoryRecording", request(
            pb.StopMemoryRecordingRequest, clear=clear), timeout))

    def get_memory_breakdown(self, *, by: Optional[str] = None, phase: Optional[str] = None,
                             top: Optional[int] = None,
                             timeout: Timeout = DEFAULT) -> pb.MemoryBreakdown:
        """The last step's peak memory by module, op or category."""
        return cast(pb.MemoryBreakdown, self._unary("GetMemoryBreakdown", request(
            pb.GetMemoryBreakdownRequest, by=by, phase=phase, top=top), timeout))

    def diff_memory(self, *, step_a: int, step_b: int, top: Optional[int] = None,
                    timeout: Timeout = DEFAULT) -> pb.MemoryDiff:
        """What grew between two of the last 16 finished steps."""
        return cast(pb.MemoryDiff, self._unary("DiffMemory", request(
            pb.DiffMemoryRequest, step_a=step_a, step_b=step_b, top=top), timeout))

    def get_last_oom_report(self, *, timeout: Timeout = DEFAULT) -> pb.OomReport:
        """NotFound when no step ran out of memory; oom_report() gives None then."""
        return cast(pb.OomReport, self._unary("GetLastOomReport", pb.GetLastOomReportRequest(),
                                              timeout))

    @overload
    def dump_memory_history(self, path: None = None, *,
                            timeout: Timeout = DEFAULT) -> Iterator[pb.DumpChunk]: ...

    @overload
    def dump_memory_history(self, path: str, *, timeout: Timeout = DEFAULT) -> int: ...

    def dump_memory_history(self, path: Optional[str] = None, *,
                            timeout: Timeout = DEFAULT) -> Union[Iterator[pb.DumpChunk], int]:
        """Without `path`: the stream of DumpChunks. With it: writes their
        data to `path` (a PyTorch memory-snapshot pickle for memory_viz;
        through path + ".part", renamed when complete) and returns the bytes
        written. FailedPrecondition when nothing was recorded, or when `path`
        cannot be written (also an OSError)."""
        stream: Iterator[pb.DumpChunk] = self._stream(
            "DumpMemoryHistory", pb.DumpMemoryHistoryRequest(), timeout)
        if path is None:
            return stream
        part = path + ".part"
        written = 0
        try:
            with _local_file(part) as f:
                for chunk in stream:
                    f.write(chunk.data)
                    written += len(chunk.data)
            os.replace(part, path)
        finally:
            if os.path.exists(part):
                os.remove(part)
        return written

    def memory(self, *, all_ranks: Optional[bool] = None,
               timeout: Timeout = DEFAULT) -> pb.MemoryStats:
        """get_memory_stats. With all_ranks (rank 0 of a data-parallel run)
        every rank's figures are in `.ranks`."""
        return self.get_memory_stats(all_ranks=all_ranks, timeout=timeout)

    def rank_memory(self, *, timeout: Timeout = DEFAULT) -> Dict[int, pb.RankMemory]:
        """Every rank's RankMemory, by rank ({0: ...}); one entry when the
        daemon runs alone. FailedPrecondition on a rank other than 0."""
        return {r.rank: r for r in self.get_memory_stats(all_ranks=True, timeout=timeout).ranks}

    def memory_breakdown(self, *, by: Optional[str] = None, phase: Optional[str] = None,
                         top: Optional[int] = None,
                         timeout: Timeout = DEFAULT) -> pb.MemoryBreakdown:
        """get_memory_breakdown."""
        return self.get_memory_breakdown(by=by, phase=phase, top=top, timeout=timeout)

    def memory_top(self, top: int = 20, *, by: Optional[str] = None,
                   phase: Optional[str] = None,
                   timeout: Timeout = DEFAULT) -> List[pb.MemoryBreakdownRow]:
        """The `top` largest MemoryBreakdownRows by module (or by="op" /
        "category"), largest peak first: memprofctl memory top's rows."""
        return list(self.get_memory_breakdown(by=by, phase=phase, top=top,
                                              timeout=timeout).rows)

    def memory_diff(self, step_a: int, step_b: int, *, top: Optional[int] = None,
                    timeout: Timeout = DEFAULT) -> pb.MemoryDiff:
        """diff_memory: what grew between two of the last 16 finished steps."""
        return self.diff_memory(step_a=step_a, step_b=step_b, top=top, timeout=timeout)

    def oom_report(self, *, timeout: Timeout = DEFAULT) -> Optional[pb.OomReport]:
        """The newest OOM report, None when no step ran out of memory."""
        try:
            return self.get_last_oom_report(timeout=timeout)
        except NotFound:
            return None


class _local_file:
    """A local file opened for writing whose OSErrors are MemprofdErrors
    (FailedPrecondition, also the OSError)."""

    def __init__(self, path: str) -> None:
        try:
            self.f = open(path, "wb")
        except OSError as e:
            raise also(FailedPrecondition, OSError,
                       "cannot write '%s' (%s)" % (path, e.strerror)) from None

    def __enter__(self) -> "_local_file":
        return self

    def write(self, data: bytes) -> None:
        try:
            self.f.write(data)
        except OSError as e:
            raise also(FailedPrecondition, OSError,
                       "cannot write '%s' (%s)" % (self.f.name, e.strerror)) from None

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def _iterate(client: Client, call: Any) -> Iterator[Any]:
    try:
        for message in call:
            yield message
    except grpc.RpcError as e:
        raise client._call_error(e) from None
    except ValueError as e:
        raise client._closed_error() from e
    finally:
        call.cancel()  # a stream left early; no-op when it ended


def _handle(client: Client, operation: pb.Operation) -> "OperationHandle":
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

    def __init__(self, client: Client, operation: pb.Operation) -> None:
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
        """The typed result (TrainResult, SnapshotManifest, ModelInfo,
        EvaluateResult, MemoryPlan) once done, else None."""
        field = self.operation.WhichOneof("result")
        return cast(Result, getattr(self.operation, field)) if field else None

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
        of memory, Aborted for one a draining daemon stopped...) with
        `.operation` set; CANCELLED returns normally. A training the daemon
        stopped to shut down is followed into the run that resumes it
        (TrainOperation)."""
        deadline = Deadline(timeout)
        while True:
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
            if not self._follows(self.operation):
                break
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
    def _follows(self, op: pb.Operation) -> bool:
        """Whether a done `op` goes on in another operation (a resumed run)."""
        return False

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
    iterates over its step reports. When the daemon stops the run to shut
    down (the operation ends ABORTED, reason DRAINING) or dies, it follows
    the run into the first TRAIN operation created after its own (the
    Train(resume=True) that continues it from its last checkpoint) within
    the client's reconnect_timeout; `followed` lists the ids it went
    through."""

    def __init__(self, client: Client, operation: pb.Operation) -> None:
        super().__init__(client, operation)
        self.followed: List[str] = [operation.id]
        self.lost_global_steps: List[int] = []

    def result(self) -> Optional[pb.TrainResult]:
        """The TrainResult once done (also when cancelled or stopped by a
        drain: the steps that ran), else None."""
        return self.operation.train if self.operation.HasField("train") else None

    def reports(self, from_step: int = 1) -> Iterator[pb.StepReport]:
        """The StepReports from `from_step` (1-based within this operation),
        live until the run is done. Reconnects after UNAVAILABLE and follows
        a resumed run after a drain or a restart, never repeating a report
        (global_step only grows); see memprofd_client._follow."""
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
                    if not self._follows(self.operation):
                        return
                    self._restarted(Deadline(self.client.reconnect_timeout))
                else:
                    time.sleep(RETRY_INTERVAL)  # ended early (a draining daemon): read on
            except Unavailable:
                self._reconnect()
            except NotFound:
                self._restarted(Deadline(self.client.reconnect_timeout))
            if not same_operation(opened, self.operation):
                cursor.switched()

    def _follows(self, op: pb.Operation) -> bool:
        return drained(op)

    def _restarted(self, deadline: Deadline) -> None:
        lost = self.operation
        while True:
            try:
                found = successor(lost, self.client.list_operations(
                    kind=pb.OPERATION_KIND_TRAIN, timeout=deadline.left(5.0)).operations)
            except (Unavailable, DeadlineExceeded):
                found = None
            if found is not None:
                self.operation = found
                self.followed.append(found.id)
                return
            if deadline.passed():
                raise lost_error(lost, self.client.addr, self.client.reconnect_timeout)
            time.sleep(RETRY_INTERVAL)
