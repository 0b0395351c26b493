"""Resumable checkpoints of a sharded data-parallel run, over the wire: two
real memprofd daemons as the ranks of one c10d run (Gloo on loopback) with
--sharding=optimizer, so that each rank holds AdamW's state of the
parameters it owns only, and again with --sharding=full, where each rank also
keeps only its own parameters between their uses (the periodic checkpoints,
written at step boundaries, then read the whole model, gathered on every rank
for them).

- Each periodic checkpoint holds every rank's optimizer file
  (optimizer-rank-0000R-of-00002.safetensors) and optimizer_sharding.json,
  written at the step boundary, and no optimizer.safetensors; its model part
  is the usual Hugging Face one.
- Both ranks SIGKILLed mid-run and restarted with --resume=latest each load
  the state of the parameters they own, and finish the run with the
  uninterrupted run's weights, bit for bit.
- One process resumes the same checkpoint, its state assembled whole."""

import json
import os
import subprocess
import tempfile
import time
import unittest

if not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import harness  # noqa: E402
from harness import Daemon, free_port, pb, wait_done  # noqa: E402

MICRO_DIR = harness.micro_model_dir()
RUN = dict(seq_len=32, seed=11, learning_rate=1e-2, weight_decay=0.0, max_grad_norm=0.0,
           batch_size=2)
RANK_FILES = ["optimizer-rank-%05d-of-00002.safetensors" % r for r in range(2)]


def start_ranks(root, level, *flags):
    """Two daemons joined as one sharded run on a fresh store port, rank 0
    first; each waits in its rendezvous until both have joined."""
    port = free_port()
    daemons = []
    for rank in range(2):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        daemons.append(Daemon("--model=" + MICRO_DIR, "--model_seed=%d" % rank,
                              "--collective_timeout_seconds=10", "--sharding=" + level,
                              "--snapshot_root=" + root, *flags, env=env, wait=False,
                              start_timeout=120))
    for d in daemons:
        d.wait_ready()
    return daemons


def close_all(daemons):
    for d in daemons:
        d.close()


def final_weights(d):
    from safetensors.torch import load_file
    op = wait_done(d, d.call("Snapshot", pb.SnapshotRequest(name="end")).id)
    assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.error.message
    return load_file(os.path.join(op.snapshot.directory, "model.safetensors"))


def bit_equal(a, b):
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and a[k].equal(b[k]) for k in a)


def daemon_has_sharding():
    """Whether this build's daemon takes --sharding."""
    out = subprocess.run([harness.MEMPROFD, "--helpfull"], capture_output=True, text=True)
    return "--sharding" in out.stdout + out.stderr


@unittest.skipUnless(daemon_has_sharding(), "this daemon has no --sharding flag")
class ShardedResumeTest(unittest.TestCase):
    # Long enough that the ranks are killed mid-run however fast the steps
    # are; a checkpoint every 5 steps.
    STEPS = 40
    FLAGS = ["--snapshot_every_steps=5", "--resume=latest"]
    LEVEL = "optimizer"

    def test_killed_sharded_run_resumes_bit_for_bit(self):
        tmp = tempfile.TemporaryDirectory(prefix="memprofd-dist-resume-")
        try:
            whole_root = os.path.join(tmp.name, "whole")
            ranks = start_ranks(whole_root, self.LEVEL, *self.FLAGS)
            try:
                op = wait_done(ranks[0], ranks[0].call(
                    "Train", pb.TrainRequest(steps=self.STEPS, **RUN)).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
                uninterrupted = final_weights(ranks[0])
            finally:
                close_all(ranks)
            # The last step's checkpoint runs after the run, while the ranks
            # are idle: the other rank is asked by a command, not at a boundary.
            last = os.path.join(whole_root, "step-%d" % self.STEPS)
            for f in RANK_FILES + ["optimizer_sharding.json"]:
                self.assertTrue(os.path.exists(os.path.join(last, f)), f)

            root = os.path.join(tmp.name, "killed")
            ranks = start_ranks(root, self.LEVEL, *self.FLAGS)
            try:
                op = ranks[0].call("Train", pb.TrainRequest(steps=self.STEPS, **RUN))
                stream = ranks[0].stub.StreamStepReports(
                    pb.StreamStepReportsRequest(operation_id=op.id), timeout=300)
                for r in stream:
                    if r.global_step >= 12:
                        for d in ranks:
                            d.proc.kill()
                        stream.cancel()
                        break
                for d in ranks:
                    d.proc.wait(timeout=30)
            finally:
                close_all(ranks)
            published = sorted(n for n in os.listdir(root) if n.startswith("step-"))
            self.assertTrue(published)
            latest = max(int(n.split("-")[1]) for n in published)
            self.assertLess(latest, self.STEPS)
            for name in published:
                files = set(os.listdir(os.path.join(root, name)))
                for f in RANK_FILES + ["optimizer_sharding.json", "trainer_state.json",
                                       "model.safetensors"]:
                    self.assertIn(f, files, name)
                self.assertNotIn("optimizer.safetensors", files, name)
                # Each rank's file equals the uninterrupted run's, byte for byte.
                for f in RANK_FILES:
                    with open(os.path.join(root, name, f), "rb") as a, \
                            open(os.path.join(whole_root, name, f), "rb") as b:
                        self.assertEqual(a.read(), b.read(), (name, f))
            with open(os.path.join(root, "step-%d" % latest, "optimizer_sharding.json")) as f:
                description = json.load(f)
            self.assertEqual(description["world_size"], 2)
            self.assertEqual(description["level"], self.LEVEL)
            self.assertEqual(description["files"], RANK_FILES)
            # Each rank's file holds its flat piece of every parameter: the
            # description names each parameter with its shape.
            self.assertEqual(description["layout"], "flat")
            self.assertTrue(description["parameters"])
            for entry in description["parameters"]:
                self.assertIsInstance(entry["parameter"], str)
                self.assertTrue(all(isinstance(d, int) for d in entry["shape"]))

            # Both restarted, as a launcher would: each resumes its own part.
            ranks = start_ranks(root, self.LEVEL, *self.FLAGS)
            try:
                for d in ranks:
                    self.assertEqual(d.call("GetStatus", pb.GetStatusRequest())
                                     .model.steps_trained, latest)
                op = wait_done(ranks[0], ranks[0].call("Train", pb.TrainRequest(resume=True)).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
                deadline = time.time() + 30
                while (ranks[1].call("GetStatus", pb.GetStatusRequest()).model.steps_trained
                       < self.STEPS and time.time() < deadline):
                    time.sleep(0.05)
                resumed = final_weights(ranks[0])
            finally:
                close_all(ranks)
            print("\n%s-sharded run resumed from step %d of %d" % (self.LEVEL, latest,
                                                                  self.STEPS))
            self.assertTrue(bit_equal(resumed, uninterrupted))

            # One process resumes the same checkpoint with the whole state,
            # assembled from both rank files, and trains on.
            single = Daemon("--model=" + MICRO_DIR, "--snapshot_root=" + root,
                            "--resume=step-%d" % latest)
            try:
                self.assertEqual(single.call("GetStatus", pb.GetStatusRequest())
                                 .model.steps_trained, latest)
                op = wait_done(single, single.call("Train", pb.TrainRequest(
                    resume=True, steps=1)).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            finally:
                single.close()
        finally:
            tmp.cleanup()


class FullyShardedResumeTest(ShardedResumeTest):
    LEVEL = "full"


if __name__ == "__main__":
    unittest.main()
