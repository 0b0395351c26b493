"""Two Trains naming one large token file at once: prints figures, is not a test.

Writes a token file of --gib GiB (uint16 ids below the tiny preset's
vocabulary) under a fresh data root, starts memprofd on it, and sends two
Train requests naming the file at the same moment while a probe thread calls
GetStatus every 5 ms. Prints how long each Train call took to answer, the
probe's max and p99 latency and its failures, the daemon's RSS before and at
its peak (VmHWM), and what each operation ended with (the second is ABORTED:
one training at a time). The reading happens in the operation, on the
daemon's owner thread, through a read-only mapping.

Run with the venv's Python from the repository root after `make build`:
    /opt/memprofd/venv/bin/python bench/big_data_file.py [--gib 1]
"""

import argparse
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
os.environ.setdefault("MEMPROFD_BUILD_DIR", os.path.join(HERE, "..", "build"))
import grpc  # noqa: E402
import harness  # noqa: E402
from harness import Daemon, pb, wait_done  # noqa: E402


def status_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=1.0)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="memprofd-bigdata-")
    path = os.path.join(root, "tokens.bin")
    size = int(args.gib * (1 << 30)) // 2 * 2
    chunk = bytes(b for i in range(256) for b in (i, 0)) * 2048  # uint16 ids 0..255: 1 MiB
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)
    d = Daemon("--data_root=" + root)
    try:
        rss_before = status_kib(d.proc.pid, "VmRSS")
        latencies, failures, stop = [], [0], threading.Event()

        def probe():
            while not stop.is_set():
                t = time.time()
                try:
                    d.call("GetStatus", pb.GetStatusRequest(), timeout=30)
                    latencies.append(time.time() - t)
                except grpc.RpcError:
                    failures[0] += 1
                time.sleep(0.005)

        prober = threading.Thread(target=probe)
        prober.start()
        answers, results = [None, None], [None, None]

        def train(i):
            t = time.time()
            try:
                results[i] = d.call("Train", pb.TrainRequest(
                    steps=2, batch_size=2, seq_len=64,
                    data=pb.DataSource(token_file=pb.TokenFile(path=path, bytes_per_token=2))),
                    timeout=10)
            except grpc.RpcError as e:
                results[i] = e
            answers[i] = time.time() - t

        callers = [threading.Thread(target=train, args=(i,)) for i in range(2)]
        for c in callers:
            c.start()
        for c in callers:
            c.join()
        outcome = []
        for r in results:
            if isinstance(r, grpc.RpcError):
                outcome.append(r.code().name)
            else:
                op = wait_done(d, r.id, timeout=600)
                outcome.append(pb.OperationState.Name(op.state) +
                               (" " + op.error.message[:80] if op.error.message else ""))
        time.sleep(0.5)
        stop.set()
        prober.join()
        peak = status_kib(d.proc.pid, "VmHWM")
        lat = sorted(latencies)
        p99 = lat[int(0.99 * (len(lat) - 1))] if lat else float("nan")
        print("token file: %.2f GiB (%d bytes), %s" % (size / (1 << 30), size, path))
        print("Train calls answered in %.3f s and %.3f s: %s" % (answers[0], answers[1], outcome))
        print("GetStatus every 5 ms meanwhile: %d answers, max %.1f ms, p99 %.1f ms, %d failed"
              % (len(lat), 1000 * lat[-1], 1000 * p99, failures[0]))
        print("daemon RSS: %.0f MiB before, peak (VmHWM) %.0f MiB"
              % (rss_before / 1024, peak / 1024))
    finally:
        d.stop()
        d.close()
        os.remove(path)
        os.rmdir(root)


if __name__ == "__main__":
    main()
