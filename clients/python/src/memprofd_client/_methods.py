"""The API's calls, written once for Client and AsyncClient.

Each RPC of memprofd.v1.Memprofd is a method named as the RPC in snake_case
(RPC_METHODS), taking the request's fields as keyword arguments of the same
names; an argument left None is not set, so the daemon's default holds
(proto3 `optional` fields) or the field keeps its zero value. Methods return
the response message, except the five that start an operation (load_model,
train, snapshot, evaluate, plan_memory), which return a handle on it, and
dump_memory_history, which can write the file itself.

The subclass decides what a call is (_unary, _stream, _start, _then): in
Client it blocks and returns the message; in AsyncClient it returns an
awaitable of the same message (streams: an async iterator). Every method
takes `timeout`: seconds until the call's deadline, None for no deadline,
unset for the client's default (`timeout` for unary calls, `stream_timeout`
for streams).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Optional, Union

from . import pb
from ._stubs import SERVICE


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()
Timeout = Union[float, None, _Default]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# RPC name -> method name on both clients ("GetStatus" -> "get_status").
RPC_METHODS = {m.name: _snake(m.name) for m in SERVICE.methods}


def _request(cls, **fields):
    return cls(**{k: v for k, v in fields.items() if v is not None})


class _Api:
    """The methods both clients share; see the module docstring."""

    timeout: Optional[float]
    stream_timeout: Optional[float]

    # -- what a subclass provides ------------------------------------------
    def _unary(self, rpc: str, request, timeout: Timeout, wait_for_ready: bool = False):
        raise NotImplementedError

    def _stream(self, rpc: str, request, timeout: Timeout):
        raise NotImplementedError

    def _start(self, rpc: str, request, timeout: Timeout):
        raise NotImplementedError

    def _then(self, value, fn: Callable):
        raise NotImplementedError

    def _deadline(self, timeout: Timeout, stream: bool = False) -> Optional[float]:
        if timeout is DEFAULT:
            return self.stream_timeout if stream else self.timeout
        return timeout

    # -- status and model --------------------------------------------------
    def get_status(self, *, timeout: Timeout = DEFAULT) -> pb.ServerStatus:
        """Build info, device, model summary, uptime, data-parallel place."""
        return self._unary("GetStatus", pb.GetStatusRequest(), timeout)

    def load_model(self, *, preset: Optional[str] = None, hf_directory: Optional[str] = None,
                   seed: Optional[int] = None,
                   placement: Optional[Iterable[pb.ModulePlacement]] = None,
                   resume: Optional[bool] = None, init_weights: Optional[bool] = None,
                   timeout: Timeout = DEFAULT):
        """Replaces the model (exactly one of preset, hf_directory). Returns an
        operation handle (kind LOAD_MODEL; result: `model`). init_weights: take
        hf_directory's config.json only, with weights initialised from seed."""
        return self._start("LoadModel", _request(
            pb.LoadModelRequest, preset=preset, hf_directory=hf_directory, seed=seed,
            placement=placement, resume=resume, init_weights=init_weights), timeout)

    def describe_model(self, *, timeout: Timeout = DEFAULT) -> pb.ModelInfo:
        """The model with every parameter. FailedPrecondition: no model."""
        return self._unary("DescribeModel", pb.DescribeModelRequest(), timeout)

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
              memory_budget_bytes: Optional[int] = None, timeout: Timeout = DEFAULT):
        """Queues a training (TrainRequest's fields; see train.proto). Returns
        a training handle: wait(), cancel(), refresh(), reports().
        memory_budget_bytes: run the fastest configuration whose planned peak
        fits (docs/planning.md); the handle's result and first report name it."""
        return self._start("Train", _request(
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
            memory_budget_bytes=memory_budget_bytes), timeout)

    def stream_step_reports(self, operation_id: str, *, from_step: Optional[int] = None,
                            timeout: Timeout = DEFAULT):
        """The raw stream of a TRAIN operation's StepReports from `from_step`;
        a training handle's reports() adds reconnection and resumption."""
        return self._stream("StreamStepReports", _request(
            pb.StreamStepReportsRequest, operation_id=operation_id, from_step=from_step),
            timeout)

    def evaluate(self, *, data: Optional[pb.DataSource] = None,
                 batch_size: Optional[int] = None, seq_len: Optional[int] = None,
                 max_batches: Optional[int] = None, attn_implementation: Optional[str] = None,
                 mixed_precision: Optional[str] = None,
                 loss_chunk_tokens: Optional[int] = None, timeout: Timeout = DEFAULT):
        """Mean cross-entropy on held-out tokens. Returns an operation handle
        (kind EVALUATE; result: `evaluate`)."""
        return self._start("Evaluate", _request(
            pb.EvaluateRequest, data=data, batch_size=batch_size, seq_len=seq_len,
            max_batches=max_batches, attn_implementation=attn_implementation,
            mixed_precision=mixed_precision, loss_chunk_tokens=loss_chunk_tokens), timeout)

    def plan_memory(self, *, preset: Optional[str] = None,
                    hf_config_dir: Optional[str] = None,
                    train: Optional[pb.TrainRequest] = None, target: Optional[str] = None,
                    capacity_bytes: Optional[int] = None,
                    world_size: Optional[int] = None, sharding: Optional[str] = None,
                    timeout: Timeout = DEFAULT):
        """Where every byte of one training step would go, before it runs
        (PlanMemoryRequest; see memprofd.proto): the model of `preset`, of
        `hf_config_dir`'s config.json, or (neither) the loaded one; `train` the
        TrainRequest to plan (steps not needed); `target` "cpu" or "cuda";
        `capacity_bytes` for the verdict; `world_size` and `sharding` ("none",
        "optimizer", "gradients") for each rank of a data-parallel run
        (MemoryPlan.ranks). Returns an operation handle (kind PLAN; result:
        `plan`, a MemoryPlan). ResourceExhausted while another plan runs;
        InvalidArgument naming world_size or sharding for a bad value."""
        return self._start("PlanMemory", _request(
            pb.PlanMemoryRequest, preset=preset, hf_config_dir=hf_config_dir, train=train,
            target=target, capacity_bytes=capacity_bytes, world_size=world_size,
            sharding=sharding), timeout)

    # -- snapshots ---------------------------------------------------------
    def snapshot(self, name: str, *, max_shard_size: Optional[str] = None,
                 dtype: Union[int, str, None] = None, mode: Union[int, str, None] = None,
                 kind: Union[int, str, None] = None, timeout: Timeout = DEFAULT):
        """Writes a snapshot under the daemon's --snapshot_root (enums as
        numbers or names: kind="SNAPSHOT_KIND_CHECKPOINT"). Returns an
        operation handle (kind SNAPSHOT; result: `snapshot`, the manifest)."""
        return self._start("Snapshot", _request(
            pb.SnapshotRequest, name=name, max_shard_size=max_shard_size, dtype=dtype,
            mode=mode, kind=kind), timeout)

    def list_snapshots(self, *, timeout: Timeout = DEFAULT) -> pb.ListSnapshotsResponse:
        return self._unary("ListSnapshots", pb.ListSnapshotsRequest(), timeout)

    def describe_snapshot(self, name: str, *,
                          timeout: Timeout = DEFAULT) -> pb.SnapshotManifest:
        return self._unary("DescribeSnapshot", pb.DescribeSnapshotRequest(name=name), timeout)

    def delete_snapshot(self, name: str, *,
                        timeout: Timeout = DEFAULT) -> pb.DeleteSnapshotResponse:
        return self._unary("DeleteSnapshot", pb.DeleteSnapshotRequest(name=name), timeout)

    # -- operations --------------------------------------------------------
    def get_operation(self, id: str, *, timeout: Timeout = DEFAULT) -> pb.Operation:
        return self._unary("GetOperation", pb.GetOperationRequest(id=id), timeout)

    def list_operations(self, *, kind: Union[int, str, None] = None,
                        active_only: Optional[bool] = None,
                        timeout: Timeout = DEFAULT) -> pb.ListOperationsResponse:
        return self._unary("ListOperations", _request(
            pb.ListOperationsRequest, kind=kind, active_only=active_only), timeout)

    def cancel_operation(self, id: str, *, timeout: Timeout = DEFAULT) -> pb.Operation:
        return self._unary("CancelOperation", pb.CancelOperationRequest(id=id), timeout)

    def wait_operation(self, id: str, *, timeout_ms: Optional[int] = None,
                       timeout: Timeout = DEFAULT) -> pb.Operation:
        """Returns when the operation is done or timeout_ms passed (0 or None:
        the daemon's maximum, 60 s). The default deadline is the client's
        timeout on top of timeout_ms."""
        if timeout is DEFAULT and self.timeout is not None:
            timeout = self.timeout + (timeout_ms or 60000) / 1000.0
        return self._unary("WaitOperation", _request(
            pb.WaitOperationRequest, id=id, timeout_ms=timeout_ms), timeout)

    def watch_operation(self, id: str, *, timeout: Timeout = DEFAULT):
        """A stream of the operation: at once, then on every change, ending
        after the message with done true."""
        return self._stream("WatchOperation", pb.WatchOperationRequest(id=id), timeout)

    def operations(self, *, kind: Union[int, str, None] = None,
                   active_only: Optional[bool] = None, timeout: Timeout = DEFAULT):
        """list_operations' list itself, newest first."""
        return self._then(self.list_operations(kind=kind, active_only=active_only,
                                               timeout=timeout), lambda r: list(r.operations))

    # -- memory ------------------------------------------------------------
    def get_memory_stats(self, *, all_ranks: Optional[bool] = None,
                         timeout: Timeout = DEFAULT) -> pb.MemoryStats:
        return self._unary("GetMemoryStats", _request(
            pb.GetMemoryStatsRequest, all_ranks=all_ranks), timeout)

    def reset_peak_memory(self, *, timeout: Timeout = DEFAULT) -> pb.ResetPeakMemoryResponse:
        return self._unary("ResetPeakMemory", pb.ResetPeakMemoryRequest(), timeout)

    def start_memory_recording(self, *, max_entries: Optional[int] = None,
                               timeout: Timeout = DEFAULT) -> pb.StartMemoryRecordingResponse:
        return self._unary("StartMemoryRecording", _request(
            pb.StartMemoryRecordingRequest, max_entries=max_entries), timeout)

    def stop_memory_recording(self, *, clear: Optional[bool] = None,
                              timeout: Timeout = DEFAULT) -> pb.StopMemoryRecordingResponse:
        return self._unary("StopMemoryRecording", _request(
            pb.StopMemoryRecordingRequest, clear=clear), timeout)

    def get_memory_breakdown(self, *, by: Optional[str] = None, phase: Optional[str] = None,
                             top: Optional[int] = None,
                             timeout: Timeout = DEFAULT) -> pb.MemoryBreakdown:
        return self._unary("GetMemoryBreakdown", _request(
            pb.GetMemoryBreakdownRequest, by=by, phase=phase, top=top), timeout)

    def diff_memory(self, *, step_a: int, step_b: int, top: Optional[int] = None,
                    timeout: Timeout = DEFAULT) -> pb.MemoryDiff:
        return self._unary("DiffMemory", _request(
            pb.DiffMemoryRequest, step_a=step_a, step_b=step_b, top=top), timeout)

    def get_last_oom_report(self, *, timeout: Timeout = DEFAULT) -> pb.OomReport:
        """NotFound when no step ran out of memory; oom_report() gives None then."""
        return self._unary("GetLastOomReport", pb.GetLastOomReportRequest(), timeout)

    def memory(self, *, all_ranks: Optional[bool] = None,
               timeout: Timeout = DEFAULT) -> pb.MemoryStats:
        """get_memory_stats. With all_ranks (rank 0 of a data-parallel run)
        every rank's figures are in `.ranks`."""
        return self.get_memory_stats(all_ranks=all_ranks, timeout=timeout)

    def rank_memory(self, *, timeout: Timeout = DEFAULT):
        """Every rank's RankMemory, by rank ({0: ...}); one entry when the
        daemon runs alone. FailedPrecondition on a rank other than 0."""
        return self._then(self.get_memory_stats(all_ranks=True, timeout=timeout),
                          lambda s: {r.rank: r for r in s.ranks})

    def memory_breakdown(self, *, by: Optional[str] = None, phase: Optional[str] = None,
                         top: Optional[int] = None,
                         timeout: Timeout = DEFAULT) -> pb.MemoryBreakdown:
        """get_memory_breakdown."""
        return self.get_memory_breakdown(by=by, phase=phase, top=top, timeout=timeout)

    def memory_top(self, top: int = 20, *, by: Optional[str] = None,
                   phase: Optional[str] = None, timeout: Timeout = DEFAULT):
        """The `top` largest MemoryBreakdownRows by module (or by="op" /
        "category"), largest peak first: memprofctl memory top's rows."""
        return self._then(self.get_memory_breakdown(by=by, phase=phase, top=top,
                                                    timeout=timeout), lambda b: list(b.rows))

    def memory_diff(self, step_a: int, step_b: int, *, top: Optional[int] = None,
                    timeout: Timeout = DEFAULT) -> pb.MemoryDiff:
        """diff_memory: what grew between two of the last 16 finished steps."""
        return self.diff_memory(step_a=step_a, step_b=step_b, top=top, timeout=timeout)
