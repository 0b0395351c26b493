"""Hostile and careless input over the wire: paths confined to the data roots,
files that would block (FIFOs, /proc) refused without holding a thread,
sharded snapshots missing their index, echoes that stay small, unknown enum
values, snapshot names, the bearer scheme in any case, and /metrics under idle
connections. The real daemon, started by harness.Daemon, on loopback; every
FIFO, link and file is the test's own."""

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import unittest
import urllib.request

import grpc

import harness
from harness import Daemon, pb, wait_done

INVALID, PERMISSION, DATA_LOSS = (grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                  grpc.StatusCode.PERMISSION_DENIED.value[0],
                                  grpc.StatusCode.DATA_LOSS.value[0])


def rpc_error(test, fn):
    with test.assertRaises(grpc.RpcError) as e:
        fn()
    return e.exception


class StatusProbe:
    """GetStatus every 5 ms on its own channel while a block runs; `worst` is
    the slowest answer (s), `failures` those that did not come back."""

    def __init__(self, d):
        self.d, self.worst, self.failures, self._stop = d, 0.0, 0, threading.Event()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            start = time.time()
            try:
                self.d.call("GetStatus", pb.GetStatusRequest(), timeout=5)
            except grpc.RpcError:
                self.failures += 1
            self.worst = max(self.worst, time.time() - start)
            time.sleep(0.005)


