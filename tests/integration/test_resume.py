"""Checkpoints that resume training exactly, over the wire, with real
daemons killed by SIGKILL.

The exactness test (issue 13's "done when"): a model smaller than the `tiny`
preset trained 40 steps without interruption; the same run on a daemon taking a checkpoint
every 10 steps, SIGKILLed at a random step after 20, restarted with
--resume=latest and told only `resume`: every step after the checkpoint it
resumed from has the uninterrupted run's loss, bit for bit. Plain, and with
activation offloading (to disk) and gradient checkpointing on. Every daemon
here runs on the CPU with the same intra-op thread count (OMP_NUM_THREADS,
1 unless the environment sets it): the losses are bit-identical only for the
same machine and thread count, which fix how reductions split.

The checkpoint directory also loads into the real transformers unchanged,
its optimizer file reads with the real safetensors, and bad input (a
weights-only snapshot, optimizer state of another model shape, corrupt
files) is refused with the status the API documents, leaving the model as
it was."""

import filecmp
import json
import os
import random
import shutil
import sys
import tempfile
import time
import unittest

# One intra-op thread: exactness holds for any fixed count, and with one the
# 40 micro steps take 0.4 s where two threads fighting other jobs for two
# busy cores took 15 s (OpenMP's barriers spin).
if not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import grpc  # noqa: E402

import harness  # noqa: E402
from harness import Daemon, pb, wait_done  # noqa: E402

# The micro model (harness.MICRO): 40 steps and four checkpoints take a
# second or two, and the test stays well under a minute even on busy cores.
MICRO_DIR = harness.micro_model_dir()
MICRO_FLAG = "--model=" + MICRO_DIR
# The micro model as Qwen3 (q/k norms, attention biases, a window of 8 keys
# on its second layer) and as a Llama 3 (llama3 rotary scaling from 16
# original positions, half the sequence).
QWEN3_FLAG = "--model=" + harness.micro_model_dir(
    "micro-qwen3", architectures=["Qwen3ForCausalLM"], model_type="qwen3", attention_bias=True,
    use_sliding_window=True, sliding_window=8, max_window_layers=1)
LLAMA3_FLAG = "--model=" + harness.micro_model_dir(
    "micro-llama3", rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 16})

RUN = dict(steps=40, batch_size=2, seq_len=32, seed=7, learning_rate=3e-3, weight_decay=0.1,
           max_grad_norm=1.0)


def losses_of(d, op_id, kill_at=None):
    """{global_step: loss} from the operation's step stream. With `kill_at`,
    SIGKILLs the daemon as soon as the report of that global step arrives."""
    out = {}
    stream = d.stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=op_id),
                                      timeout=300)
    for r in stream:
        out[r.global_step] = r
        if kill_at is not None and r.global_step >= kill_at:
            d.proc.kill()  # SIGKILL: no drain, no shutdown snapshot
            d.proc.wait()
            stream.cancel()
            break
    return out


