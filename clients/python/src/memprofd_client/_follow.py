"""What a training handle needs to follow its run through disconnections,
drains and daemon restarts, apart from the I/O (which Client and
AsyncClient do their own way).

The invariant reports() keeps: every StepReport it yields has a global_step
greater than the one before, so a report is never repeated. After a
disconnection it reopens the stream at the next step of the same operation;
after a restart (the daemon forgot the operation, or its id now names
another one) it follows the first TRAIN operation created after its own (the
`Train(resume=True)` that continues the run from its last checkpoint) and
drops the reports that run repeats. Steps that ran after the checkpoint the
daemon restarted from but whose reports never reached the client before it
died are gone with that daemon: they are listed in `lost_global_steps`.
"""

from __future__ import annotations

import time
import warnings
from typing import Iterable, List, Optional

from . import pb
from .errors import MemprofdError, NotFound, error_for

DRAINING = "DRAINING"
"""OperationError.reason of an operation a shutting-down daemon stopped."""

# How long a handle waits for a daemon that went away (UNAVAILABLE) and for
# the resumed training after a restart, by default.
DEFAULT_RECONNECT_TIMEOUT = 120.0
RETRY_INTERVAL = 0.25


class ReportCursor:
    """Where a step-report stream stands: the next step to ask the current
    operation for, and the last global step yielded."""

    def __init__(self, from_step: int = 1) -> None:
        self.next_step = max(1, from_step)
        self.last_global: Optional[int] = None
        self.lost_global_steps: List[int] = []

    def accept(self, report: pb.StepReport) -> bool:
        """True when `report` is new (it is then the last one)."""
        self.next_step = max(self.next_step, report.step + 1)
        if self.last_global is not None and report.global_step <= self.last_global:
            return False
        if self.last_global is not None and report.global_step > self.last_global + 1:
            lost = list(range(self.last_global + 1, report.global_step))
            self.lost_global_steps.extend(lost)
            warnings.warn("memprofd_client: the reports of global steps %d..%d were lost with "
                          "the daemon that ran them" % (lost[0], lost[-1]), RuntimeWarning)
        self.last_global = report.global_step
        return True

    def switched(self) -> None:
        """The run goes on in another operation: read it from its first step."""
        self.next_step = 1


def same_operation(a: pb.Operation, b: pb.Operation) -> bool:
    """True when `b` (fetched by a's id) is still the operation `a` was: ids
    are unique only for one daemon's lifetime."""
    return a.id == b.id and a.kind == b.kind and a.create_time_us == b.create_time_us


def drained(op: pb.Operation) -> bool:
    """True for a training the daemon stopped because it was shutting down:
    it goes on in the Train(resume=True) of the daemon that comes back."""
    return (op.done and op.kind == pb.OPERATION_KIND_TRAIN and
            op.state == pb.OPERATION_STATE_FAILED and op.error.reason == DRAINING)


def lost_error(lost: pb.Operation, addr: str, waited: Optional[float]) -> MemprofdError:
    """What a training handle raises when no run resumed `lost` in time: the
    drain's own error (Aborted, naming the checkpoint) or NotFound."""
    why = ("and no training resumed it (Train with resume) within %ss" % waited)
    if drained(lost):
        return error_for(lost.error.code, "%s; %s" % (lost.error.message, why), lost)
    return NotFound("training %s was lost when the daemon at %s restarted, %s"
                    % (lost.id, addr, why), operation=lost)


def successor(ours: pb.Operation, operations: Iterable[pb.Operation]) -> Optional[pb.Operation]:
    """The first TRAIN operation created after `ours` (the resumed run), or None."""
    later = [op for op in operations
             if op.kind == pb.OPERATION_KIND_TRAIN and op.create_time_us > ours.create_time_us
             and not same_operation(ours, op)]
    return min(later, key=lambda op: (op.create_time_us, op.id)) if later else None


class Deadline:
    """A point in time (None: never) shared by the retries of one reconnection."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.at = None if seconds is None else time.monotonic() + seconds

    def left(self, cap: float) -> float:
        """Seconds left, at most `cap`."""
        if self.at is None:
            return cap
        return max(0.0, min(cap, self.at - time.monotonic()))

    def passed(self) -> bool:
        """True once the point is reached."""
        return self.at is not None and time.monotonic() >= self.at