class HostileInputTest(harness.DaemonTestCase):
    SNAPSHOTS = True

    @classmethod
    def setUpClass(cls):
        cls.DAEMON_FLAGS = ("--model=" + harness.micro_model_dir(),)
        super().setUpClass()

    def train_fails(self, data, code, *needles):
        op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
            steps=1, batch_size=1, seq_len=8, data=data)).id, timeout=60)
        self.assertEqual(op.state, pb.OPERATION_STATE_FAILED, op)
        self.assertEqual(op.error.code, code, op.error.message)
        for needle in needles:
            self.assertIn(needle, op.error.message)
        return op.error.message

    def test_files_that_would_block_are_refused_while_status_answers(self):
        fifo = os.path.join(self.scratch, "corpus.fifo")
        os.mkfifo(fifo)
        kmsg = os.path.join(self.scratch, "kmsg-link")
        os.symlink("/proc/kmsg", kmsg)
        with StatusProbe(self.d) as probe:
            start = time.time()
            for _ in range(2):  # two at once pinned both gRPC threads before
                self.train_fails(pb.DataSource(text_file=fifo), INVALID, "is a FIFO")
            self.train_fails(pb.DataSource(text_file=kmsg), PERMISSION, "outside")
            self.train_fails(pb.DataSource(text_file=self.scratch), INVALID, "is a directory")
            elapsed = time.time() - start
        print("FIFO, /proc link and directory refused in %.2f s; GetStatus worst %.3f s"
              % (elapsed, probe.worst))
        self.assertEqual(probe.failures, 0)
        self.assertLess(probe.worst, 1.0)
        # Evaluate reads alike, and a FIFO config.json does not hold LoadModel.
        op = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(
            data=pb.DataSource(text_file=fifo))).id, timeout=60)
        self.assertEqual(op.error.code, INVALID, op.error.message)
        model = os.path.join(self.scratch, "fifo-model")
        os.mkdir(model)
        os.mkfifo(os.path.join(model, "config.json"))
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=model)).id,
                       timeout=60)
        self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
        self.assertIn("config.json", op.error.message)
        self.assertEqual(self.d.call("GetStatus", pb.GetStatusRequest()).serving_state, "SERVING")

    def test_paths_stay_inside_the_roots_and_no_contents_are_quoted(self):
        link = os.path.join(self.scratch, "passwd-link")
        os.symlink("/etc/passwd", link)
        for path in ("/etc/shadow", "/etc/passwd", link, "/proc/self/mem"):
            message = self.train_fails(pb.DataSource(token_file=pb.TokenFile(path=path)),
                                       PERMISSION, "outside the daemon's data roots")
            self.assertNotIn("token id", message)
            self.assertNotIn("root:", message)
        self.train_fails(pb.DataSource(text_file="relative/corpus.txt"), INVALID, "is relative")
        inside = os.path.join(self.scratch, "corpus.txt")
        with open(inside, "w") as f:
            f.write("hello " * 100)
        self.train_fails(pb.DataSource(text_file=inside + "\0.txt"), INVALID, "NUL byte")
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory="/etc")).id)
        self.assertEqual(op.error.code, PERMISSION, op.error.message)
        # The file inside the root trains.
        op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
            steps=1, batch_size=1, seq_len=8, data=pb.DataSource(text_file=inside))).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)

    def test_sharded_snapshot_without_its_index_is_data_loss(self):
        before = self.d.call("DescribeModel", pb.DescribeModelRequest()).source
        op = wait_done(self.d, self.d.call("Snapshot", pb.SnapshotRequest(
            name="sharded", max_shard_size="200KB")).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        directory = op.snapshot.directory
        shards = [n for n in os.listdir(directory) if n.endswith(".safetensors")]
        self.assertGreater(len(shards), 1)
        os.remove(os.path.join(directory, "model.safetensors.index.json"))
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=directory)).id)
        self.assertEqual(op.error.code, DATA_LOSS, op.error.message)
        self.assertIn("neither model.safetensors nor", op.error.message)
        self.assertEqual(self.d.call("DescribeModel", pb.DescribeModelRequest()).source, before)

    def test_a_diverging_update_is_not_applied_and_limits_hold(self):
        # A rate of 1e30 would make every weight about 1e30 (finite): the
        # update is seen before it is made, refused, and the model serves as
        # it was.
        before = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(
            max_batches=1)).id)
        self.assertEqual(before.state, pb.OPERATION_STATE_SUCCEEDED, before.error.message)
        op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
            steps=6, batch_size=1, seq_len=8, learning_rate=1e30)).id, timeout=120)
        self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
        self.assertEqual(op.error.code, grpc.StatusCode.FAILED_PRECONDITION.value[0], op.error.message)
        self.assertIn("diverged", op.error.message)
        self.assertIn("not applied", op.error.message)
        nonfinite = [v for name, _, v in harness.metric_samples(self.d.metrics_text())
                     if name == "memprofd_train_nonfinite_steps_total"]
        self.assertEqual(nonfinite, [1.0])
        after = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(
            max_batches=1)).id)
        self.assertEqual(after.state, pb.OPERATION_STATE_SUCCEEDED, after.error.message)
        self.assertEqual(after.evaluate.loss, before.evaluate.loss)
        op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
            steps=1, batch_size=1, seq_len=8)).id, timeout=120)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        for request, needle in ((pb.TrainRequest(steps=1, grad_accumulation_steps=1000000000),
                                 "grad_accumulation_steps must be at most 4096"),
                                (pb.TrainRequest(steps=1, batch_size=2**63 - 1),
                                 "batch_size must be at most"),
                                (pb.TrainRequest(steps=2**62), "steps must be at most")):
            e = rpc_error(self, lambda: self.d.call("Train", request))
            self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT, e.details())
            self.assertIn(needle, e.details())
        # The weights the failed run left load again: a fresh model for the other tests.
        wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
            hf_directory=harness.micro_model_dir(), init_weights=True)).id)

    def test_a_model_too_large_for_the_device_is_refused_before_allocating(self):
        before = self.d.call("DescribeModel", pb.DescribeModelRequest()).source
        with open(os.path.join(harness.micro_model_dir(), "config.json")) as f:
            micro = json.load(f)
        cases = (({"num_hidden_layers": 1000000, "hidden_size": 2048, "intermediate_size": 8192,
                   "num_attention_heads": 16, "num_key_value_heads": 16},
                  grpc.StatusCode.RESOURCE_EXHAUSTED, "free"),
                 ({"max_position_embeddings": 2 ** 62}, grpc.StatusCode.INVALID_ARGUMENT,
                  "overflows"))
        for i, (change, code, needle) in enumerate(cases):
            directory = os.path.join(self.scratch, "huge-%d" % i)
            os.mkdir(directory)
            with open(os.path.join(directory, "config.json"), "w") as f:
                json.dump(dict(micro, **change), f)
            start = time.time()
            op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
                hf_directory=directory, init_weights=True)).id, timeout=60)
            elapsed = time.time() - start
            self.assertEqual(op.error.code, code.value[0], op.error.message)
            self.assertIn(needle, op.error.message)
            # Refused from the config: nothing was allocated layer by layer.
            self.assertLess(elapsed, 5.0, op.error.message)
        self.assertEqual(self.d.call("DescribeModel", pb.DescribeModelRequest()).source, before)

    def test_a_step_too_large_for_the_device_is_refused_before_allocating(self):
        # 2^20 x 128 tokens: beyond the plan's host admission; 2^16 x 128:
        # planned, and its peak (tens of GB) beyond what the host has free.
        # Before, the first grew the daemon to 12.7 GB before an allocation
        # failed.
        def rss():
            return harness.proc_status_bytes(self.d.proc.pid, "VmRSS")
        for batch, needle in ((2 ** 20, "real host memory"), (2 ** 16, "planned to peak")):
            before = rss()
            start = time.time()
            op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
                steps=1, batch_size=batch, seq_len=128)).id, timeout=120)
            elapsed = time.time() - start
            grew = rss() - before
            print("batch %d x 128 refused in %.2f s, RSS +%.0f MB: %s" % (
                batch, elapsed, grew / 1e6, op.error.message[:160]))
            self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
            self.assertEqual(op.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                             op.error.message)
            self.assertIn("refused before it allocated", op.error.message)
            self.assertIn(needle, op.error.message)
            self.assertLess(grew, 500e6)
        # Under a budget larger than the device, the chosen configuration
        # is admitted the same way.
        op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
            steps=1, batch_size=2 ** 16, seq_len=128, memory_budget_bytes=2 ** 50)).id,
            timeout=300)
        self.assertEqual(op.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                         op.error.message)
        self.assertIn("under memory_budget_bytes", op.error.message)
        self.assertIn("planned to peak", op.error.message)
        # The next training runs.
        op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
            steps=1, batch_size=1, seq_len=8)).id, timeout=120)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)

    def test_a_disk_placed_modules_file_truncated_under_the_daemon_kills_nothing(self):
        # A client's directory with layer 1 on disk: its weights go to a
        # spill file of the daemon's own, so truncating the client's file
        # cannot raise SIGBUS at the next forward (before, it killed the
        # daemon).
        before = self.d.call("DescribeModel", pb.DescribeModelRequest()).source
        op = wait_done(self.d, self.d.call("Snapshot", pb.SnapshotRequest(name="to-place")).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        directory = os.path.join(self.scratch, "placed-copy")
        shutil.copytree(op.snapshot.directory, directory)
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
            hf_directory=directory, placement=[pb.ModulePlacement(
                module="model.layers.1", placement=pb.PLACEMENT_DISK)])).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        first = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(max_batches=1)).id)
        self.assertEqual(first.state, pb.OPERATION_STATE_SUCCEEDED, first.error.message)
        with open(os.path.join(directory, "model.safetensors"), "r+b") as f:
            f.truncate(100)
        again = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(max_batches=1)).id)
        self.assertEqual(again.state, pb.OPERATION_STATE_SUCCEEDED, again.error.message)
        self.assertEqual(again.evaluate.loss, first.evaluate.loss)
        self.assertIsNone(self.d.proc.poll())
        # The daemon's own snapshot likewise: its files are copied too, so
        # an operator's truncation in the snapshot root kills nothing, and
        # the snapshot may be deleted while the model is loaded.
        own = wait_done(self.d, self.d.call("Snapshot", pb.SnapshotRequest(name="own-placed")).id)
        self.assertEqual(own.state, pb.OPERATION_STATE_SUCCEEDED, own.error.message)
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
            hf_directory=own.snapshot.directory, placement=[pb.ModulePlacement(
                module="model.layers.1", placement=pb.PLACEMENT_DISK)])).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        with open(os.path.join(own.snapshot.directory, "model.safetensors"), "r+b") as f:
            f.truncate(100)
        again = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(max_batches=1)).id)
        self.assertEqual(again.state, pb.OPERATION_STATE_SUCCEEDED, again.error.message)
        self.assertEqual(again.evaluate.loss, first.evaluate.loss)
        self.d.call("DeleteSnapshot", pb.DeleteSnapshotRequest(name="own-placed"))
        self.assertIsNone(self.d.proc.poll())
        wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
            hf_directory=harness.micro_model_dir(), init_weights=True)).id)
        self.assertNotEqual(before, "")

    def test_long_values_are_cut_in_the_status_not_turned_into_resource_exhausted(self):
        huge = "x" * 20000
        for fn, code in ((lambda: self.d.call("GetOperation", pb.GetOperationRequest(id=huge)),
                          grpc.StatusCode.NOT_FOUND),
                         (lambda: self.d.call("LoadModel", pb.LoadModelRequest(preset=huge)),
                          grpc.StatusCode.INVALID_ARGUMENT),
                         (lambda: self.d.call("GetMemoryBreakdown", pb.GetMemoryBreakdownRequest(by=huge)),
                          grpc.StatusCode.INVALID_ARGUMENT),
                         (lambda: self.d.call("Train", pb.TrainRequest(steps=1, mixed_precision=huge)),
                          grpc.StatusCode.INVALID_ARGUMENT)):
            e = rpc_error(self, fn)
            self.assertEqual(e.code(), code, e.details()[:200])
            self.assertLess(len(e.details()), 1000)
            self.assertIn("(20000 bytes)", e.details())

    def test_unknown_enum_values_duplicate_placements_and_bad_names_are_refused(self):
        for request, needle in ((pb.SnapshotRequest(name="s", dtype=99), "dtype: unknown value 99"),
                                (pb.SnapshotRequest(name="s", mode=99), "mode: unknown value 99"),
                                (pb.SnapshotRequest(name="s", kind=99), "kind: unknown value 99")):
            e = rpc_error(self, lambda: self.d.call("Snapshot", request))
            self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(needle, e.details())
        e = rpc_error(self, lambda: self.d.call("LoadModel", pb.LoadModelRequest(
            preset="tiny", placement=[pb.ModulePlacement(module="lm_head", placement=7)])))
        self.assertIn("placement.placement: unknown value 7", e.details())
        e = rpc_error(self, lambda: self.d.call("LoadModel", pb.LoadModelRequest(
            preset="tiny", placement=[pb.ModulePlacement(module="model.norm", placement=pb.PLACEMENT_CPU),
                                      pb.ModulePlacement(module="model.norm", placement=pb.PLACEMENT_DISK)])))
        self.assertIn("twice", e.details())
        for name in ("-rf", "a b", "*", "~root", "a\u202eb", "caf\u00e9"):
            e = rpc_error(self, lambda: self.d.call("Snapshot", pb.SnapshotRequest(name=name)))
            self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT, name)
            self.assertIn("ASCII letters, digits", e.details())
        names = {m.name for m in self.d.call("ListSnapshots", pb.ListSnapshotsRequest()).snapshots}
        self.assertFalse(names & {"s", "-rf", "a b", "*", "~root"}, names)