class ExactResumeTest(unittest.TestCase):

    def reference(self, flags, request, model):
        d = Daemon(model, *flags)
        try:
            op = d.call("Train", pb.TrainRequest(**request))
            steps = losses_of(d, op.id)
            self.assertEqual(wait_done(d, op.id).state, pb.OPERATION_STATE_SUCCEEDED)
        finally:
            d.close()
        self.assertEqual(sorted(steps), list(range(1, 41)))
        return steps

    def kill_and_resume(self, flags, request, model, resume_model="--model="):
        root = self.root = tempfile.mkdtemp(prefix="memprofd-resume-")
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        # At most 32: the daemon would need 8 more steps and the step-40
        # checkpoint before the kill lands to leave nothing to resume.
        kill_at = random.randint(21, 32)
        d = Daemon(model, "--snapshot_root=" + root,
                   "--snapshot_every_steps=10", *flags)
        try:
            op = d.call("Train", pb.TrainRequest(**request))
            before = losses_of(d, op.id, kill_at=kill_at)
            self.assertEqual(d.proc.returncode, -9)
        finally:
            d.close()
        self.assertGreaterEqual(max(before), kill_at)
        # A fresh daemon, told only where the checkpoints are (no --model: the
        # checkpoint holds its config.json; a LoRA run's names the base).
        d = Daemon(resume_model, "--snapshot_root=" + root, "--snapshot_every_steps=10",
                   "--resume=latest", *flags)
        try:
            checkpoints = [s for s in d.call("ListSnapshots", pb.ListSnapshotsRequest()).snapshots
                           if s.kind == pb.SNAPSHOT_KIND_CHECKPOINT]
            resumed_from = max(s.global_step for s in checkpoints)
            self.assertIn(resumed_from, (20, 30), [s.name for s in checkpoints])
            self.assertLessEqual(resumed_from, max(before))
            status = d.call("GetStatus", pb.GetStatusRequest())
            self.assertEqual(status.model.steps_trained, resumed_from, d.output())
            self.assertIn("resumed from checkpoint", d.output())
            op = d.call("Train", pb.TrainRequest(resume=True))
            after = losses_of(d, op.id)
            final = wait_done(d, op.id)
            self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
            self.assertEqual(final.train.steps_completed, 40 - resumed_from)
            # The run's own checkpoints go on where they stopped (step-40 is
            # written at the boundary after the last step, once the operation
            # is done).
            names = set()
            for _ in range(200):
                names = {s.name for s in
                         d.call("ListSnapshots", pb.ListSnapshotsRequest()).snapshots}
                if "step-40" in names:
                    break
                time.sleep(0.05)
            self.assertIn("step-40", names)
        finally:
            d.close()
        self.assertEqual(sorted(after), list(range(resumed_from + 1, 41)))
        return kill_at, resumed_from, before, after

    def check(self, flags, request, model=MICRO_FLAG, resume_model="--model="):
        reference = self.reference(flags, request, model)
        kill_at, resumed_from, before, after = self.kill_and_resume(flags, request, model,
                                                                    resume_model)
        print("\n  SIGKILL on the report of step %d (the stream had seen %d), resumed from "
              "step %d, compared steps %d..40" % (kill_at, max(before), resumed_from,
                                                  resumed_from + 1), file=sys.stderr)
        # Before the kill: the same run, so the same losses.
        for step, r in before.items():
            self.assertEqual(r.loss, reference[step].loss, "step %d before the kill" % step)
        for step, r in after.items():
            self.assertEqual(r.loss, reference[step].loss,
                             "step %d after resuming from step %d (killed at %d): %r != %r"
                             % (step, resumed_from, kill_at, r.loss, reference[step].loss))
        return after

    def test_killed_run_resumes_with_the_same_losses_bit_for_bit(self):
        self.check((), RUN)

    def test_same_with_offloading_and_gradient_checkpointing(self):
        after = self.check(("--offload",), dict(RUN, gradient_checkpointing=True))
        # The resumed run offloaded (the daemon's flag) and kept the
        # checkpointed run's gradient checkpointing: with it, only the layer
        # inputs are saved, far fewer tensors than without.
        self.assertTrue(all(r.offload.bytes_out > 0 for r in after.values()))

    def test_qwen3_and_a_llama3_scaled_llama_resume_bit_for_bit_with_offloading(self):
        for model in (QWEN3_FLAG, LLAMA3_FLAG):
            with self.subTest(model):
                after = self.check(("--offload",), RUN, model)
                self.assertTrue(all(r.offload.bytes_out > 0 for r in after.values()))


    def test_lora_run_resumes_from_its_adapter_checkpoints_bit_for_bit(self):
        # The daemon's checkpoints of a LoRA run hold the adapters as peft
        # saves them, their AdamW state and the training state, never the
        # frozen base: --model names it again on the restart.
        # With dropout: the masks are the step's own, so the resumed steps
        # draw the ones the uninterrupted run drew.
        after = self.check((), dict(RUN, lora_r=4, lora_alpha=8, lora_targets="all-linear",
                                    lora_dropout=0.1),
                           resume_model=MICRO_FLAG)
        self.assertEqual(len(after), 40 - min(after) + 1)
        checkpoint = os.path.join(self.root, "step-40")
        files = set(os.listdir(checkpoint))
        self.assertLessEqual({"adapter_config.json", "adapter_model.safetensors",
                              "optimizer.safetensors", "trainer_state.json"}, files)
        self.assertFalse([f for f in files if f.startswith("model")], files)
        import safetensors
        with safetensors.safe_open(os.path.join(checkpoint, "optimizer.safetensors"), "pt") as f:
            keys = list(f.keys())
        self.assertTrue(keys)
        self.assertFalse([k for k in keys if ".lora_" not in k], "state of frozen weights")
        # Without its base, or onto another (the micro model's weights drawn
        # from another seed), the checkpoint cannot start a daemon.
        with self.assertRaises(RuntimeError) as e:
            Daemon("--model=", "--snapshot_root=" + self.root, "--resume=latest").close()
        self.assertIn("without their base", str(e.exception))
        with self.assertRaises(RuntimeError) as e:
            Daemon(MICRO_FLAG, "--model_seed=99", "--snapshot_root=" + self.root,
                   "--resume=latest").close()
        self.assertIn("trained on another base", str(e.exception))


