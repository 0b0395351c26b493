#!/usr/bin/env python3
"""Drives one training on a memprofd daemon the way an orchestration service
would: starts it, takes a checkpoint every N steps and on SIGTERM, and stops
it (cancels) when the evaluation loss stops improving.

    orchestrator.py 127.0.0.1:50051 --steps 1000 --snapshot-every 100 \
        --eval-every 20 --patience 3 --min-delta 0.01

The daemon evaluates on held-out tokens every --eval-every steps (TrainRequest's
eval_every_steps / eval_data: the embedded corpus here), and those steps'
reports carry `eval`. After --patience evaluations in a row whose loss is not
at least --min-delta below the best so far, the training is cancelled.
Checkpoints (SNAPSHOT_KIND_CHECKPOINT, so that Train with resume can go on
from them) are named PREFIX-step-N and, on SIGTERM, PREFIX-sigterm-step-N;
the daemon needs --snapshot_root.

Exit status: 0 when the training ended (all steps, early stop or SIGTERM),
1 when it or a checkpoint failed, 2 for bad arguments.
"""

import argparse
import signal
import sys
from types import FrameType
from typing import List, Optional

import memprofd_client as mc
from memprofd_client import pb


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("addr", help="the daemon's gRPC address, host:port")
    p.add_argument("--token_file", help="file whose first line is the bearer token "
                   "(else $MEMPROFD_TOKEN)")
    p.add_argument("--tls_ca", help="PEM root certificates: use TLS")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--snapshot-every", type=int, default=100, help="0: only on SIGTERM")
    p.add_argument("--snapshot-prefix", default="run")
    p.add_argument("--eval-every", type=int, default=20, help="0: never stop early")
    p.add_argument("--eval-max-batches", type=int, default=4)
    p.add_argument("--patience", type=int, default=3)
    p.add_argument("--min-delta", type=float, default=0.0)
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


class EarlyStop:
    """Counts evaluations that did not improve the best loss by min_delta."""

    def __init__(self, patience: int, min_delta: float) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best: Optional[float] = None
        self.bad = 0

    def update(self, loss: float) -> bool:
        """True when training should stop."""
        if self.best is None or loss < self.best - self.min_delta:
            self.best, self.bad = loss, 0
        else:
            self.bad += 1
        return self.bad >= self.patience


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    terminated: List[int] = []

    def on_sigterm(signum: int, frame: Optional[FrameType]) -> None:
        terminated.append(signum)

    signal.signal(signal.SIGTERM, on_sigterm)

    client = mc.Client(args.addr, token_file=args.token_file, tls_ca=args.tls_ca)
    evaluating = args.eval_every > 0
    run = client.train(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                       learning_rate=args.learning_rate,
                       eval_every_steps=args.eval_every if evaluating else None,
                       eval_data=mc.embedded_corpus() if evaluating else None,
                       eval_max_batches=args.eval_max_batches if evaluating else None)
    print("training %s: %d steps" % (run.id, args.steps), flush=True)
    stopper = EarlyStop(args.patience, args.min_delta)
    checkpoints: List[mc.OperationHandle] = []
    stopping: Optional[str] = None

    def checkpoint(name: str) -> None:
        handle = client.snapshot(name, kind=pb.SNAPSHOT_KIND_CHECKPOINT)
        checkpoints.append(handle)
        print("checkpoint %s (%s)" % (name, handle.id), flush=True)

    for report in run.reports():
        step = report.global_step
        if args.log_every and report.step % args.log_every == 0:
            print("step %d loss %.4f %.0f tokens/s" % (step, report.loss, report.tokens_per_second),
                  flush=True)
        if stopping:
            continue  # steps that ran before the cancel took effect
        if args.snapshot_every and report.step % args.snapshot_every == 0:
            checkpoint("%s-step-%d" % (args.snapshot_prefix, step))
        if report.HasField("eval"):
            print("eval at step %d: loss %.4f" % (step, report.eval.loss), flush=True)
            if stopper.update(report.eval.loss):
                stopping = ("evaluation loss stopped improving (best %.4f, %d evaluations "
                            "without a gain of %g)" % (stopper.best or 0.0, stopper.bad,
                                                      args.min_delta))
        if terminated and not stopping:
            stopping = "SIGTERM"
            checkpoint("%s-sigterm-step-%d" % (args.snapshot_prefix, step))
        if stopping:
            print("stopping: " + stopping, flush=True)
            try:
                run.cancel()
            except mc.FailedPrecondition:
                pass  # it finished meanwhile

    final = run.wait(check=False)
    failed = final.state == pb.OPERATION_STATE_FAILED
    print("training %s %s after %d steps%s" % (
        final.id, pb.OperationState.Name(final.state).replace("OPERATION_STATE_", ""),
        final.train.steps_completed, ": " + final.error.message if failed else ""), flush=True)
    for handle in checkpoints:
        try:
            manifest = handle.wait().snapshot
            print("checkpoint %s: %s (%d bytes)" % (manifest.name, manifest.directory,
                                                    manifest.bytes_written), flush=True)
        except mc.MemprofdError as e:
            print("checkpoint %s failed: %s" % (handle.id, e), file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except mc.MemprofdError as e:
        print("orchestrator: %s" % e, file=sys.stderr)
        sys.exit(1)
