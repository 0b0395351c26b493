"""The GPU run kit's NCCL part: data parallel on two GPUs of one host.
(With --cpu, the kit's dry run: the same on the CPU over Gloo.)

With fewer than two CUDA devices it says so and exits 0 (the part is
skipped, not failed). With two or more, for each sharding level in
--shardings it starts two real memprofd ranks (RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_PORT, --device=cuda: each rank takes its LOCAL_RANK's
GPU, NCCL between them), trains --steps steps of batch --batch_size per rank
through rank 0 with the real memprofctl, and checks:
  - every step's global loss equals one process's on cuda:0 training the
    global batch (2 x batch_size) within 1e-4 relative (NCCL sums in another
    order than one GPU's reductions; float32);
  - the sharded levels' losses equal the unsharded ranks' within 1e-5;
  - the ranks' step peaks (rank 0's reports carry its own) fall with the level;
  - with full sharding, the weights snapshot taken at a step boundary mid-run
    held at most the largest tensor gathered at once (its manifest's
    peak_gathered_bytes, against the tensors its safetensors header lists).
Writes the figures to --out (JSON). Standard library and numpy only.

  drive_nccl.py --memprofd M --memprofctl C --work DIR --out nccl.json --gpus N
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np

from kit_checks import all_passed, check, checks

p = argparse.ArgumentParser()
p.add_argument("--memprofd", required=True)
p.add_argument("--memprofctl", required=True)
p.add_argument("--work", required=True)
p.add_argument("--out", required=True)
p.add_argument("--gpus", type=int, required=True)
p.add_argument("--preset", default="tiny")
p.add_argument("--shardings", default="none,optimizer,gradients,full")
p.add_argument("--steps", type=int, default=4)
p.add_argument("--batch_size", type=int, default=2)
p.add_argument("--seq_len", type=int, default=128)
p.add_argument("--cpu", action="store_true",
               help="the kit's dry run: the same runs on the CPU (Gloo), to check this script")
args = p.parse_args()

if args.gpus < 2 and not args.cpu:
    print("skipped: %d CUDA device(s) here; the NCCL part needs two" % args.gpus)
    json.dump({"skipped": "%d CUDA device(s)" % args.gpus}, open(args.out, "w"))
    sys.exit(0)

os.makedirs(args.work, exist_ok=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tag, world, device, extra):
    """`world` daemons (1: a single process) on fresh ports; returns
    (processes, rank 0's gRPC address)."""
    store = free_port()
    procs, port_files = [], []
    for rank in range(world):
        env = dict(os.environ)
        if world > 1:
            env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(store)})
        port_file = os.path.join(args.work, "%s-ports-%d.json" % (tag, rank))
        if os.path.exists(port_file):
            os.remove(port_file)
        log = open(os.path.join(args.work, "%s-rank%d.log" % (tag, rank)), "wb")
        procs.append(subprocess.Popen(
            [args.memprofd, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
             "--port_file=" + port_file, "--device=" + device, "--model=" + args.preset,
             "--model_seed=1", "--data_root=" + os.path.abspath(args.work),
             "--snapshot_root=" + os.path.join(args.work, tag + "-snapshots-%d" % rank)] + extra,
            stdout=log, stderr=subprocess.STDOUT, env=env))
        port_files.append(port_file)
    deadline = time.time() + 240
    while not os.path.exists(port_files[0]):
        if any(pr.poll() is not None for pr in procs) or time.time() > deadline:
            stop(procs)
            raise RuntimeError("%s: memprofd did not start; see %s/%s-rank*.log" % (tag, args.work, tag))
        time.sleep(0.1)
    time.sleep(0.1)
    return procs, "127.0.0.1:%d" % json.load(open(port_files[0]))["grpc_port"]


def stop(procs):
    for pr in procs:
        if pr.poll() is None:
            pr.terminate()
    for pr in procs:
        try:
            pr.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pr.kill()