class AutoSnapshotKindTest(unittest.TestCase):
    """The daemon's own snapshots (periodic, on shutdown) are checkpoints by
    default, weights with --auto_snapshot_kind=weights."""

    def kinds(self, *flags):
        root = tempfile.mkdtemp(prefix="memprofd-auto-")
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        d = Daemon(MICRO_FLAG, "--snapshot_root=" + root, "--snapshot_every_steps=2",
                   "--snapshot_on_shutdown", *flags)
        try:
            wait_done(d, d.call("Train", pb.TrainRequest(steps=2, batch_size=1, seq_len=16)).id)
            for _ in range(200):
                if os.path.exists(os.path.join(root, "step-2")):
                    break
                time.sleep(0.05)
            code, _ = d.stop()
            self.assertEqual(code, 0, d.output())
        finally:
            d.close()
        out = {}
        for name in os.listdir(root):
            with open(os.path.join(root, name, "memprofd_manifest.json")) as f:
                out[name.split("-")[0]] = json.load(f)["kind"]
        return out

    def test_periodic_and_shutdown_snapshots_are_checkpoints_unless_told(self):
        self.assertEqual(self.kinds(), {"step": "checkpoint", "shutdown": "checkpoint"})
        self.assertEqual(self.kinds("--auto_snapshot_kind=weights"),
                         {"step": "weights", "shutdown": "weights"})
        with self.assertRaises(RuntimeError) as e:
            Daemon("--auto_snapshot_kind=everything").close()
        self.assertIn("weights, checkpoint, adapter or merged", str(e.exception))