class ShutdownDeadlineTest(unittest.TestCase):
    """SIGTERM ends the process within the drain time whatever runs: a long
    step stops between micro-batches; work that cannot stop in time (one long
    micro-batch) is abandoned at --drain_seconds; a second signal exits at once."""

    def start_long_step(self, d, **kwargs):
        op = d.call("Train", pb.TrainRequest(steps=1, **kwargs)).id
        deadline = time.time() + 60
        while d.call("GetOperation", pb.GetOperationRequest(id=op)).state != pb.OPERATION_STATE_RUNNING:
            self.assertLess(time.time(), deadline)
            time.sleep(0.05)
        time.sleep(1.0)  # well into the step

    def test_a_step_of_4096_micro_batches_stops_between_them(self):
        d = Daemon("--model=" + harness.micro_model_dir())
        try:
            self.start_long_step(d, batch_size=8, seq_len=64, grad_accumulation_steps=4096)
            code, seconds = d.stop(signal.SIGTERM, timeout=10)
            print("SIGTERM during a 4096-micro-batch step: exited %d after %.2f s" % (code, seconds))
            self.assertEqual(code, 0, d.output())
            self.assertLess(seconds, 5.0)
        finally:
            d.close()

    def test_one_long_micro_batch_stops_between_its_layers(self):
        # One micro-batch of 8 x 1024 tokens on the small preset takes tens of
        # seconds on two cores; the step polls for a cancel between its 8 layers.
        d = Daemon("--model=small")
        try:
            op = d.call("Train", pb.TrainRequest(steps=1, batch_size=8, seq_len=1024)).id
            deadline = time.time() + 60
            while d.call("GetOperation", pb.GetOperationRequest(id=op)).state != pb.OPERATION_STATE_RUNNING:
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
            time.sleep(1.0)
            start = time.time()
            d.call("CancelOperation", pb.CancelOperationRequest(id=op))
            done = wait_done(d, op)
            seconds = time.time() - start
            print("CancelOperation inside one 8 x 1024 micro-batch: %s after %.2f s"
                  % (pb.OperationState.Name(done.state), seconds))
            self.assertEqual(done.state, pb.OPERATION_STATE_CANCELLED, done.error.message)
            self.assertLess(seconds, 15.0)
            self.assertEqual(d.call("DescribeModel", pb.DescribeModelRequest()).steps_trained, 0)
            code, _ = d.stop(signal.SIGTERM, timeout=30)
            self.assertEqual(code, 0, d.output())
        finally:
            d.close()

    def test_work_that_cannot_stop_is_abandoned_at_the_deadline_or_a_second_signal(self):
        # A one-layer model 2048 wide: one micro-batch of 8 x 1024 tokens is
        # one layer's work of tens of seconds on two cores, with no layer
        # boundary to stop at.
        wide = harness.micro_model_dir(
            "wide-one-layer", hidden_size=2048, intermediate_size=8192, num_hidden_layers=1,
            num_attention_heads=16, num_key_value_heads=16, head_dim=128,
            max_position_embeddings=1024)
        for flags, second in ((("--drain_seconds=2",), False), (("--drain_seconds=120",), True)):
            d = Daemon("--model=" + wide, *flags)
            try:
                self.start_long_step(d, batch_size=8, seq_len=1024)
                start = time.time()
                d.proc.send_signal(signal.SIGTERM)
                if second:
                    time.sleep(0.5)
                    d.proc.send_signal(signal.SIGTERM)
                d.proc.wait(timeout=30)
                seconds = time.time() - start
                print("%s: exited %d after %.2f s" % (
                    "second SIGTERM" if second else "--drain_seconds=2", d.proc.returncode, seconds))
                self.assertEqual(d.proc.returncode, 1, d.output())
                self.assertIn("second signal" if second else "drain deadline passed", d.output())
                self.assertLess(seconds, 2.0 if second else 6.0)
            finally:
                d.close()