def train(addr, batch, tokens_path):
    # `model` answers FAILED_PRECONDITION until the model is loaded.
    deadline = time.time() + 240
    while True:
        m = subprocess.run([args.memprofctl, "--addr=" + addr, "--json", "model"],
                           capture_output=True, text=True, timeout=60)
        if m.returncode == 0:
            break
        if time.time() > deadline:
            raise RuntimeError("no model at %s after 240 s" % addr)
        time.sleep(0.5)
    if not os.path.exists(tokens_path):  # windows of random ids over the model's vocabulary
        vocab = int(json.loads(m.stdout.splitlines()[0])["config"]["vocab_size"])
        np.random.RandomState(0).randint(0, vocab, size=64 * (args.seq_len + 1)).astype(
            "<u4").tofile(tokens_path)
    r = subprocess.run([args.memprofctl, "--addr=" + addr, "--json", "--timeout_ms=600000", "train",
                        "--steps", str(args.steps), "--batch_size", str(batch), "--seq_len",
                        str(args.seq_len), "--learning_rate", "1e-3", "--token_data", tokens_path,
                        "--bytes_per_token", "4", "--seed", "7"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("train: exit %d: %s" % (r.returncode, r.stderr.strip()))
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{") and '"step"' in l]


tokens_path = os.path.join(args.work, "nccl-tokens.bin")
if os.path.exists(tokens_path):
    os.remove(tokens_path)

results = {"gpus": args.gpus, "preset": args.preset, "runs": {}}
procs, addr = start("one", 1, "cpu" if args.cpu else "cuda:0", [])
try:
    one = train(addr, 2 * args.batch_size, tokens_path)
finally:
    stop(procs)
results["runs"]["one process"] = one
print("one process x batch %d: losses %s" % (2 * args.batch_size, [round(r["loss"], 6) for r in one]))

def largest_tensor_bytes(directory):
    """The largest tensor of a snapshot, from its safetensors headers."""
    largest = 0
    for name in os.listdir(directory):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for key, entry in header.items():
            if key != "__metadata__":
                largest = max(largest, entry["data_offsets"][1] - entry["data_offsets"][0])
    return largest


SNAPSHOT_STEP = 2  # a weights snapshot at this step boundary of the full run
for level in args.shardings.split(","):
    tag = "nccl-" + level
    extra = ["--sharding=" + level]
    if level == "full":
        extra += ["--snapshot_every_steps=%d" % SNAPSHOT_STEP, "--auto_snapshot_kind=weights"]
        for rank in range(2):  # an earlier run's snapshot would not be taken again
            shutil.rmtree(os.path.join(args.work, "%s-snapshots-%d" % (tag, rank)),
                          ignore_errors=True)
    try:
        procs, addr = start(tag, 2, "cpu" if args.cpu else "cuda", extra)
        try:
            reports = train(addr, args.batch_size, tokens_path)
        finally:
            stop(procs)
    except RuntimeError as e:
        check("2 ranks, sharding %s: trains" % level, False, e)
        continue
    results["runs"][level] = reports
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(reports, one))
    check("2 ranks, sharding %s: global loss = one process's" % level,
          len(reports) == len(one) and worst <= 1e-4, "worst relative gap %.2e" % worst)
    if level == "full":
        directory = os.path.join(args.work, tag + "-snapshots-0", "step-%d" % SNAPSHOT_STEP)
        try:
            manifest = json.load(open(os.path.join(directory, "memprofd_manifest.json")))
            gathered, largest = manifest["peak_gathered_bytes"], largest_tensor_bytes(directory)
            check("sharding full: a mid-run snapshot gathers one tensor at a time",
                  0 < gathered <= largest, "%d bytes gathered at most, largest tensor %d"
                  % (gathered, largest))
        except (OSError, KeyError, ValueError) as e:
            check("sharding full: a mid-run snapshot gathers one tensor at a time", False, e)
    peak = max(float(r["peak_allocated_bytes"]) for r in reports)
    print("  sharding %s: rank 0 peak %.1f MiB, step %.3f s" % (
        level, peak / 2**20, sorted(r["step_seconds"] for r in reports)[len(reports) // 2]))
    if level != "none" and "none" in results["runs"]:
        base = results["runs"]["none"]
        gap = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(reports, base))
        check("sharding %s: losses = unsharded ranks'" % level, gap <= 1e-5, "worst %.2e" % gap)
        base_peak = max(float(r["peak_allocated_bytes"]) for r in base)
        check("sharding %s: rank 0's peak below unsharded" % level, peak < base_peak,
              "%.1f vs %.1f MiB" % (peak / 2**20, base_peak / 2**20))

results["checks"] = checks
json.dump(results, open(args.out, "w"), indent=1)
sys.exit(0 if all_passed() else 1)