class CheckpointFilesTest(harness.DaemonTestCase):
    """What a checkpoint directory holds, read by the real consumers."""

    SNAPSHOTS = True
    DAEMON_FLAGS = (MICRO_FLAG,)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        op = cls.d.call("Train", pb.TrainRequest(steps=3, batch_size=1, seq_len=16, seed=3))
        assert wait_done(cls.d, op.id).state == pb.OPERATION_STATE_SUCCEEDED

    def snapshot(self, **kwargs):
        op = wait_done(self.d, self.d.call("Snapshot", pb.SnapshotRequest(**kwargs)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        return op.snapshot

    def test_checkpoint_files_load_in_transformers_and_safetensors(self):
        m = self.snapshot(name="ck", kind=pb.SNAPSHOT_KIND_CHECKPOINT)
        self.assertEqual(m.kind, pb.SNAPSHOT_KIND_CHECKPOINT)
        self.assertEqual([f.name for f in m.files],
                         ["model.safetensors", "config.json", "optimizer.safetensors",
                          "trainer_state.json"])
        described = self.d.call("DescribeSnapshot", pb.DescribeSnapshotRequest(name="ck"))
        self.assertEqual(described.kind, pb.SNAPSHOT_KIND_CHECKPOINT)
        self.assertGreater(described.optimizer_bytes, 0)

        import torch
        import transformers
        from safetensors import safe_open
        from transformers import AutoModelForCausalLM
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        model, info = AutoModelForCausalLM.from_pretrained(m.directory, output_loading_info=True)
        for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(set(info[key]), set(), key)
        params = dict(model.named_parameters())

        with safe_open(os.path.join(m.directory, "optimizer.safetensors"), "pt") as f:
            meta = f.metadata()
            keys = set(f.keys())
            step = f.get_tensor("model.norm.weight.step")
            exp_avg_sq = f.get_tensor("model.layers.0.mlp.up_proj.weight.exp_avg_sq")
        self.assertEqual(meta["format"], "pt")
        self.assertEqual(meta["optimizer"], "AdamW")
        self.assertEqual(float(meta["group.decay.lr"]), 1e-3)
        # Three tensors per distinct parameter (the tied head is the embedding).
        distinct = {n for n in params if n != "lm_head.weight"}
        self.assertEqual(keys, {"%s.%s" % (n, part) for n in distinct
                                for part in ("exp_avg", "exp_avg_sq", "step")})
        self.assertEqual(step.dtype, torch.float32)
        self.assertEqual(step.item(), 3.0)
        self.assertEqual(exp_avg_sq.shape, params["model.layers.0.mlp.up_proj.weight"].shape)
        self.assertGreater(exp_avg_sq.min().item(), 0)

        with open(os.path.join(m.directory, "trainer_state.json")) as f:
            state = json.load(f)
        self.assertEqual(state["format"], "memprofd-trainer-state")
        self.assertEqual(state["format_version"], 1)
        self.assertTrue(state["memprofd_version"])
        self.assertEqual(state["global_step"], 3)
        self.assertEqual(state["run"]["steps_completed"], 3)
        self.assertEqual(state["run"]["config"]["seq_len"], 16)
        sampler = state["run"]["data_sampler"]
        self.assertEqual((sampler["seed"], sampler["batches_drawn"], sampler["windows_drawn"]),
                         (3, 3, 3))
        self.assertEqual([l["global_step"] for l in state["recent_losses"]], [1, 2, 3])
        # An explicit snapshot without a kind holds the weights only.
        w = self.snapshot(name="w")
        self.assertEqual(w.kind, pb.SNAPSHOT_KIND_WEIGHTS)
        self.assertEqual([f.name for f in w.files], ["model.safetensors", "config.json"])

    def test_async_checkpoint_holds_host_copies_and_resumes(self):
        m = self.snapshot(name="ck-async", kind=pb.SNAPSHOT_KIND_CHECKPOINT,
                          mode=pb.SNAPSHOT_MODE_ASYNC)
        self.assertEqual(m.kind, pb.SNAPSHOT_KIND_CHECKPOINT)
        # The host copies: the weights and the optimizer state (three times
        # the weights, less the scalar steps' padding).
        self.assertGreaterEqual(m.peak_extra_host_bytes, m.total_size)
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
            hf_directory=m.directory, resume=True)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.assertEqual(op.model.steps_trained, 3)

    def test_sharded_checkpoint_shards_the_optimizer_too(self):
        m = self.snapshot(name="ck-sharded", kind=pb.SNAPSHOT_KIND_CHECKPOINT,
                          max_shard_size="200KB")
        names = [f.name for f in m.files]
        self.assertIn("model.safetensors.index.json", names)
        self.assertIn("optimizer.index.json", names)
        self.assertTrue(any(n.startswith("optimizer-00001-of-") for n in names), names)
        # Exactly one *.safetensors.index.json for transformers and accelerate.
        self.assertEqual([n for n in os.listdir(m.directory)
                          if n.endswith(".safetensors.index.json")],
                         ["model.safetensors.index.json"])
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
            hf_directory=m.directory, resume=True)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.assertEqual(op.model.steps_trained, 3)


