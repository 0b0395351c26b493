"""PlanMemory and memprofctl plan over the wire, against the real daemon: a
plan of the loaded model, of a preset and of a directory's config.json (the
three agree for one shape), its figures against each other (the categories
tile the peak, model state below it), the verdict, memprofctl's human and
JSON output, the Python client's plan_memory, bad input (at once, or as the
failed operation), one plan at a time, a plan beside a training that
neither waits for it nor is disturbed by it, and the plans of each rank of a
data-parallel run."""

import json
import os
import threading
import time
import unittest

# One intra-op thread: the tiny model's steps take milliseconds either way,
# and the plan shares the two cores with the training (test_resume.py).
if not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = "1"

import grpc  # noqa: E402

import harness  # noqa: E402
from harness import pb, wait_done  # noqa: E402

SMALL = dict(batch_size=2, seq_len=32)


class PlanTest(harness.DaemonTestCase):
    """One daemon on the tiny preset (its default model)."""

    def plan(self, **fields):
        """PlanMemory(**fields) to success; returns the MemoryPlan."""
        op = self.d.call("PlanMemory", pb.PlanMemoryRequest(**fields))
        self.assertEqual(op.kind, pb.OPERATION_KIND_PLAN)
        final = wait_done(self.d, op.id)
        self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
        self.assertEqual(final.WhichOneof("result"), "plan")
        return final.plan

    def failed(self, **fields):
        """PlanMemory(**fields), accepted, then failed; returns its error."""
        op = self.d.call("PlanMemory", pb.PlanMemoryRequest(**fields))
        final = wait_done(self.d, op.id)
        self.assertEqual(final.state, pb.OPERATION_STATE_FAILED)
        return final.error

    def refused(self, code, **fields):
        with self.assertRaises(grpc.RpcError, msg=str(fields)) as e:
            self.d.call("PlanMemory", pb.PlanMemoryRequest(**fields))
        self.assertEqual(e.exception.code(), code, e.exception.details())
        return e.exception.details()

    def write_config(self, name, config):
        directory = os.path.join(self.scratch, name)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(config, f)
        return directory

    def test_1_the_loaded_model_a_preset_and_a_config_dir_plan_alike(self):
        loaded = self.plan(train=pb.TrainRequest(**SMALL))
        self.assertEqual(loaded.model, "preset:tiny")
        self.assertEqual(loaded.target, "cpu")  # the daemon's device
        self.assertGreater(loaded.peak_allocated_bytes, loaded.model_state_bytes)
        self.assertGreater(loaded.model_state_bytes, 0)
        # Parameters (4.0M float32), their gradients and AdamW's two moments.
        self.assertGreaterEqual(loaded.model_state_bytes, 3 * 4000000 * 4)
        self.assertEqual(sum(c.bytes for c in loaded.categories_at_peak),
                         loaded.peak_allocated_bytes)
        self.assertEqual(loaded.model_state_bytes + loaded.activation_bytes,
                         loaded.peak_allocated_bytes)
        names = [c.category for c in loaded.categories_at_peak]
        for name in ("parameters", "gathered_parameters", "gradients", "optimizer_state",
                     "saved_activations", "temporaries"):
            self.assertIn(name, names)
        self.assertIn(loaded.peak_phase, ("forward", "backward", "optimizer"))
        self.assertIn(loaded.peak_step, (1, 2))
        self.assertGreater(loaded.resident_between_steps_bytes, 0)
        self.assertTrue(loaded.top_modules_at_peak and loaded.top_ops_at_peak)
        self.assertLessEqual(len(loaded.top_ops_at_peak), 10)
        self.assertGreater(loaded.allocations, 0)
        # No capacity, no verdict.
        self.assertEqual((loaded.capacity_bytes, loaded.fits, loaded.headroom_bytes),
                         (0, True, 0))

        preset = self.plan(preset="tiny", train=pb.TrainRequest(**SMALL))
        self.assertEqual(preset.model, "preset:tiny")
        self.assertEqual(preset.peak_allocated_bytes, loaded.peak_allocated_bytes)

        # A config.json written from the loaded preset's values, in a
        # directory inside the daemon's roots: the same shape, the same plan.
        c = self.d.call("DescribeModel", pb.DescribeModelRequest()).config
        directory = self.write_config("tiny-config", {
            "architectures": [c.architecture], "model_type": c.model_type,
            "hidden_act": "silu", "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
            "max_position_embeddings": c.max_position_embeddings,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "tie_word_embeddings": c.tie_word_embeddings, "torch_dtype": "float32"})
        from_dir = self.plan(hf_config_dir=directory, train=pb.TrainRequest(**SMALL))
        self.assertEqual(from_dir.model, directory)
        self.assertEqual(from_dir.peak_allocated_bytes, loaded.peak_allocated_bytes)
        self.assertEqual(list(from_dir.categories_at_peak), list(loaded.categories_at_peak))

        # Where activations dominate (a longer window), gradient checkpointing
        # lowers the peak; offloading (the daemon's target: disk on this CPU
        # host) does not raise it.
        longer = dict(batch_size=8, seq_len=256)
        plain = self.plan(train=pb.TrainRequest(**longer))
        self.assertGreater(plain.activation_bytes, plain.model_state_bytes)
        checkpointed = self.plan(train=pb.TrainRequest(gradient_checkpointing=True, **longer))
        self.assertLess(checkpointed.peak_allocated_bytes, plain.peak_allocated_bytes)
        offloaded = self.plan(train=pb.TrainRequest(
            offload=pb.OffloadOptions(enabled=True), **longer))
        self.assertLessEqual(offloaded.peak_allocated_bytes, plain.peak_allocated_bytes)
        self.assertGreater(offloaded.offloaded_bytes, 0)
        self.assertEqual(plain.offloaded_bytes, 0)
        # What its copies in flight may add (a second dry run bounds it; 0
        # when the step peaks after they are done) counts in the verdict.
        self.assertEqual(plain.offload_in_flight_bytes, 0)
        capacity = 1 << 40
        judged = self.plan(train=pb.TrainRequest(offload=pb.OffloadOptions(enabled=True),
                                                 **longer), capacity_bytes=capacity)
        self.assertEqual(judged.headroom_bytes,
                         capacity - judged.peak_allocated_bytes
                         - judged.offload_in_flight_bytes)

    def test_2_the_verdict_against_a_capacity(self):
        peak = self.plan(train=pb.TrainRequest(**SMALL)).peak_allocated_bytes
        roomy = self.plan(train=pb.TrainRequest(**SMALL), capacity_bytes=peak + 1000)
        self.assertEqual((roomy.capacity_bytes, roomy.fits, roomy.headroom_bytes),
                         (peak + 1000, True, 1000))
        tight = self.plan(train=pb.TrainRequest(**SMALL), capacity_bytes=peak - 1000)
        self.assertEqual((tight.fits, tight.headroom_bytes), (False, -1000))
        cuda = self.plan(preset="tiny", target="cuda", train=pb.TrainRequest(**SMALL),
                         capacity_bytes=8 << 30)
        self.assertEqual(cuda.target, "cuda")
        self.assertTrue(cuda.fits)
        self.assertEqual(cuda.peak_allocated_bytes % 512, 0)
        # The simulated caching allocator's reserve: whole 2 MiB-multiple
        # segments, at least what is handed out; a CPU plan reserves nothing.
        self.assertGreaterEqual(cuda.reserved_bytes, cuda.peak_allocated_bytes)
        self.assertEqual(cuda.reserved_bytes % (2 << 20), 0)
        self.assertEqual(roomy.reserved_bytes, 0)
        # bf16 for a CUDA target follows CUDA's autocast (softmax and the
        # norms' pow and rsqrt in float32, SDPA as flash attention), not the
        # CPU's: the two targets' plans differ.
        bf16 = pb.TrainRequest(mixed_precision="bf16", **SMALL)
        on_cuda = self.plan(preset="tiny", target="cuda", train=bf16)
        on_cpu = self.plan(preset="tiny", target="cpu", train=bf16)
        self.assertGreater(on_cuda.peak_allocated_bytes, 0)
        self.assertNotEqual(on_cuda.activation_bytes, on_cpu.activation_bytes)

    def test_3_bad_input_at_once_or_as_the_failed_operation(self):
        self.assertIn("batch_size", self.refused(
            grpc.StatusCode.INVALID_ARGUMENT, train=pb.TrainRequest(batch_size=0)))
        self.assertIn("max_position_embeddings", self.refused(
            grpc.StatusCode.INVALID_ARGUMENT, train=pb.TrainRequest(seq_len=4096)))
        self.assertIn("cpu or cuda", self.refused(grpc.StatusCode.INVALID_ARGUMENT,
                                                  target="tpu"))
        self.assertIn("capacity_bytes", self.refused(grpc.StatusCode.INVALID_ARGUMENT,
                                                     capacity_bytes=-1))
        self.assertIn("tiny", self.refused(grpc.StatusCode.INVALID_ARGUMENT, preset="huge"))
        self.assertIn("resume", self.refused(grpc.StatusCode.INVALID_ARGUMENT,
                                             train=pb.TrainRequest(resume=True)))

        # Found while running: directories outside the roots (confined as
        # LoadModel's are), missing inside them, without a config.json, with a
        # bad one.
        error = self.failed(hf_config_dir="/usr/share")
        self.assertEqual(error.code, grpc.StatusCode.PERMISSION_DENIED.value[0])
        self.assertIn("hf_config_dir", error.message)
        error = self.failed(hf_config_dir=os.path.join(self.scratch, "missing"))
        self.assertEqual(error.code, grpc.StatusCode.NOT_FOUND.value[0])
        empty = os.path.join(self.scratch, "empty")
        os.makedirs(empty, exist_ok=True)
        error = self.failed(hf_config_dir=empty)
        self.assertEqual(error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertIn("config.json", error.message)
        bad = self.write_config("bad", {"architectures": ["GPT2LMHeadModel"]})
        error = self.failed(hf_config_dir=bad)
        self.assertEqual(error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        # Its training fields are checked once its config.json is read.
        small_positions = self.write_config("positions", dict(harness.MICRO))
        error = self.failed(hf_config_dir=small_positions,
                            train=pb.TrainRequest(batch_size=1, seq_len=512))
        self.assertEqual(error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertIn("max_position_embeddings", error.message)
        # The daemon serves on.
        self.plan(train=pb.TrainRequest(**SMALL))

    def test_4_memprofctl_plan_human_and_json(self):
        flags = ["--preset=tiny", "--batch_size=2", "--seq_len=32"]
        want = self.plan(preset="tiny", train=pb.TrainRequest(**SMALL),
                         capacity_bytes=1 << 40)
        r = self.d.ctl("plan", *flags, "--capacity=%d" % (1 << 40))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for needle in ("preset:tiny on cpu: peak", "model state", "activations",
                       "categories at the peak", "parameters", "top modules at the peak",
                       "top ops at the peak", "verdict: fits in 1.0 TiB, headroom",
                       "the daemon's resident set grows by"):
            self.assertIn(needle, r.stdout)
        r = self.d.ctl("plan", *flags, "--capacity=1000", "--json")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        got = json.loads(r.stdout)
        self.assertEqual(int(got["peak_allocated_bytes"]), want.peak_allocated_bytes)
        self.assertEqual(got["fits"], False)
        self.assertEqual(int(got["headroom_bytes"]), 1000 - want.peak_allocated_bytes)
        self.assertEqual(got["target"], "cpu")
        self.assertEqual(int(got["host_rss_bytes"]), want.host_rss_bytes)
        # The loaded model by default, in bf16 (the CPU's autocast: at a
        # batch whose backward is the peak, the halved activations make it
        # differ from float32's); the operation's failure as exit 4.
        r = self.d.ctl("plan", "--batch_size=8", "--seq_len=64", "--mixed_precision=bf16",
                       "--json")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        fp32 = self.plan(train=pb.TrainRequest(batch_size=8, seq_len=64))
        self.assertEqual(fp32.peak_phase, "backward")
        self.assertNotEqual(int(json.loads(r.stdout)["peak_allocated_bytes"]),
                            fp32.peak_allocated_bytes)
        r = self.d.ctl("plan", "--batch_size=2", "--seq_len=32", "--mixed_precision=bf16",
                       "--target=cuda")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("on cuda: peak", r.stdout)
        r = self.d.ctl("plan", "--hf_config=" + os.path.join(self.scratch, "missing"))
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("missing", r.stdout + r.stderr)
        r = self.d.ctl("plan", "--batch_size=0")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("INVALID_ARGUMENT", r.stderr)
        r = self.d.ctl("plan", "--preset=tiny", "--hf_config=/tmp")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)

    def test_5_the_python_client(self):
        op = self.d.client.plan_memory(preset="tiny", train=pb.TrainRequest(**SMALL),
                                       capacity_bytes=1 << 40)
        plan = op.wait().plan
        self.assertEqual(op.result(), plan)
        self.assertTrue(plan.fits)
        self.assertGreater(plan.peak_allocated_bytes, plan.model_state_bytes)

    def train_beside_a_plan(self, request, refuse_a_second=False):
        """Trains the tiny model while plan `request` runs; returns the plan
        operation, the training's step reports (every one, the training
        cancelled a few steps after the plan ended) and the numbers of the
        steps done when the plan started and ended. Checks on the way that the
        training goes on after the plan, and with `refuse_a_second` that a
        second plan is refused while the first runs (`request` must then take
        far longer than a call)."""
        train = self.d.call("Train", pb.TrainRequest(steps=100000, **SMALL))
        reports = []
        stream = self.d.stub.StreamStepReports(
            pb.StreamStepReportsRequest(operation_id=train.id), timeout=600,
            metadata=self.d.metadata())
        reader = threading.Thread(target=lambda: reports.extend(stream), daemon=True)
        reader.start()

        def wait_steps(n):
            deadline = time.time() + 120
            while len(reports) < n and time.time() < deadline:
                time.sleep(0.05)
            self.assertGreaterEqual(len(reports), n)

        wait_steps(3)
        first = self.d.call("PlanMemory", request)
        if refuse_a_second:
            details = self.refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   train=pb.TrainRequest(**SMALL))
            self.assertIn(first.id, details)
        started = len(reports)
        planned = wait_done(self.d, first.id)
        ended = len(reports)
        self.assertFalse(self.d.call("GetOperation", pb.GetOperationRequest(id=train.id)).done)
        wait_steps(ended + 3)
        self.d.call("CancelOperation", pb.CancelOperationRequest(id=train.id))
        self.assertEqual(wait_done(self.d, train.id).state, pb.OPERATION_STATE_CANCELLED)
        reader.join(timeout=60)
        self.assertFalse(reader.is_alive())
        return planned, reports, started, ended

    def test_6_one_plan_at_a_time_beside_a_training_that_goes_on(self):
        # A plan of a second or more: 256 micro layers, four micro-batches a step.
        deep = self.write_config("deep", dict(harness.MICRO, num_hidden_layers=256))
        planned, reports, started, ended = self.train_beside_a_plan(
            pb.PlanMemoryRequest(hf_config_dir=deep, train=pb.TrainRequest(
                batch_size=1, seq_len=16, grad_accumulation_steps=4)),
            refuse_a_second=True)
        self.assertEqual(planned.state, pb.OPERATION_STATE_SUCCEEDED, planned.error.message)
        self.assertGreater(planned.plan.peak_allocated_bytes, planned.plan.model_state_bytes)
        # Every step reported once, in order, with a loss: the training
        # neither waited for the plan nor failed beside it, and it stepped
        # while the plan ran.
        self.assertEqual([r.step for r in reports], list(range(1, len(reports) + 1)))
        self.assertTrue(all(r.loss > 0 for r in reports))
        self.assertGreater(ended, started)
        self.assertGreater(len(reports), ended)

    def test_7_a_plan_leaves_the_trainings_step_peaks_alone(self):
        planned, reports, started, ended = self.train_beside_a_plan(pb.PlanMemoryRequest(
            preset="llama-3.2-1b", train=pb.TrainRequest(batch_size=1, seq_len=256)))
        self.assertEqual(planned.state, pb.OPERATION_STATE_SUCCEEDED, planned.error.message)
        # Parameters, gradients and two moments of 1.24B float32 parameters.
        self.assertGreater(planned.plan.peak_allocated_bytes, 1_235_814_400 * 4 * 3)
        # The plan's meta allocations never reach the daemon's figures: the
        # steps during and after the plan peak as those before it (within the
        # plan's few real CPU bytes, its synthetic token window).
        before = reports[1].peak_allocated_bytes  # step 2: AdamW's state exists
        for r in reports[2:]:
            self.assertAlmostEqual(r.peak_allocated_bytes, before, delta=before * 0.01,
                                   msg="step %d (the plan ran during steps %d..%d)" % (
                                       r.step, started, ended))

    def test_8_each_rank_of_a_data_parallel_run(self):
        tiny = dict(preset="tiny", train=pb.TrainRequest(**SMALL))
        one = self.plan(**tiny)
        self.assertEqual((one.world_size, one.sharding, len(one.ranks)), (1, "none", 1))
        self.assertEqual(one.ranks[0].peak_allocated_bytes, one.peak_allocated_bytes)
        unsharded = self.plan(**tiny, world_size=2)
        sharded = self.plan(**tiny, world_size=2, sharding="optimizer")
        self.assertEqual((sharded.world_size, sharded.sharding), (2, "optimizer"))
        self.assertEqual([r.rank for r in sharded.ranks], [0, 1])
        self.assertEqual(max(r.peak_allocated_bytes for r in sharded.ranks),
                         sharded.peak_allocated_bytes)
        # Each rank keeps AdamW's state of its half of the parameters only.
        self.assertLess(sharded.peak_allocated_bytes, unsharded.peak_allocated_bytes)
        self.assertEqual(sum(r.owned_parameter_count for r in sharded.ranks),
                         unsharded.ranks[0].owned_parameter_count)
        op = self.d.client.plan_memory(**tiny, world_size=2, sharding="optimizer")
        self.assertEqual(op.wait().plan.peak_allocated_bytes, sharded.peak_allocated_bytes)
        r = self.d.ctl("plan", "--preset=tiny", "--batch_size=2", "--seq_len=32",
                       "--world_size=2", "--sharding=optimizer")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("each of 2 ranks (sharding optimizer)", r.stdout)
        # Bad values at once, naming the field.
        for fields in (dict(world_size=0), dict(world_size=70000),
                       dict(world_size=2, sharding="zero3")):
            details = self.refused(grpc.StatusCode.INVALID_ARGUMENT, **tiny, **fields)
            self.assertIn("sharding" if "sharding" in fields else "world_size", details)
        # Every level plans, full sharding's parameter shards included.
        r = self.d.ctl("plan", "--preset=tiny", "--batch_size=2", "--seq_len=32",
                       "--world_size=2", "--sharding=full")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("each of 2 ranks (sharding full)", r.stdout)

    def test_9_a_cancel_stops_a_long_plan_between_layers(self):
        # 1,024 decoder layers: a dry run of seconds, stopped within a
        # layer's work by the cancel (before, it ran to its end).
        directory = self.write_config("deep", dict(harness.MICRO, num_hidden_layers=1024))
        op = self.d.call("PlanMemory", pb.PlanMemoryRequest(
            hf_config_dir=directory, train=pb.TrainRequest(batch_size=1, seq_len=8)))
        deadline = time.time() + 60
        while self.d.call("GetOperation", pb.GetOperationRequest(id=op.id)).state != \
                pb.OPERATION_STATE_RUNNING and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        start = time.time()
        self.d.call("CancelOperation", pb.CancelOperationRequest(id=op.id))
        final = wait_done(self.d, op.id, timeout=60)
        elapsed = time.time() - start
        print("1,024-layer plan cancelled after %.2f s" % elapsed)
        self.assertEqual(final.state, pb.OPERATION_STATE_CANCELLED, final.error.message)
        self.assertLess(elapsed, 5)
        # The next plan runs at once.
        self.plan(preset="tiny", train=pb.TrainRequest(**SMALL))

    def test_10_data_sources_are_checked_as_a_train_checks_them(self):
        small = dict(batch_size=2, seq_len=32)
        for data, code in ((pb.DataSource(text_file="/etc/passwd"), "PERMISSION_DENIED"),
                           (pb.DataSource(token_file=pb.TokenFile(path="/proc/self/mem")),
                            "PERMISSION_DENIED"),
                           (pb.DataSource(text_file=os.path.join(self.scratch, "none.txt")),
                            "INVALID_ARGUMENT")):  # as a Train says it
            for field in ("data", "eval_data"):
                error = self.failed(preset="tiny", train=pb.TrainRequest(
                    **small, **{field: data}, **({"eval_every_steps": 1}
                                                 if field == "eval_data" else {})))
                self.assertEqual(error.code, getattr(grpc.StatusCode, code).value[0],
                                 "%s %s: %s" % (field, data, error.message))
        corpus = os.path.join(self.scratch, "corpus.txt")
        with open(corpus, "w") as f:
            f.write("the plan reads what the training would read. " * 200)
        plan = self.plan(preset="tiny", train=pb.TrainRequest(
            **small, data=pb.DataSource(text_file=corpus)))
        self.assertGreater(plan.peak_allocated_bytes, 0)

    def test_11_the_daemons_resident_set_grows_as_its_plan_says(self):
        # The daemon keeps its heap near its live bytes (--return_host_memory,
        # on by default): a run's RSS growth is the plan's host_rss_bytes
        # less what the daemon holds already between runs, its parameters
        # and AdamW's state (the plan counts their creation). A first run
        # makes that state and faults in the kernels' code pages, which RSS
        # counts too; the second is measured. And what the runs free goes
        # back to the kernel: after both, RSS is above where it was before
        # the first by little more than AdamW's state (with glibc's defaults
        # it stays hundreds of MB above, and the second run's growth is a
        # third of the plan's: it reuses what the first kept).
        train = pb.TrainRequest(steps=2, batch_size=8, seq_len=256)
        plan = self.plan(train=train)
        self.assertGreater(plan.host_rss_bytes, plan.peak_allocated_bytes)
        self.assertLess(plan.host_rss_bytes, plan.peak_allocated_bytes * 1.01)
        cuda = self.plan(train=train, target="cuda")
        self.assertEqual(cuda.host_rss_bytes, 0)

        def run():
            op = self.d.call("Train", train)
            final = wait_done(self.d, op.id)
            self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)

        def status(key):
            return harness.proc_status_bytes(self.d.proc.pid, key)

        start = status("VmRSS")
        run()
        try:
            with open("/proc/%d/clear_refs" % self.d.proc.pid, "w") as f:
                f.write("5")
        except OSError as e:
            self.skipTest("cannot restart the daemon's VmHWM: %s" % e)
        before = status("VmRSS")
        run()
        growth = status("VmHWM") - before
        kept = status("VmRSS") - start
        expected = plan.host_rss_bytes - plan.resident_between_steps_bytes
        print("RSS growth %d B; planned %d B (host_rss_bytes %d B less %d B held "
              "between runs); %d B above the start after both runs"
              % (growth, expected, plan.host_rss_bytes,
                 plan.resident_between_steps_bytes, kept))
        self.assertAlmostEqual(growth, expected, delta=expected * 0.05)
        self.assertLess(kept, plan.resident_between_steps_bytes + expected * 0.1)


