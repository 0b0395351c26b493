"""Scheduler wake-up latency beside a training daemon (issue 15): prints
figures, is not a test.

How late a thread that sleeps 1 ms at a time wakes up: on the idle machine,
then while a memprofd trains the `tiny` preset (batch 4 x 64) on every core,
at each --nice value asked for (negative ones need root). Every RPC passes
several such wake-ups (the client's thread, gRPC's poller and callback
threads), so their tails compound into the RPC's: bench/load.py's GetStatus
p99 is read against these.

  /opt/memprofd/venv/bin/python bench/wake_latency.py [--seconds 30]
      [--bulk_nice N] [--nice 0,-10] [--build build]
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

from load import percentile, start_training  # noqa: E402  (bench/load.py, beside this file)


def oversleep(seconds, nice):
    """Sleeps of 1 ms for `seconds` in a child process at `nice`; prints their
    lateness."""
    pid = os.fork()
    if pid == 0:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        late = []
        end = time.time() + seconds
        while time.time() < end:
            t = time.perf_counter()
            time.sleep(0.001)
            late.append(time.perf_counter() - t - 0.001)
        print("  nice %+3d: %6d sleeps, late by p50 %.3f  p99 %.3f  p99.9 %.3f  max %.3f ms"
              % (nice, len(late), 1e3 * percentile(late, 0.5), 1e3 * percentile(late, 0.99),
                 1e3 * percentile(late, 0.999), 1e3 * max(late)), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--bulk_nice", type=int, default=0)
    ap.add_argument("--nice", default="0,-10",
                    help="comma-separated nice values of the sleeping thread")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    args = ap.parse_args()
    nices = [int(n) for n in args.nice.split(",")]
    os.environ["MEMPROFD_BUILD_DIR"] = os.path.abspath(args.build)
    import harness
    from harness import pb

    print("wake-up lateness of 1 ms sleeps; %d cores" % os.cpu_count())
    print("idle machine:")
    for n in nices:
        oversleep(args.seconds, n)
    d = harness.Daemon("--bulk_nice=%d" % args.bulk_nice)
    try:
        op = start_training(d, pb, 4, 64)
        print("memprofd training tiny 4 x 64 (--bulk_nice=%d):" % args.bulk_nice)
        for n in nices:
            oversleep(args.seconds, n)
        d.call("CancelOperation", pb.CancelOperationRequest(id=op.id))
    finally:
        d.close()


if __name__ == "__main__":
    main()