class BadResumeTest(harness.DaemonTestCase):
    """Resume refuses what it cannot continue from, over the wire, and the
    model stays as it was."""

    SNAPSHOTS = True
    DAEMON_FLAGS = (MICRO_FLAG,)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        op = cls.d.call("Train", pb.TrainRequest(steps=2, batch_size=1, seq_len=16))
        assert wait_done(cls.d, op.id).state == pb.OPERATION_STATE_SUCCEEDED
        cls.ck = cls.snap("ck", pb.SNAPSHOT_KIND_CHECKPOINT)
        cls.weights = cls.snap("weights-only", pb.SNAPSHOT_KIND_WEIGHTS)

    @classmethod
    def snap(cls, name, kind):
        op = wait_done(cls.d, cls.d.call("Snapshot", pb.SnapshotRequest(name=name, kind=kind)).id)
        assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.error.message
        return op.snapshot.directory

    def load(self, directory, resume=True, init_weights=False):
        return wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
            hf_directory=directory, resume=resume, init_weights=init_weights)).id)

    def copy_of_checkpoint(self, name):
        dst = os.path.join(self.scratch, name)
        shutil.copytree(self.ck, dst)
        return dst

    def weights_file_now(self, name):
        """The model's weights as the daemon holds them now (a weights snapshot)."""
        return os.path.join(self.snap(name, pb.SNAPSHOT_KIND_WEIGHTS), "model.safetensors")

    def assert_failed(self, op, code, *parts):
        self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
        self.assertEqual(op.error.code, code.value[0], op.error.message)
        for p in parts:
            self.assertIn(p, op.error.message)

    def test_weights_only_snapshot_is_failed_precondition_naming_what_is_missing(self):
        before = self.d.call("DescribeModel", pb.DescribeModelRequest()).source
        op = self.load(self.weights)
        self.assert_failed(op, grpc.StatusCode.FAILED_PRECONDITION, "trainer_state.json",
                           "optimizer.safetensors", "weights only")
        self.assertEqual(self.d.call("DescribeModel", pb.DescribeModelRequest()).source, before)
        # Without resume it loads as any Hugging Face directory.
        self.assertEqual(self.load(self.weights, resume=False).state,
                         pb.OPERATION_STATE_SUCCEEDED)

    def test_optimizer_state_of_another_model_shape_is_failed_precondition(self):
        # A checkpoint of a narrower model (a config-only directory: fresh
        # weights), whose optimizer file is put into a copy of the first one.
        other = os.path.join(self.scratch, "narrow")
        os.makedirs(other)
        with open(os.path.join(self.ck, "config.json")) as f:
            config = json.load(f)
        config.update(hidden_size=32, intermediate_size=64, head_dim=8)
        with open(os.path.join(other, "config.json"), "w") as f:
            json.dump(config, f)
        op = self.load(other, resume=False, init_weights=True)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        wait_done(self.d, self.d.call("Train", pb.TrainRequest(steps=1, batch_size=1,
                                                               seq_len=16)).id)
        narrow_ck = self.snap("narrow-ck", pb.SNAPSHOT_KIND_CHECKPOINT)
        mixed = self.copy_of_checkpoint("mixed")
        shutil.copy(os.path.join(narrow_ck, "optimizer.safetensors"),
                    os.path.join(mixed, "optimizer.safetensors"))
        before = self.weights_file_now("before-shape")
        op = self.load(mixed)
        self.assert_failed(op, grpc.StatusCode.FAILED_PRECONDITION, "another model shape",
                           "model.embed_tokens.weight.exp_avg", "[256, 32]", "[256, 64]")
        self.assertTrue(filecmp.cmp(before, self.weights_file_now("after-shape"), shallow=False))

    def test_corrupt_optimizer_file_is_data_loss_and_the_weights_stay(self):
        self.assertEqual(self.load(self.ck).state, pb.OPERATION_STATE_SUCCEEDED)
        before = self.weights_file_now("before-corrupt")
        source = self.d.call("DescribeModel", pb.DescribeModelRequest()).source
        for what in ("truncated", "garbage header"):
            bad = self.copy_of_checkpoint("corrupt-" + what.replace(" ", "-"))
            path = os.path.join(bad, "optimizer.safetensors")
            if what == "truncated":
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) - 100)
            else:
                with open(path, "r+b") as f:
                    f.seek(8)
                    f.write(b"\x00garbage")
            op = self.load(bad)
            self.assert_failed(op, grpc.StatusCode.DATA_LOSS, "optimizer.safetensors")
        damaged = self.copy_of_checkpoint("corrupt-state")
        with open(os.path.join(damaged, "trainer_state.json"), "w") as f:
            f.write('{"format": "memprofd-trainer-state"')
        self.assert_failed(self.load(damaged), grpc.StatusCode.DATA_LOSS, "trainer_state.json")
        self.assertEqual(self.d.call("DescribeModel", pb.DescribeModelRequest()).source, source)
        self.assertTrue(filecmp.cmp(before, self.weights_file_now("after-corrupt"),
                                    shallow=False))
        # The run restored from the good checkpoint is still there to resume.
        op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(resume=True, steps=1)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)

    def test_requests_that_cannot_resume(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("LoadModel", pb.LoadModelRequest(preset="tiny", resume=True))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("hf_directory", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("Snapshot", pb.SnapshotRequest(name="ck-bf16", dtype=pb.SNAPSHOT_DTYPE_BF16,
                                                       kind=pb.SNAPSHOT_KIND_CHECKPOINT))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("dtype keep", e.exception.details())
        # A fresh model has no run to resume.
        wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=MICRO_DIR, init_weights=True)).id)
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("Train", pb.TrainRequest(resume=True))
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("no training run to resume", e.exception.details())
        # A complete run needs steps to go on; another seed cannot take effect.
        self.assertEqual(self.load(self.ck).state, pb.OPERATION_STATE_SUCCEEDED)
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("Train", pb.TrainRequest(resume=True, steps=1, seed=12345))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("seed 12345 cannot be given with resume", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("Train", pb.TrainRequest(resume=True))
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("complete (2 of 2 steps)", e.exception.details())

    def test_bad_resume_flags_stop_the_start(self):
        for flags, needle in ((("--resume=latest",), "--snapshot_root"),
                              (("--snapshot_root=" + os.path.dirname(self.ck), "--resume=nope"),
                               "nope"),
                              (("--snapshot_root=" + os.path.dirname(self.ck),
                                "--resume=weights-only"), "trainer_state.json")):
            with self.assertRaises(RuntimeError) as e:
                Daemon(*flags).close()
            self.assertIn(needle, str(e.exception))

    def test_memprofctl_checkpoint_load_and_resume(self):
        r = self.d.ctl("snapshot", "ctl-ck", "--kind", "checkpoint")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("checkpoint", r.stdout)
        m = self.d.call("DescribeSnapshot", pb.DescribeSnapshotRequest(name="ctl-ck"))
        r = self.d.ctl("load", "--hf_dir", m.directory, "--resume")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.d.ctl("--json", "train", "--resume", "--steps", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        steps = [json.loads(line) for line in r.stdout.splitlines() if '"loss"' in line]
        self.assertEqual([int(s["global_step"]) for s in steps],
                         [m.global_step + 1, m.global_step + 2])
        r = self.d.ctl("snapshot", "x", "--kind", "everything")
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main()