class PlanCapTest(harness.DaemonTestCase):
    """A daemon whose plans may run 0.3 s of wall-clock time."""

    DAEMON_FLAGS = ("--max_plan_seconds=0.3",)

    def test_a_plan_past_the_cap_fails_deadline_exceeded_and_the_next_one_runs(self):
        directory = os.path.join(self.scratch, "deep")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(dict(harness.MICRO, num_hidden_layers=1024), f)
        start = time.time()
        final = wait_done(self.d, self.d.call("PlanMemory", pb.PlanMemoryRequest(
            hf_config_dir=directory, train=pb.TrainRequest(batch_size=1, seq_len=8))).id,
            timeout=60)
        elapsed = time.time() - start
        print("1,024-layer plan under a 0.3 s cap: %s after %.2f s"
              % (pb.OperationState.Name(final.state), elapsed))
        self.assertEqual(final.state, pb.OPERATION_STATE_FAILED)
        self.assertEqual(final.error.code, grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
                         final.error.message)
        self.assertIn("max_plan_time", final.error.message)
        self.assertLess(elapsed, 30)
        # A small plan (two micro layers, milliseconds) fits the cap, and the
        # daemon serves on.
        small = os.path.join(self.scratch, "shallow")
        os.makedirs(small, exist_ok=True)
        with open(os.path.join(small, "config.json"), "w") as f:
            json.dump(dict(harness.MICRO, num_hidden_layers=2), f)
        done = wait_done(self.d, self.d.call("PlanMemory", pb.PlanMemoryRequest(
            hf_config_dir=small, train=pb.TrainRequest(batch_size=1, seq_len=8))).id)
        self.assertEqual(done.state, pb.OPERATION_STATE_SUCCEEDED, done.error.message)


if __name__ == "__main__":
    unittest.main()
