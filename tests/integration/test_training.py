"""Model and training over the wire: the independent Python client drives the real daemon."""

import json
import os
import shutil
import struct
import tempfile
import unittest

import grpc

import harness
from harness import Daemon, metric, pb, wait_done


class TrainingTest(harness.DaemonTestCase):
    def test_1_status_shows_the_default_model(self):
        status = self.d.call("GetStatus", pb.GetStatusRequest())
        self.assertEqual(status.model.source, "preset:tiny")
        self.assertEqual(status.model.num_parameters, 4000000)
        self.assertEqual(status.model.config.vocab_size, 256)
        info = self.d.call("DescribeModel", pb.DescribeModelRequest())
        names = [p.name for p in info.parameters]
        self.assertEqual(names[0], "model.embed_tokens.weight")
        self.assertIn("model.layers.3.mlp.down_proj.weight", names)
        self.assertIn("model.norm.weight", names)

    def test_2_stream_cancel_midway_and_start_again(self):
        before = self.d.call("GetStatus", pb.GetStatusRequest()).model.steps_trained
        op = self.d.call("Train", pb.TrainRequest(steps=200, batch_size=2, seq_len=32, seed=1))
        self.assertEqual(op.kind, pb.OPERATION_KIND_TRAIN)
        reports = []
        for r in self.d.stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=op.id),
                                               timeout=300, metadata=self.d.metadata()):
            reports.append(r)
            if len(reports) == 3:
                cancelled = self.d.call("CancelOperation", pb.CancelOperationRequest(id=op.id))
                self.assertEqual(cancelled.id, op.id)
        final = wait_done(self.d, op.id)
        self.assertEqual(final.state, pb.OPERATION_STATE_CANCELLED)
        self.assertEqual(final.error.code, grpc.StatusCode.CANCELLED.value[0])
        done_steps = final.train.steps_completed
        self.assertGreaterEqual(done_steps, 3)
        self.assertLess(done_steps, 200)
        self.assertEqual([r.step for r in reports], list(range(1, done_steps + 1)))
        for r in reports:
            self.assertEqual(r.tokens, 64)
            self.assertGreater(r.tokens_per_second, 0)
            self.assertGreater(r.phase_seconds.forward, 0)
            self.assertGreater(r.phase_seconds.backward, 0)
            self.assertGreater(r.peak_allocated_bytes, 0)
        # Start again: the model keeps training where it stopped.
        op2 = self.d.call("Train", pb.TrainRequest(steps=2, batch_size=2, seq_len=32))
        final2 = wait_done(self.d, op2.id)
        self.assertEqual(final2.state, pb.OPERATION_STATE_SUCCEEDED, final2.error.message)
        self.assertEqual(final2.train.steps_completed, 2)
        status = self.d.call("GetStatus", pb.GetStatusRequest())
        self.assertEqual(status.model.steps_trained, before + done_steps + 2)
        self.assertEqual(status.last_step.global_step, before + done_steps + 2)
        # A late subscriber replays the whole stream of a finished operation.
        replay = list(self.d.stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=op2.id),
                                                    timeout=30, metadata=self.d.metadata()))
        self.assertEqual([r.step for r in replay], [1, 2])

    def test_3_bad_input_is_invalid_argument_with_what_to_fix(self):
        tmp = tempfile.TemporaryDirectory()
        empty = os.path.join(tmp.name, "empty.txt")
        open(empty, "w").close()
        missing = os.path.join(tmp.name, "missing.txt")
        cases = [
            (pb.TrainRequest(), "steps: required"),
            (pb.TrainRequest(steps=0), "steps"),
            # A field that is set is used as it is: 0 is not "the default".
            (pb.TrainRequest(steps=1, batch_size=0), "batch_size"),
            (pb.TrainRequest(steps=1, learning_rate=0), "learning_rate"),
            (pb.TrainRequest(steps=1, adam_eps=0), "adam_eps"),
            (pb.TrainRequest(steps=1, beta2=1.0), "beta2"),
            (pb.TrainRequest(steps=1, grad_accumulation_steps=0), "grad_accumulation_steps"),
            (pb.TrainRequest(steps=1, weight_decay=-0.1), "weight_decay"),
            (pb.TrainRequest(steps=1, attn_implementation="flash"), "attn_implementation"),
            (pb.TrainRequest(steps=-3), "steps"),
            (pb.TrainRequest(steps=1, batch_size=-1), "batch_size"),
            (pb.TrainRequest(steps=1, seq_len=-5), "seq_len"),
            (pb.TrainRequest(steps=1, seq_len=4096), "max_position_embeddings"),
            (pb.TrainRequest(steps=1, data=pb.DataSource(text_file=missing)), missing),
            (pb.TrainRequest(steps=1, data=pb.DataSource(text_file=empty)), "empty"),
            (pb.TrainRequest(steps=1, seq_len=4, data=pb.DataSource(
                inline_tokens=pb.InlineTokens(ids=[1, 2, 300, 4, 5, 6, 7, 8]))), "300"),
            (pb.TrainRequest(steps=1, seq_len=16, data=pb.DataSource(
                inline_tokens=pb.InlineTokens(ids=[1, 2, 3]))), "seq_len"),
            (pb.TrainRequest(steps=1, data=pb.DataSource(
                token_file=pb.TokenFile(path=empty, bytes_per_token=3))), "bytes_per_token"),
            (pb.TrainRequest(steps=1, offload=pb.OffloadOptions(enabled=True, min_offload_bytes=-1)),
             "min_offload_bytes"),
            (pb.TrainRequest(steps=1, offload=pb.OffloadOptions(enabled=True, prefetch_depth=-2)),
             "prefetch_depth"),
        ]
        for req, needle in cases:
            # A file is read in the operation (off gRPC's threads), so its
            # errors fail the operation; the rest come back at once.
            if req.data.WhichOneof("source") in ("text_file", "token_file") and \
                    req.data.token_file.bytes_per_token != 3:
                final = wait_done(self.d, self.d.call("Train", req).id)
                self.assertEqual(final.state, pb.OPERATION_STATE_FAILED, str(req))
                self.assertEqual(final.error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0], str(req))
                self.assertIn(needle, final.error.message, str(req))
                continue
            with self.assertRaises(grpc.RpcError, msg=str(req)) as e:
                self.d.call("Train", req)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, str(req))
            self.assertIn(needle, e.exception.details(), str(req))
        tmp.cleanup()
        # The rules of waits and streams are the session's too.
        load = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(preset="tiny")).id)
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("WaitOperation", pb.WaitOperationRequest(id=load.id, timeout_ms=-1))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("timeout must be >= 0", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            list(self.d.stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=load.id),
                                               timeout=30, metadata=self.d.metadata()))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("load_model operation, not a training one", e.exception.details())
        # Still serving, nothing lost.
        self.assertEqual(self.d.call("GetStatus", pb.GetStatusRequest()).serving_state, "SERVING")

    def test_3b_unset_fields_take_the_defaults(self):
        # Only steps: batch_size 8 and seq_len 128 (TrainOptions' defaults).
        op = self.d.call("Train", pb.TrainRequest(steps=1))
        final = wait_done(self.d, op.id)
        self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
        self.assertEqual(final.train.tokens, 8 * 128)

    def test_4_a_second_training_is_aborted(self):
        op = self.d.call("Train", pb.TrainRequest(steps=50, batch_size=1, seq_len=16))
        try:
            with self.assertRaises(grpc.RpcError) as e:
                self.d.call("Train", pb.TrainRequest(steps=1))
            self.assertEqual(e.exception.code(), grpc.StatusCode.ABORTED)
            with self.assertRaises(grpc.RpcError) as e:
                self.d.call("LoadModel", pb.LoadModelRequest(preset="tiny"))
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        finally:
            self.d.call("CancelOperation", pb.CancelOperationRequest(id=op.id))
            wait_done(self.d, op.id)

    def test_5_training_data_sources(self):
        tmp = tempfile.TemporaryDirectory()
        tokens = os.path.join(tmp.name, "tokens.bin")
        with open(tokens, "wb") as f:
            f.write(struct.pack("<400H", *[i % 256 for i in range(400)]))  # uint16 LE ids
        # Files under a data root (the harness's: the temporary directory).
        text = os.path.join(tmp.name, "GPL-3")
        shutil.copyfile("/usr/share/common-licenses/GPL-3", text)
        for data in (pb.DataSource(text_file=text),
                     pb.DataSource(token_file=pb.TokenFile(path=tokens, bytes_per_token=2)),
                     pb.DataSource(inline_tokens=pb.InlineTokens(ids=list(range(100))))):
            op = self.d.call("Train", pb.TrainRequest(steps=1, batch_size=2, seq_len=16, data=data))
            final = wait_done(self.d, op.id)
            self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
        tmp.cleanup()

    def test_6_load_model_presets_and_errors(self):
        for req, code in ((pb.LoadModelRequest(), grpc.StatusCode.INVALID_ARGUMENT),
                          (pb.LoadModelRequest(preset="huge"), grpc.StatusCode.INVALID_ARGUMENT),
                          (pb.LoadModelRequest(hf_directory=os.path.join(
                              tempfile.gettempdir(), "memprofd-nonexistent-model")),
                           grpc.StatusCode.NOT_FOUND),
                          (pb.LoadModelRequest(hf_directory="/nonexistent/model"),
                           grpc.StatusCode.PERMISSION_DENIED),
                          (pb.LoadModelRequest(preset="tiny", placement=[pb.ModulePlacement(
                              module="model.layers.9", placement=pb.PLACEMENT_DISK)]),
                           grpc.StatusCode.INVALID_ARGUMENT),
                          (pb.LoadModelRequest(preset="tiny", placement=[pb.ModulePlacement(
                              module="lm_head", placement=pb.PLACEMENT_CPU)]),
                           grpc.StatusCode.INVALID_ARGUMENT),
                          (pb.LoadModelRequest(preset="tiny", placement=[pb.ModulePlacement(
                              module="model.bogus", placement=pb.PLACEMENT_CPU)]),
                           grpc.StatusCode.INVALID_ARGUMENT)):
            try:
                op = self.d.call("LoadModel", req)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), code, str(req))
                continue
            final = wait_done(self.d, op.id)
            self.assertEqual(final.error.code, code.value[0], str(req))
        op = self.d.call("LoadModel", pb.LoadModelRequest(preset="small", seed=3))
        final = wait_done(self.d, op.id)
        self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
        self.assertGreater(final.model.num_parameters, 25_000_000)
        self.assertEqual(self.d.call("GetStatus", pb.GetStatusRequest()).model.steps_trained, 0)
        op = self.d.call("LoadModel", pb.LoadModelRequest(preset="tiny"))
        self.assertEqual(wait_done(self.d, op.id).state, pb.OPERATION_STATE_SUCCEEDED)

    def test_7_memprofctl_train_json_and_metrics(self):
        r = self.d.ctl("train", "--steps", "2", "--batch_size", "2", "--seq_len", "32", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [json.loads(l) for l in r.stdout.splitlines()]
        self.assertEqual([l["step"] for l in lines], ["1", "2"])  # int64 as JSON strings
        for key in ("loss", "tokens_per_second", "phase_seconds", "offload", "peak_allocated_bytes"):
            self.assertIn(key, lines[0])
        r = self.d.ctl("train", "--steps", "1", "--batch_size", "2", "--seq_len", "32", "--offload")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("offloaded", r.stdout)
        self.assertIn("SUCCEEDED: 1 steps", r.stdout)
        r = self.d.ctl("train", "--steps", "0")
        self.assertEqual(r.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", r.stderr)
        r = self.d.ctl("train", "--steps", "1", "--offload", "--prefetch_depth", "lots")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--prefetch_depth", r.stderr)
        r = self.d.ctl("train", "--steps", "1", "--offload", "--offload_target", "tape")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--offload_target cannot be 'tape': use disk or host", r.stderr)
        # Every offload flag reaches the daemon: one it refuses says so by field.
        r = self.d.ctl("train", "--steps", "1", "--offload", "--max_copies_in_flight", "0")
        self.assertEqual(r.returncode, 1)
        self.assertIn("offload.max_copies_in_flight", r.stderr)
        r = self.d.ctl("train", "--steps", "1", "--batch_size", "2", "--seq_len", "32",
                       "--offload", "--prefetch_depth", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.d.ctl("status")
        self.assertRegex(r.stdout, r"back \(.* read ahead\)")
        text = self.d.metrics_text()
        self.assertGreaterEqual(metric(text, "memprofd_train_steps_total"), 1)
        self.assertGreaterEqual(metric(text, "memprofd_train_tokens_total"), 1)
        self.assertIn("memprofd_train_step_seconds_bucket", text)
        # The histogram is fed by the session's step observer: one sample a step.
        self.assertEqual(metric(text, "memprofd_train_step_seconds_count"),
                         metric(text, "memprofd_train_steps_total"))
        self.assertGreater(metric(text, "memprofd_train_step_seconds_sum"), 0)
        self.assertIn("memprofd_train_last_loss", text)
        self.assertGreaterEqual(
            metric(text, "memprofd_offload_saved_tensors_total", outcome="offloaded"), 1)

    def test_8_offload_read_ahead_brings_every_byte_back_once(self):
        def totals():
            return self.d.call("GetStatus", pb.GetStatusRequest()).offload_totals
        for depth in (0, 3):
            before = totals()
            op = self.d.call("Train", pb.TrainRequest(
                steps=2, batch_size=2, seq_len=64, offload=pb.OffloadOptions(
                    enabled=True, target=pb.OFFLOAD_TARGET_DISK, prefetch_depth=depth)))
            final = wait_done(self.d, op.id)
            self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
            after = totals()
            out = after.bytes_out - before.bytes_out
            back = after.bytes_in - before.bytes_in
            ahead = after.bytes_prefetched - before.bytes_prefetched
            self.assertGreater(out, 0, depth)
            self.assertEqual(back, out, depth)  # every offloaded byte came back, once
            if depth == 0:
                self.assertEqual(ahead, 0)
            else:
                self.assertLessEqual(ahead, back)
            self.assertGreater(after.reload_wait_seconds, before.reload_wait_seconds)
            # Every saved tensor is counted once, whatever happened to it.
            step = self.d.call("GetStatus", pb.GetStatusRequest()).last_step.offload
            skipped = sum(getattr(step, f.name) for f in step.DESCRIPTOR.fields
                          if f.name.startswith("skipped_"))
            self.assertEqual(step.tensors_seen, step.tensors_offloaded + skipped)
            self.assertGreater(step.trl_baseline_bytes_out, 0)
            # Every byte moved was judged once: its device storage went free
            # (the trainer's activations) or something else kept it.
            self.assertEqual(step.effective_bytes + step.ineffective_bytes, step.bytes_out)
            self.assertGreater(step.effective_bytes, step.bytes_out // 2)
        metrics = self.d.metrics_text()
        self.assertGreaterEqual(metric(metrics, "memprofd_offload_prefetched_bytes_total"), 0)
        self.assertGreaterEqual(
            metric(metrics, "memprofd_offload_effectiveness_bytes_total", outcome="effective"), 1)


class OffloadDefaultsTest(unittest.TestCase):
    """A request's offload options replace only the fields it sets; every other
    field keeps the daemon's flag (proto3 optional says "not given")."""

    def test_daemon_offload_head_holds_unless_a_request_sets_it(self):
        d = Daemon("--model=tiny", "--offload_head")
        try:
            def last_step_offload(**offload):
                op = d.call("Train", pb.TrainRequest(steps=1, batch_size=2, seq_len=32,
                                                     offload=pb.OffloadOptions(**offload)))
                final = wait_done(d, op.id)
                self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
                return d.call("GetStatus", pb.GetStatusRequest()).last_step.offload

            # The head's saved tensors are exempt (skipped_exempt) unless the
            # head is offloaded too, as --offload_head says.
            step = last_step_offload(enabled=True)
            self.assertGreater(step.tensors_offloaded, 0)
            self.assertEqual(step.skipped_exempt, 0)
            step = last_step_offload(enabled=True, offload_head=False)
            self.assertGreater(step.skipped_exempt, 0)
            # memprofctl sends only the flags given: --offload alone keeps the
            # daemon's --offload_head.
            r = d.ctl("train", "--steps", "1", "--batch_size", "2", "--seq_len", "32", "--offload")
            self.assertEqual(r.returncode, 0, r.stderr)
            step = d.call("GetStatus", pb.GetStatusRequest()).last_step.offload
            self.assertGreater(step.tensors_offloaded, 0)
            self.assertEqual(step.skipped_exempt, 0)
            # --nooffload_head says "no" and is sent as such.
            r = d.ctl("train", "--steps", "1", "--batch_size", "2", "--seq_len", "32", "--offload",
                      "--nooffload_head")
            self.assertEqual(r.returncode, 0, r.stderr)
            step = d.call("GetStatus", pb.GetStatusRequest()).last_step.offload
            self.assertGreater(step.skipped_exempt, 0)
        finally:
            d.close()


class ClientTrainFlagsTest(unittest.TestCase):
    """memprofctl's train flags are named as the proto's fields (short aliases
    allowed) and only the ones given are sent."""

    def test_long_names_aliases_and_defaults(self):
        d = Daemon("--model=tiny")
        try:
            r = d.ctl("--json", "train", "--steps", "1", "--batch_size", "2", "--seq_len", "32",
                      "--learning_rate", "0.01", "--grad_accumulation_steps", "2")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(int(json.loads(r.stdout.splitlines()[0])["tokens"]), 2 * 32 * 2)
            r = d.ctl("--json", "train", "--steps", "1", "--batch_size", "2", "--seq_len", "32",
                      "--grad_accum", "3", "--checkpointing", "--lr", "0.01",
                      "--attn_implementation", "eager")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(int(json.loads(r.stdout.splitlines()[0])["tokens"]), 2 * 32 * 3)
            # Not given: the daemon's defaults (batch 8, sequence 128).
            r = d.ctl("--json", "train", "--steps", "1")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(int(json.loads(r.stdout.splitlines()[0])["tokens"]), 8 * 128)
            # A name and its alias together is a usage error; the daemon is not asked.
            before = d.call("GetStatus", pb.GetStatusRequest()).model.steps_trained
            r = d.ctl("train", "--steps", "1", "--lr", "0.01", "--learning_rate", "0.02")
            self.assertEqual(r.returncode, 2)
            self.assertIn("--learning_rate or --lr, not both", r.stderr)
            # A value the daemon refuses comes back as its INVALID_ARGUMENT.
            r = d.ctl("train", "--steps", "1", "--adam_eps", "0")
            self.assertEqual(r.returncode, 1)
            self.assertIn("INVALID_ARGUMENT", r.stderr)
            self.assertIn("adam_eps", r.stderr)
            self.assertEqual(d.call("GetStatus", pb.GetStatusRequest()).model.steps_trained, before)
        finally:
            d.close()


class OutOfMemoryTest(unittest.TestCase):
    def test_oom_fails_the_operation_and_the_model_stays_usable(self):
        # An address-space cap 1 GiB above what the idle daemon maps makes the
        # CPU allocator fail inside a step. Relative, because LibTorch's
        # libraries alone (CUDA ones included) map gigabytes of address space.
        # --refuse_unfit_steps=false: the step runs and fails for real (by
        # default its plan would refuse it before it allocates).
        d = Daemon("--model=tiny", "--refuse_unfit_steps=false")
        try:
            import resource
            pid = d.proc.pid
            with open("/proc/%d/status" % pid) as f:
                vm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
            limit = vm_kib * 1024 + 1024 ** 3
            resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
            op = d.call("Train", pb.TrainRequest(steps=1, batch_size=256, seq_len=512))
            final = wait_done(d, op.id)
            self.assertEqual(final.state, pb.OPERATION_STATE_FAILED)
            self.assertEqual(final.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                             final.error.message)
            self.assertIn("out of memory", final.error.message)
            ok = d.call("Train", pb.TrainRequest(steps=1, batch_size=2, seq_len=32))
            self.assertEqual(wait_done(d, ok.id).state, pb.OPERATION_STATE_SUCCEEDED)
        finally:
            d.close()


if __name__ == "__main__":
    unittest.main()
