#!/usr/bin/env python3
"""Pre-flight check before a training: does the intended training fit a
memory budget on the model the daemon holds? Exits 0 when it does, 1 when it
does not (or the daemon says no), 2 for bad arguments.

    preflight.py 127.0.0.1:50051 --budget 80GB --batch-size 8 --seq-len 2048

It asks the daemon's memory planner (PlanMemory) for the peak of one step
of that training, before anything runs, and compares it with the budget:
the plan's verdict, its peak and what dominates it are printed. The last
step's measured peak (GetMemoryStats), when the daemon has trained, is
printed beside it.
"""

import argparse
import re
import sys
from typing import List, Optional

import memprofd_client as mc
from memprofd_client import pb

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str) -> int:
    """'80GB' (decimal), '16GiB' (binary) or a plain number of bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError("not a size: %r (e.g. 80GB, 16GiB, 1000000)" % text)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def human(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= size:
            return "%.2f %s" % (n / size, unit)
    return "%d B" % n


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("addr", help="the daemon's gRPC address, host:port")
    p.add_argument("--budget", type=parse_bytes, required=True,
                   help="device memory the training may use (80GB, 16GiB, bytes)")
    p.add_argument("--batch-size", type=int, help="the training's batch (daemon's default)")
    p.add_argument("--seq-len", type=int, help="the training's sequence length")
    p.add_argument("--token_file", help="file whose first line is the bearer token "
                   "(else $MEMPROFD_TOKEN)")
    p.add_argument("--tls_ca", help="PEM root certificates: use TLS")
    args = p.parse_args(argv)

    with mc.Client(args.addr, token_file=args.token_file, tls_ca=args.tls_ca) as client:
        model = client.describe_model()
        stats = client.memory()
        train = pb.TrainRequest(batch_size=args.batch_size, seq_len=args.seq_len)
        plan = client.plan_memory(train=train, capacity_bytes=args.budget).wait().plan
    print("model:            %s (%s parameters) on %s" % (
        model.source, f"{model.num_parameters:,}", model.device))
    print("planned peak:     %s (model states %s)" % (human(plan.peak_allocated_bytes),
                                                     human(plan.model_state_bytes)))
    peaks = [p.peak_bytes for p in stats.last_step_phase_peaks]
    if peaks:
        print("last step's peak: %s (measured)" % human(max(peaks)))
    print("budget:           %s" % human(args.budget))
    if not plan.fits:
        print("refused: the step is %s short (its peak, in %s, is %s)"
              % (human(-plan.headroom_bytes), plan.peak_phase, human(plan.peak_allocated_bytes)))
        return 1
    print("fits: %s to spare" % human(plan.headroom_bytes))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except mc.MemprofdError as e:
        print("preflight: %s" % e, file=sys.stderr)
        sys.exit(1)