class CancelQueuedLoadTest(harness.DaemonTestCase):
    def test_a_cancelled_load_leaves_the_model_as_it_was(self):
        before = self.d.call("DescribeModel", pb.DescribeModelRequest())
        # A long evaluation holds the owner thread; the load waits behind it.
        evaluation = self.d.call("Evaluate", pb.EvaluateRequest(batch_size=8, seq_len=256))
        load = self.d.call("LoadModel", pb.LoadModelRequest(preset="small"))
        self.d.call("CancelOperation", pb.CancelOperationRequest(id=load.id))
        self.d.call("CancelOperation", pb.CancelOperationRequest(id=evaluation.id))
        done = wait_done(self.d, load.id)
        self.assertEqual(done.state, pb.OPERATION_STATE_CANCELLED, done.error.message)
        after = self.d.call("DescribeModel", pb.DescribeModelRequest())
        self.assertEqual((after.source, after.num_parameters), (before.source, before.num_parameters))


class SignalAtTheRendezvousTest(unittest.TestCase):
    """A rank waiting at the rendezvous for a rank 0 that never comes stops on
    SIGTERM at once (before, it waited out the store's retries: 70 s)."""

    def test_sigterm_while_waiting_for_rank_0_exits_at_once(self):
        env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(harness.free_port())}
        d = Daemon("--model=", "--collective_timeout_seconds=120", env=env, wait=False)
        try:
            time.sleep(2)
            self.assertIsNone(d.proc.poll(), d.output())
            start = time.time()
            d.proc.send_signal(signal.SIGTERM)
            code = d.proc.wait(30)
            elapsed = time.time() - start
            print("rank 1 at the rendezvous: exit %d %.2f s after SIGTERM" % (code, elapsed))
            self.assertEqual(code, 0, d.output())
            self.assertLess(elapsed, 3)
            self.assertIn("while starting", d.output())
        finally:
            if d.proc.poll() is None:
                d.proc.kill()
            d.close()


