"""Weights snapshot against checkpoint of the same trained model, over the
wire: bytes written, the optimizer state's share, seconds, throughput and the
writer's peak extra host memory, blocking and async, for the tiny and small
presets. Prints figures; never fails on timings.

  /opt/memprofd/venv/bin/python bench/checkpoint_bench.py [BUILD_DIR]
"""

import os
import shutil
import sys
import tempfile

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
os.environ.setdefault("MEMPROFD_BUILD_DIR", BUILD)
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))

from harness import Daemon, pb, wait_done  # noqa: E402

print("OMP_NUM_THREADS=%s, staging buffer 4 MiB" % os.environ["OMP_NUM_THREADS"])
for preset in ("tiny", "small"):
    root = tempfile.mkdtemp(prefix="memprofd-ckbench-")
    d = Daemon("--model=" + preset, "--snapshot_root=" + root, "--snapshot_staging_bytes=4194304")
    try:
        wait_done(d, d.call("Train", pb.TrainRequest(steps=1, batch_size=1, seq_len=16)).id)
        for kind in ("WEIGHTS", "CHECKPOINT"):
            for mode in ("BLOCKING", "ASYNC"):
                req = pb.SnapshotRequest(name=kind + "-" + mode,
                                         kind=getattr(pb, "SNAPSHOT_KIND_" + kind),
                                         mode=getattr(pb, "SNAPSHOT_MODE_" + mode))
                m = wait_done(d, d.call("Snapshot", req).id).snapshot
                print("%-6s %-10s %-8s files %d  written %7.1f MB  optimizer %6.1f MB  %.2f s"
                      "  %6.1f MB/s  peak extra host %6.1f MB"
                      % (preset, kind.lower(), mode.lower(), len(m.files), m.bytes_written / 1e6,
                         m.optimizer_bytes / 1e6, m.duration_seconds,
                         m.throughput_bytes_per_second / 1e6, m.peak_extra_host_bytes / 1e6))
    finally:
        d.close()
        shutil.rmtree(root, ignore_errors=True)
