"""The GPU run kit's device-limit part: memprofd's --device_memory_limit on the
device (on CUDA the caching allocator's memory fraction; in the dry run the
counting CPU allocator's cap).

Starts memprofd on --device with the tiny preset and a limit of --limit_mib,
with admission off (--refuse_unfit_steps=false) so that a step too big for
the limit runs and fails for real, then with the real memprofctl:
  - a step far beyond the limit fails out of memory (exit 4), and the OOM
    report captured the failed request with no more than the limit in use
    and no more than the limit as the device's total;
  - a small step trains after it, and its peak stays within the limit;
  - the daemon stops cleanly on SIGTERM.
Writes the checks to --out (JSON). Standard library only.

  drive_limit.py --memprofd M --memprofctl C --device cuda:0 --work DIR --out limit.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

import kit_daemon
from kit_checks import all_passed, check, checks

p = argparse.ArgumentParser()
p.add_argument("--memprofd", required=True)
p.add_argument("--memprofctl", required=True)
p.add_argument("--device", required=True)  # cuda:0 or cpu
p.add_argument("--work", required=True)
p.add_argument("--out", required=True)
p.add_argument("--limit_mib", type=int, default=256)
args = p.parse_args()
os.makedirs(args.work, exist_ok=True)
limit = args.limit_mib << 20

daemon, addr, ports = kit_daemon.start(
    args.memprofd, args.work,
    ["--device=" + args.device, "--model=tiny", "--device_memory_limit=%d" % limit,
     "--refuse_unfit_steps=false", "--report_dir=" + os.path.join(args.work, "reports")],
    timeout=120)
deadline = time.time() + 120


def ctl(*cmd):
    return subprocess.run([args.memprofctl, "--addr=" + addr, "--json", "--timeout_ms=600000"] + list(cmd),
                          capture_output=True, text=True, timeout=600)


def num(v):
    """proto3 JSON writes int64 as strings."""
    return int(v) if isinstance(v, str) else v


def train(batch, seq):
    return ctl("train", "--steps", "1", "--batch_size", str(batch), "--seq_len", str(seq))


try:
    while ctl("model").returncode != 0:
        if daemon.poll() is not None or time.time() > deadline:
            sys.exit("memprofd has no model; see %s/memprofd.log" % args.work)
        time.sleep(0.5)
    # tiny at 64 x 512 tokens: gigabytes of activations, far beyond the limit.
    r = train(64, 512)
    check("limit: a step beyond %d MiB fails out of memory" % args.limit_mib,
          r.returncode == 4 and "out of memory" in r.stderr,
          "exit %d %s" % (r.returncode, r.stderr.strip()[-300:]))
    r = ctl("memory", "oom")
    rep = json.loads(r.stdout.splitlines()[0]) if r.returncode == 0 and r.stdout.strip() else {}
    check("limit: the OOM report holds no more than the limit in use",
          rep.get("captured") and 0 < num(rep.get("allocated_bytes", 0)) <= limit and
          num(rep.get("requested_bytes", 0)) > 0 and
          0 < num(rep.get("total_bytes", limit + 1)) <= limit,
          "request %s B, allocated %s B, free %s of %s B (limit %d)" % (
              rep.get("requested_bytes"), rep.get("allocated_bytes"), rep.get("free_bytes"),
              rep.get("total_bytes"), limit))
    r = train(1, 64)
    reports = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    peaks = [num(x.get("peak_allocated_bytes", 0)) for x in reports]
    check("limit: a small step trains after it, within the limit",
          r.returncode == 0 and peaks and 0 < max(peaks) <= limit,
          "exit %d, peak %s B %s" % (r.returncode, peaks, r.stderr.strip()[-200:]))
finally:
    rc = kit_daemon.stop(daemon)
check("limit: the daemon stops cleanly on SIGTERM", rc == 0, "exit %s" % rc)
json.dump({"limit_bytes": limit, "checks": checks}, open(args.out, "w"), indent=1)
sys.exit(0 if all_passed() else 1)