class BearerAnyCaseTest(harness.DaemonTestCase):
    TOKEN = "s3cret-token"

    def test_the_scheme_is_case_insensitive_and_the_token_is_not(self):
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
            self.d.stub.GetStatus(pb.GetStatusRequest(), timeout=10,
                                  metadata=[("authorization", scheme + " " + self.TOKEN)])
        for value in ("Bearer " + self.TOKEN.upper(), "Basic " + self.TOKEN, self.TOKEN):
            e = rpc_error(self, lambda: self.d.stub.GetStatus(
                pb.GetStatusRequest(), timeout=10, metadata=[("authorization", value)]))
            self.assertEqual(e.code(), grpc.StatusCode.UNAUTHENTICATED, value)


class ModelDirectoryLinksTest(unittest.TestCase):
    """One rule for every file of a model directory a client names: links
    that resolve inside the data roots are followed (the Hugging Face cache,
    whose snapshots/<revision>/ files link into blobs/, loads), links that
    lead outside are PERMISSION_DENIED, and no message carries a byte or the
    size of the outside file."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="memprofd-it-links-")
        cls.inside = os.path.join(cls._tmp.name, "inside")
        cls.outside = os.path.join(cls._tmp.name, "outside")
        os.mkdir(cls.inside)
        os.mkdir(cls.outside)
        try:
            cls.d = Daemon("--model=" + harness.micro_model_dir(), "--data_root=" + cls.inside,
                           "--snapshot_root=" + os.path.join(cls._tmp.name, "snapshots"))
        except BaseException:
            cls._tmp.cleanup()
            raise
        op = wait_done(cls.d, cls.d.call("Snapshot", pb.SnapshotRequest(name="w")).id)
        assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.error.message
        for name in ("model.safetensors", "config.json"):
            shutil.copy(os.path.join(op.snapshot.directory, name), cls.outside)

    @classmethod
    def tearDownClass(cls):
        cls.d.close()
        cls._tmp.cleanup()

    def load(self, directory):
        return wait_done(self.d, self.d.call(
            "LoadModel", pb.LoadModelRequest(hf_directory=directory)).id, timeout=60)

    def model_dir(self, name, copies=(), links=()):
        """A directory under the root with `copies` (names copied from the
        outside model) and `links` ((name, target) symbolic links)."""
        directory = os.path.join(self.inside, name)
        os.makedirs(directory)
        for copy in copies:
            shutil.copy(os.path.join(self.outside, copy), directory)
        for link, target in links:
            os.symlink(target, os.path.join(directory, link))
        return directory

    def test_the_hugging_face_cache_layout_loads(self):
        repo = os.path.join(self.inside, "hub", "models--org--micro")
        os.makedirs(os.path.join(repo, "blobs"))
        for blob, name in (("aaa", "model.safetensors"), ("bbb", "config.json")):
            shutil.copy(os.path.join(self.outside, name), os.path.join(repo, "blobs", blob))
        with open(os.path.join(repo, "blobs", "ccc"), "w") as f:
            json.dump({"do_sample": False}, f)
        revision = os.path.join(repo, "snapshots", "0123abc")
        os.makedirs(revision)
        for blob, name in (("aaa", "model.safetensors"), ("bbb", "config.json"),
                           ("ccc", "generation_config.json")):
            os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(revision, name))
        op = self.load(revision)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.assertEqual(self.d.call("DescribeModel", pb.DescribeModelRequest()).source,
                         os.path.realpath(revision))

    def test_links_outside_the_roots_are_refused_and_say_nothing_of_the_file(self):
        before = self.d.call("DescribeModel", pb.DescribeModelRequest()).source
        weights = os.path.join(self.outside, "model.safetensors")
        cases = {
            "weights-out": (["config.json"], [("model.safetensors", weights)]),
            "shadow": (["config.json"], [("model.safetensors", "/etc/passwd")]),
            "config-out": (["model.safetensors"],
                           [("config.json", os.path.join(self.outside, "config.json"))]),
            "index-out": (["config.json"], [("model.safetensors.index.json", "/etc/passwd")]),
            "shard-out": (["config.json"], [("model-00001-of-00001.safetensors", weights)]),
            "tokenizer-out": (["config.json", "model.safetensors"],
                              [("tokenizer.json", "/etc/passwd")]),
            "dangling-out": (["config.json"],
                             [("model.safetensors", os.path.join(self.outside, "missing"))]),
        }
        with open(os.path.join(self.inside, "shard-index.json"), "w") as f:
            json.dump({"weight_map": {"model.embed_tokens.weight":
                                      "model-00001-of-00001.safetensors"}}, f)
        sizes = {str(os.path.getsize(p)) for p in ("/etc/passwd", weights)}
        for name, (copies, links) in cases.items():
            directory = self.model_dir(name, copies, links)
            if name == "shard-out":
                shutil.copy(os.path.join(self.inside, "shard-index.json"),
                            os.path.join(directory, "model.safetensors.index.json"))
            op = self.load(directory)
            self.assertEqual(op.state, pb.OPERATION_STATE_FAILED, name)
            self.assertEqual(op.error.code, PERMISSION, "%s: %s" % (name, op.error.message))
            self.assertIn("outside", op.error.message)
            for leak in ["length prefix", "root:"] + [" %s " % s for s in sizes]:
                self.assertNotIn(leak, op.error.message, name)
        self.assertEqual(self.d.call("DescribeModel", pb.DescribeModelRequest()).source, before)
        # A plan reads config.json under the same rule.
        op = wait_done(self.d, self.d.call("PlanMemory", pb.PlanMemoryRequest(
            hf_config_dir=os.path.join(self.inside, "config-out"))).id)
        self.assertEqual(op.error.code, PERMISSION, op.error.message)


class MetricsUnderIdleConnectionsTest(unittest.TestCase):
    """/metrics is one epoll loop: 256 idle connections, re-opened as soon as
    the server drops them, and 16 that trickle a request a byte at a time,
    leave every scrape under 100 ms."""

    IDLE, SLOW, SCRAPES = 256, 16, 20

    def test_idle_and_slow_connections_do_not_slow_a_scrape(self):
        d = Daemon("--model=")
        stop = threading.Event()
        port = d.metrics_port

        def connect():
            return socket.create_connection(("127.0.0.1", port), timeout=5)

        idle = [connect() for _ in range(self.IDLE)]
        slow = [connect() for _ in range(self.SLOW)]
        reopened = [0]

        def attacker():
            while not stop.is_set():
                for i, sock in enumerate(idle):
                    try:
                        gone = sock.recv(1, socket.MSG_DONTWAIT) == b""
                    except BlockingIOError:
                        gone = False
                    except OSError:
                        gone = True
                    if gone:
                        sock.close()
                        idle[i] = connect()
                        reopened[0] += 1
                for sock in slow:
                    try:
                        sock.send(b"G")
                    except OSError:
                        pass
                stop.wait(0.2)

        thread = threading.Thread(target=attacker)
        thread.start()
        try:
            times = []
            for _ in range(self.SCRAPES):
                start = time.time()
                with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                            timeout=20) as r:
                    body = r.read()
                times.append(time.time() - start)
                self.assertIn(b"memprofd_build_info", body)
                time.sleep(0.15)
            print("%d scrapes beside %d idle (%d re-opened) and %d slow connections: "
                  "worst %.1f ms, median %.1f ms" % (
                      self.SCRAPES, self.IDLE, reopened[0], self.SLOW,
                      max(times) * 1e3, sorted(times)[len(times) // 2] * 1e3))
            self.assertLess(max(times), 0.1)
            # What is not a scrape is answered, not waited on.
            for request, status in ((b"GET /other HTTP/1.1\r\n\r\n", b" 404 "),
                                    (b"POST /metrics HTTP/1.1\r\n\r\n", b" 405 "),
                                    (b"hello\r\n\r\n", b" 400 "),
                                    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000, b" 400 ")):
                sock = connect()
                sock.sendall(request)
                self.assertIn(status, sock.recv(4096).split(b"\r\n")[0], request[:20])
                sock.close()
        finally:
            stop.set()
            thread.join()
            for sock in idle + slow:
                sock.close()
            d.stop()
            d.close()


if __name__ == "__main__":
    unittest.main()
