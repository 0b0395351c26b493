"""Data parallel over the wire: real memprofd daemons as the ranks of one
c10d run (Gloo on loopback, one intra-op thread each), started the way a
launcher starts them — with plain RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT, and by torchrun itself — and driven through rank 0's gRPC API
by this independent client.

- 2 ranks x batch 2 train as 1 process x batch 4: every step's report on
  every rank carries the global batch's loss (the same on both ranks, the
  mean of their own rank_loss, within 1e-6 relative of the one process's)
  and tokens, the weights within a
  bound relative to how far training moved them (AdamW's 1/sqrt(v)
  amplifies the last-bit differences of sums taken in another order), and
  parameter drift 0 between the ranks.
- A snapshot asked of rank 0 mid-run is written once and loads in the real
  transformers; the followers serve status and memory and refuse changes
  with FAILED_PRECONDITION naming rank 0.
- A rank SIGKILLed mid-run makes rank 0 fail within the collective timeout,
  go NOT_SERVING and exit non-zero, with nothing partial published; both
  ranks restarted with --resume=latest end with the uninterrupted run's
  weights, bit for bit.
- --sharding=optimizer ranks train as unsharded ones and report the level;
  ranks started with different levels, or a level that is unknown or not
  built, do not start.
- torchrun --no-python starts a run, and two ranks on two "hosts" (network
  namespaces joined by a veth pair) train as one."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

if not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import grpc  # noqa: E402

import harness  # noqa: E402
from harness import Daemon, free_port, pb, wait_done  # noqa: E402

MICRO_DIR = harness.micro_model_dir()
# The micro model as Qwen2: q/k/v biases, and a window of 8 keys (of RUN's
# 32-token sequences) on its second layer.
QWEN2_DIR = harness.micro_model_dir(
    "micro-qwen2", architectures=["Qwen2ForCausalLM"], model_type="qwen2",
    use_sliding_window=True, sliding_window=8, max_window_layers=1)
# As Qwen3 (q/k norms) and as a Llama 3 (llama3 rotary scaling from 16
# original positions, half the sequence).
QWEN3_DIR = harness.micro_model_dir(
    "micro-qwen3", architectures=["Qwen3ForCausalLM"], model_type="qwen3")
LLAMA3_DIR = harness.micro_model_dir(
    "micro-llama3", rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 16})

RUN = dict(seq_len=32, seed=11, learning_rate=1e-2, weight_decay=0.0, max_grad_norm=0.0)
def start_ranks(world, *flags, timeout=10, model_seed=None, hosts=None, model=MICRO_DIR,
                rank_flags=None, wait=True):
    """`world` daemons joined as one run on a fresh store port. Rank 0 first;
    all are started before any is waited for (each blocks in its rendezvous
    until all have joined). Each rank gets --model_seed=rank unless told:
    rank 0's weights must win. `rank_flags[rank]`: that rank's own flags.
    `wait=False` returns them unwaited (for runs that must fail to start)."""
    port = free_port()
    daemons = []
    for rank in range(world):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        wrapper, listen = (), []
        if hosts is not None:
            # One rank per host (TwoHostsTest): the host's namespace, its
            # address, and the interface Gloo must use there.
            namespace, address, interface = hosts[rank]
            wrapper = ("ip", "netns", "exec", namespace)
            env.update({"MASTER_ADDR": hosts[0][1], "GLOO_SOCKET_IFNAME": interface,
                        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank)})
            listen = ["--listen=%s:0" % address, "--metrics_listen=%s:0" % address]
        seed = rank if model_seed is None else model_seed
        own = rank_flags[rank] if rank_flags is not None else ()
        daemons.append(Daemon("--model=" + model, "--model_seed=%d" % seed,
                              "--collective_timeout_seconds=%d" % timeout, *listen, *flags,
                              *own, env=env, wait=False, start_timeout=120, wrapper=wrapper))
    if wait:
        for d in daemons:
            d.wait_ready()
    return daemons


def close_all(daemons):
    for d in daemons:
        d.close()


def close_unready(daemons):
    """close_all for daemons that never served (wait_ready was not called)."""
    for d in daemons:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        d.log.close()
        d.tmp.cleanup()


def weights(directory):
    from safetensors.torch import load_file
    return load_file(os.path.join(directory, "model.safetensors"))


def max_difference(a, b):
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def snapshot(d, name, **kwargs):
    op = wait_done(d, d.call("Snapshot", pb.SnapshotRequest(name=name, **kwargs)).id)
    assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.error.message
    return op.snapshot


def train(d, **kwargs):
    request = dict(RUN)
    request.update(kwargs)
    return d.call("Train", pb.TrainRequest(**request))


def model_state_bytes(d, timeout=30):
    """d's bytes by category once no parameters are gathered there (a
    follower frees them a moment after rank 0's operation is done), or at the
    timeout."""
    deadline = time.time() + timeout
    while True:
        stats = d.call("GetMemoryStats", pb.GetMemoryStatsRequest())
        categories = {c.category: c.bytes for c in stats.categories}
        if categories.get("gathered_parameters", 0) == 0 or time.time() > deadline:
            return categories
        time.sleep(0.2)


def data_parallel_when(d, ready, timeout=30):
    """d's GetStatus.data_parallel once ready(it) holds, or at the timeout."""
    deadline = time.time() + timeout
    while True:
        dp = d.call("GetStatus", pb.GetStatusRequest()).data_parallel
        if ready(dp) or time.time() > deadline:
            return dp
        time.sleep(0.05)


def status_at_steps(d, steps, timeout=30):
    """d's status once its model has trained `steps` steps, or at the timeout.
    A follower ends its copy of a training a moment after rank 0 ends its own
    (each rank takes its optimizer step after the step's last all-reduce), so
    a status read just as rank 0's operation is done may show the step before."""
    deadline = time.time() + timeout
    while True:
        status = d.call("GetStatus", pb.GetStatusRequest())
        if status.model.steps_trained >= steps or time.time() > deadline:
            return status
        time.sleep(0.05)


def metric(text, name):
    """The value of the one sample of `name` (any labels) in /metrics text."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert len(values) == 1, (name, values)
    return values[0]


class TwoRanksTest(unittest.TestCase):
    """One 2-rank run for the cases that only read it."""

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.TemporaryDirectory(prefix="memprofd-dist-root-")
        cls.ranks = start_ranks(2, "--snapshot_root=" + cls.root.name)
        cls.leader, cls.follower = cls.ranks
        # A longer run, so that a snapshot can be asked for in the middle.
        cls.op = train(cls.leader, steps=30, batch_size=2)
        reports = cls.leader.stub.StreamStepReports(
            pb.StreamStepReportsRequest(operation_id=cls.op.id), timeout=300)
        for r in reports:
            if r.step >= 3:
                reports.cancel()
                break
        cls.mid = snapshot(cls.leader, "mid-run")
        cls.done = wait_done(cls.leader, cls.op.id)

    @classmethod
    def tearDownClass(cls):
        close_all(cls.ranks)
        cls.root.cleanup()

    def test_every_rank_trains_and_the_replicas_agree(self):
        self.assertEqual(self.done.state, pb.OPERATION_STATE_SUCCEEDED, self.done.error.message)
        for d in self.ranks:
            status = status_at_steps(d, 30)
            self.assertEqual(status.model.steps_trained, 30)
            self.assertEqual(status.data_parallel.world_size, 2)
            self.assertTrue(status.data_parallel.has_parameter_drift)
            self.assertEqual(status.data_parallel.parameter_drift, 0.0)
            self.assertGreater(status.data_parallel.allreduce_bytes, 0)
            self.assertEqual(metric(d.metrics_text(), "memprofd_dp_parameter_drift"), 0.0)
            text = d.metrics_text()
            self.assertEqual(metric(text, "memprofd_dp_drift_checks_total"), 3)
            # The micro model's gradients fit one bucket, whose all-reduce
            # starts from the last gradient hook, inside backward.
            buckets = [line for line in text.splitlines()
                       if line.startswith("memprofd_dp_buckets{")]
            self.assertEqual(len(buckets), 2, buckets)
            self.assertTrue(any('started="in_backward"' in b and b.endswith(" 1")
                                for b in buckets), buckets)
        self.assertEqual(self.leader.call("GetStatus", pb.GetStatusRequest()).data_parallel.role,
                         "leader")
        follower = self.follower.call("GetStatus", pb.GetStatusRequest()).data_parallel
        self.assertEqual((follower.rank, follower.role, follower.launcher),
                         (1, "follower", "torchrun"))
        # An idle follower polls for commands without c10d's timed-out-wait
        # warning every second.
        self.assertNotIn("timed out", self.follower.output())
        # The follower ran the same operation, step for step.
        ops = self.follower.call("ListOperations", pb.ListOperationsRequest()).operations
        trains = [o for o in ops if o.kind == pb.OPERATION_KIND_TRAIN]
        self.assertEqual(len(trains), 1)
        self.assertEqual(trains[0].state, pb.OPERATION_STATE_SUCCEEDED)

    def test_snapshot_mid_run_is_written_once_and_loads_in_transformers(self):
        names = [s.name for s in
                 self.leader.call("ListSnapshots", pb.ListSnapshotsRequest()).snapshots]
        self.assertEqual(names.count("mid-run"), 1, names)
        self.assertGreaterEqual(self.mid.global_step, 3)
        self.assertLess(self.mid.global_step, 30)
        # The follower sees the same root, and wrote nothing of its own.
        self.assertEqual(
            [s.name for s in
             self.follower.call("ListSnapshots", pb.ListSnapshotsRequest()).snapshots], names)
        import transformers
        from transformers import AutoModelForCausalLM
        transformers.logging.set_verbosity_error()
        model, info = AutoModelForCausalLM.from_pretrained(self.mid.directory,
                                                           output_loading_info=True)
        for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(set(info[key]), set(), key)

    def test_followers_read_and_refuse_changes_naming_rank_zero(self):
        f = self.follower
        refused = [
            ("Train", pb.TrainRequest(steps=1)),
            ("Snapshot", pb.SnapshotRequest(name="from-rank-1")),
            ("LoadModel", pb.LoadModelRequest(preset="tiny")),
            ("DeleteSnapshot", pb.DeleteSnapshotRequest(name="mid-run")),
            ("CancelOperation", pb.CancelOperationRequest(id=self.op.id)),
            ("Evaluate", pb.EvaluateRequest()),
            ("GetMemoryStats", pb.GetMemoryStatsRequest(all_ranks=True)),
        ]
        for method, request in refused:
            with self.subTest(method=method):
                with self.assertRaises(grpc.RpcError) as e:
                    f.call(method, request)
                self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
                self.assertIn("rank 0", e.exception.details())
        # What reads works, and the follower serves.
        f.call("GetMemoryStats", pb.GetMemoryStatsRequest())
        f.call("DescribeModel", pb.DescribeModelRequest())
        health = f.health.Check(harness.health_pb2.HealthCheckRequest(service=""), timeout=10)
        self.assertEqual(health.status, harness.health_pb2.HealthCheckResponse.SERVING)
        self.assertIn("memprofd_train_steps_total", f.metrics_text())
        # Nothing was lost: the snapshot is still there.
        self.leader.call("DescribeSnapshot", pb.DescribeSnapshotRequest(name="mid-run"))

    def test_rank_zero_gathers_every_ranks_memory(self):
        deadline = time.time() + 30
        while True:
            stats = self.leader.call("GetMemoryStats", pb.GetMemoryStatsRequest(all_ranks=True))
            if all(r.ok and r.steps_total == 30 for r in stats.ranks) or time.time() > deadline:
                break
            time.sleep(0.5)  # followers publish about once a second
        self.assertEqual([r.rank for r in stats.ranks], [0, 1])
        for r in stats.ranks:
            self.assertTrue(r.ok, r.error)
            self.assertEqual(r.steps_total, 30)
            self.assertGreater(r.current_bytes, 0)
            self.assertGreater(r.last_step_peak_bytes, 0)
            self.assertLess(r.age_seconds, 10)
        peaks = [r.last_step_peak_bytes for r in stats.ranks]
        self.assertEqual(stats.step_peak_imbalance_bytes, max(peaks) - min(peaks))
        now = [r.current_bytes for r in stats.ranks]
        self.assertEqual(stats.current_imbalance_bytes, max(now) - min(now))
        # Without all_ranks the reply is this rank's alone, as before.
        self.assertEqual(len(self.leader.call("GetMemoryStats",
                                              pb.GetMemoryStatsRequest()).ranks), 0)


def step_reports(d, kind_filter=pb.OPERATION_KIND_TRAIN):
    """{step: StepReport} of the newest training operation on `d` (its step stream)."""
    ops = d.call("ListOperations", pb.ListOperationsRequest(kind=kind_filter)).operations
    op = ops[0]  # newest first
    stream = d.stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=op.id),
                                      timeout=60)
    return {r.step: r for r in stream}



class AdmissionTest(unittest.TestCase):
    def test_rank_zero_refuses_a_step_no_rank_could_hold_before_any_rank_allocates(self):
        ranks = start_ranks(2)
        try:
            leader, follower = ranks
            op = wait_done(leader, train(leader, steps=1, batch_size=2 ** 16, seq_len=128).id,
                           timeout=300)
            print("2 ranks, batch 65536 x 128: %s" % op.error.message[:200])
            self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
            self.assertEqual(op.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                             op.error.message)
            self.assertIn("refused before it allocated", op.error.message)
            # The command never reached the follower, and the run is whole.
            ops = follower.call("ListOperations", pb.ListOperationsRequest()).operations
            self.assertEqual([o for o in ops if o.kind == pb.OPERATION_KIND_TRAIN], [])
            for d in ranks:
                self.assertIsNone(d.proc.poll(), d.output())
            # A step that fits runs on both ranks, planned on rank 0.
            done = wait_done(leader, train(leader, steps=2, batch_size=2).id, timeout=300)
            self.assertEqual(done.state, pb.OPERATION_STATE_SUCCEEDED, done.error.message)
            self.assertGreater(done.train.planned_peak_bytes, 0)
            self.assertEqual(status_at_steps(follower, 2).model.steps_trained, 2)
        finally:
            close_all(ranks)


def cpu_peak(d):
    """The most bytes `d` has held on its CPU device since it started (the
    recorder's peak: load, run and all)."""
    devices = d.call("GetMemoryStats", pb.GetMemoryStatsRequest()).devices
    return next(m.peak_bytes for m in devices if m.device == "cpu")


class DeviceMemoryLimitTest(unittest.TestCase):
    """--device_memory_limit emulates a smaller device: set between what one
    process peaks at and what a rank of a 2-rank fully sharded run peaks at
    (load, steps and all), the one process runs out of memory, with an OOM
    report that names the limit, or is refused before it allocates; the two
    ranks train under it, to the losses they reach without it."""
    MODEL = "tiny"  # 4.0M float32 parameters: AdamW's state outweighs a step's activations
    STEPS = 2

    def train_to_end(self, d, batch_size):
        op = wait_done(d, train(d, steps=self.STEPS, batch_size=batch_size).id, timeout=300)
        return op

    def test_a_limit_one_process_cannot_train_under_two_fully_sharded_ranks_can(self):
        # Unlimited: the peaks the limit goes between, and the losses.
        ranks = start_ranks(2, "--sharding=full", model=self.MODEL)
        try:
            op = self.train_to_end(ranks[0], 1)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            status_at_steps(ranks[1], self.STEPS)
            rank_peak = max(cpu_peak(d) for d in ranks)
            losses = [r.loss for _, r in sorted(step_reports(ranks[0]).items())]
        finally:
            close_all(ranks)
        single = Daemon("--model=" + self.MODEL, "--model_seed=0")
        try:
            op = self.train_to_end(single, 2)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            one_peak = cpu_peak(single)
        finally:
            single.close()
        limit = (one_peak + rank_peak) // 2
        print("\n%s, %d steps of 2 sequences: one process peaks at %d bytes, a rank of 2 "
              "fully sharded ones at %d; limit %d" % (self.MODEL, self.STEPS, one_peak,
                                                     rank_peak, limit))
        # Room on both sides, so that neither outcome rests on a few bytes.
        self.assertGreater(one_peak, rank_peak * 1.1)

        flag = "--device_memory_limit=%d" % limit
        reports = tempfile.TemporaryDirectory(prefix="memprofd-limit-")
        self.addCleanup(reports.cleanup)
        # Run for real (no admission): the step fails as out of memory.
        unrefused = Daemon("--model=" + self.MODEL, "--model_seed=0", flag,
                           "--refuse_unfit_steps=false", "--report_dir=" + reports.name)
        refusing = Daemon("--model=" + self.MODEL, "--model_seed=0", flag)
        try:
            op = self.train_to_end(unrefused, 2)
            self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
            self.assertEqual(op.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                             op.error.message)
            self.assertIn("out of memory", op.error.message)
            self.assertIn("device_memory_limit", op.error.message)
            report = unrefused.call("GetLastOomReport", pb.GetLastOomReportRequest())
            self.assertTrue(report.captured, report.error)
            self.assertEqual(report.total_bytes, limit)
            self.assertLess(report.free_bytes, report.requested_bytes)
            # The request failed because it would have gone beyond the limit.
            self.assertLessEqual(report.allocated_bytes, limit)
            self.assertGreater(report.allocated_bytes + report.requested_bytes, limit)
            self.assertTrue(report.path.startswith(reports.name), report.path)
            self.assertLessEqual(cpu_peak(unrefused), limit)
            # Admission plans against what the limit leaves.
            op = self.train_to_end(refusing, 2)
            self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
            self.assertEqual(op.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                             op.error.message)
            self.assertIn("refused before it allocated", op.error.message)
            for d in (unrefused, refusing):
                status = d.call("GetStatus", pb.GetStatusRequest())
                self.assertEqual(status.serving_state, "SERVING")
        finally:
            unrefused.close()
            refusing.close()

        ranks = start_ranks(2, "--sharding=full", flag, model=self.MODEL)
        try:
            op = self.train_to_end(ranks[0], 1)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            status_at_steps(ranks[1], self.STEPS)
            peaks = [cpu_peak(d) for d in ranks]
            limited = [r.loss for _, r in sorted(step_reports(ranks[0]).items())]
        finally:
            close_all(ranks)
        self.assertLessEqual(max(peaks), limit)
        self.assertEqual(limited, losses)


class LoadModelTest(unittest.TestCase):
    def test_load_on_rank_zero_reaches_every_rank(self):
        ranks = start_ranks(2)
        try:
            op = wait_done(ranks[0], ranks[0].call("LoadModel", pb.LoadModelRequest(
                preset="tiny", seed=3)).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            deadline = time.time() + 60
            while time.time() < deadline:
                model = ranks[1].call("GetStatus", pb.GetStatusRequest()).model
                if model.source == "preset:tiny":
                    break
                time.sleep(0.2)
            self.assertEqual(model.source, "preset:tiny")
            with self.assertRaises(grpc.RpcError) as e:  # no placement across ranks
                ranks[0].call("LoadModel", pb.LoadModelRequest(
                    preset="tiny", placement=[pb.ModulePlacement(module="model.layers.0",
                                                         placement=pb.PLACEMENT_CPU)]))
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
            op = wait_done(ranks[0], train(ranks[0], steps=2, batch_size=1, seq_len=16).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            for d in ranks:
                status = status_at_steps(d, 2)
                self.assertEqual(status.model.steps_trained, 2)
                self.assertEqual(status.data_parallel.parameter_drift, 0.0)
        finally:
            close_all(ranks)


class EquivalenceTest(unittest.TestCase):
    STEPS = 6

    def test_two_ranks_match_one_process_with_twice_the_batch(self):
        self.check_two_ranks_match_one_process(MICRO_DIR)

    def test_two_ranks_match_one_process_for_qwen2_qwen3_and_a_llama3_scaled_llama(self):
        for model in (QWEN2_DIR, QWEN3_DIR, LLAMA3_DIR):
            with self.subTest(model):
                self.check_two_ranks_match_one_process(model)

    def check_two_ranks_match_one_process(self, model):
        root = tempfile.TemporaryDirectory(prefix="memprofd-dist-eq-")
        ranks = start_ranks(2, "--snapshot_root=" + os.path.join(root.name, "two"), model=model)
        single = Daemon("--model=" + model, "--model_seed=0",
                        "--snapshot_root=" + os.path.join(root.name, "one"))
        try:
            start = weights(snapshot(single, "start").directory)
            wait_done(ranks[0], train(ranks[0], steps=self.STEPS, batch_size=2).id)
            wait_done(single, train(single, steps=self.STEPS, batch_size=4).id)
            two = weights(snapshot(ranks[0], "end").directory)
            one = weights(snapshot(single, "end").directory)
            rank_reports = [step_reports(d) for d in ranks]
            one_reports = step_reports(single)
        finally:
            close_all(ranks + [single])
            root.cleanup()
        steps = list(range(1, self.STEPS + 1))
        self.assertEqual(sorted(one_reports), steps)
        for reports in rank_reports:
            self.assertEqual(sorted(reports), steps)
        for k in steps:
            two_ranks = [reports[k] for reports in rank_reports]
            one_report = one_reports[k]
            # Every rank reports the global batch: the same loss, bit for bit,
            # and the tokens of the whole batch; its own half moves to rank_loss.
            self.assertEqual(two_ranks[0].loss, two_ranks[1].loss)
            self.assertEqual([r.tokens for r in two_ranks], [one_report.tokens] * 2)
            self.assertFalse(one_report.HasField("rank_loss"))
            self.assertTrue(all(r.HasField("rank_loss") for r in two_ranks))
            self.assertNotEqual(two_ranks[0].rank_loss, two_ranks[1].rank_loss)
            self.assertAlmostEqual(
                (two_ranks[0].rank_loss + two_ranks[1].rank_loss) / 2, two_ranks[0].loss,
                delta=1e-12 * two_ranks[0].loss)
        loss_gaps = [abs(rank_reports[0][k].loss - one_reports[k].loss) / one_reports[k].loss
                     for k in steps]
        difference = max_difference(two, one)
        moved = max_difference(one, start)
        print("\n%s: 2 ranks x batch 2 vs 1 x batch 4, %d AdamW steps at lr 1e-2:"
              % (os.path.basename(model), self.STEPS))
        print("  step 1 loss (same weights): relative gap %.3g" % loss_gaps[0])
        print("  later steps' losses: largest relative gap %.3g" % max(loss_gaps))
        print("  weights: max |dw| %.3g, training moved them by %.3g (ratio %.2g)"
              % (difference, moved, difference / moved))
        # Step 1 runs both on the same weights: its loss differs only by the
        # order of float32 sums.
        self.assertLess(loss_gaps[0], 1e-6)
        # The weights then differ by rounding that AdamW's 1/sqrt(v) turns
        # into up to a fraction of lr for nearly cancelled gradients (see
        # tests/dist/data_parallel_test.cc): a bound relative to how far
        # training moved them. A real fault (a gradient not averaged, a
        # shard read twice) changes every update by about lr, a ratio of
        # order 1/STEPS = 0.17, a hundred times the bound.
        self.assertLess(difference, 2e-3 * moved)
        # Every step's loss stays within 1e-6 (measured: 1.5e-7).
        self.assertLess(max(loss_gaps), 1e-6)
        self.assertGreater(moved, 1e-3)


class LoraEquivalenceTest(unittest.TestCase):
    """LoRA adapters (docs/lora.md) train across two ranks as in one process
    with twice the batch: the adapters get the same init from the run's seed
    on every rank, only their gradients are averaged (the base is frozen),
    and rank 0's adapter snapshot holds what the single process's does."""

    STEPS = 4

    def run_both(self, sharding="none", **fields):
        """Trains the adapters on 2 ranks at batch 2 (with `sharding`) and in
        one process at batch 4: (step reports of each rank, of the process,
        rank 0's and the process's adapters)."""
        root = tempfile.TemporaryDirectory(prefix="memprofd-dist-lora-")
        ranks = start_ranks(2, "--snapshot_root=" + os.path.join(root.name, "two"),
                            "--sharding=" + sharding)
        single = Daemon("--model=" + MICRO_DIR, "--model_seed=0",
                        "--snapshot_root=" + os.path.join(root.name, "one"))
        lora = dict(lora_r=4, lora_alpha=8, lora_targets="all-linear", **fields)
        try:
            two_op = wait_done(ranks[0], train(ranks[0], steps=self.STEPS, batch_size=2,
                                                **lora).id)
            one_op = wait_done(single, train(single, steps=self.STEPS, batch_size=4,
                                             **lora).id)
            self.assertEqual(two_op.state, pb.OPERATION_STATE_SUCCEEDED, two_op.error.message)
            self.assertEqual(one_op.state, pb.OPERATION_STATE_SUCCEEDED, one_op.error.message)
            kind = dict(kind=pb.SNAPSHOT_KIND_ADAPTER)
            from safetensors.torch import load_file
            two = load_file(os.path.join(snapshot(ranks[0], "end", **kind).directory,
                                         "adapter_model.safetensors"))
            one = load_file(os.path.join(snapshot(single, "end", **kind).directory,
                                         "adapter_model.safetensors"))
            rank_reports = [step_reports(d) for d in ranks]
            one_reports = step_reports(single)
        finally:
            close_all(ranks + [single])
            root.cleanup()
        return rank_reports, one_reports, two, one

    def compare(self, label, **fields):
        """run_both(**fields), its figures printed under `label`: the
        relative loss gap of each step, the adapters' largest difference, and
        how far B moved from zero (its init), which measures the training.
        Both ranks report the global batch's loss at every step."""
        rank_reports, one_reports, two, one = self.run_both(**fields)
        gaps = [abs(rank_reports[0][s].loss - one_reports[s].loss) / one_reports[s].loss
                for s in sorted(one_reports)]
        difference = max_difference(two, one)
        moved = max(float(t.abs().max()) for k, t in one.items() if "lora_B" in k)
        print("\nLoRA r 4 on every projection, %s, 2 ranks x batch 2 vs 1 x batch 4, %d "
              "steps: loss gaps %s, adapters max |d| %.3g, B moved %.3g"
              % (label, self.STEPS, ", ".join("%.2g" % g for g in gaps), difference, moved))
        for step in one_reports:
            self.assertEqual(rank_reports[0][step].loss, rank_reports[1][step].loss, label)
        self.assertGreater(moved, 1e-3, label)
        return gaps, difference, moved

    def test_two_ranks_train_the_adapters_of_one_process_with_twice_the_batch(self):
        gaps, difference, moved = self.compare("float32")
        self.assertLess(max(gaps), 1e-6)
        self.assertLess(difference, 2e-3 * moved)

    def test_sharded_adapter_state_trains_as_in_one_process(self):
        # The adapters are the trainable parameters: each rank keeps AdamW's
        # state of its pieces of them (and with gradients, their gradients'
        # pieces), the frozen base whole.
        for level in ("optimizer", "gradients"):
            gaps, difference, moved = self.compare("--sharding=" + level, sharding=level)
            self.assertLess(max(gaps), 1e-6, level)
            self.assertLess(difference, 2e-3 * moved, level)

    def test_a_sharded_adapter_checkpoint_resumes_in_one_process(self):
        # Each rank writes its pieces of the adapters' optimizer state; one
        # process assembles them and goes on from the checkpoint's step.
        root = tempfile.TemporaryDirectory(prefix="memprofd-dist-lora-ck-")
        self.addCleanup(root.cleanup)
        ranks = start_ranks(2, "--snapshot_root=" + root.name, "--sharding=gradients")
        try:
            op = wait_done(ranks[0], train(ranks[0], steps=2, batch_size=2, lora_r=4,
                                           lora_alpha=8).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            ck = snapshot(ranks[0], "ck", kind=pb.SNAPSHOT_KIND_CHECKPOINT).directory
        finally:
            close_all(ranks)
        files = set(os.listdir(ck))
        for f in ("adapter_model.safetensors", "optimizer_sharding.json",
                  "optimizer-rank-00000-of-00002.safetensors",
                  "optimizer-rank-00001-of-00002.safetensors"):
            self.assertIn(f, files)
        with open(os.path.join(ck, "optimizer_sharding.json")) as f:
            described = [p["parameter"] for p in json.load(f)["parameters"]]
        self.assertTrue(described)
        self.assertTrue(all("lora_" in name for name in described), described)
        # Rank 0's base (seed 0) under the adapters, as the ranks trained it.
        single = Daemon("--model=" + MICRO_DIR, "--snapshot_root=" + root.name)
        try:
            op = wait_done(single, single.call("LoadModel", pb.LoadModelRequest(
                hf_directory=MICRO_DIR, init_weights=True, seed=0, lora_adapter=ck,
                resume=True)).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            self.assertEqual(op.model.steps_trained, 2)
            op = wait_done(single, single.call("Train", pb.TrainRequest(resume=True,
                                                                        steps=3)).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            self.assertEqual((op.train.steps_completed, op.train.global_step), (3, 5))
        finally:
            single.close()

    def test_full_sharding_refuses_adapters_naming_what_works(self):
        ranks = start_ranks(2, "--sharding=full")
        try:
            op = wait_done(ranks[0], train(ranks[0], steps=1, batch_size=2, lora_r=4).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
            self.assertEqual(op.error.code, grpc.StatusCode.UNIMPLEMENTED.value[0])
            self.assertIn("--sharding=gradients", op.error.message)
            # Refused alike on both ranks, before any collective: the ranks
            # stay in step and train without adapters.
            op = wait_done(ranks[0], train(ranks[0], steps=1, batch_size=2).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        finally:
            close_all(ranks)

    def test_a_bf16_base_trains_across_ranks_as_in_one_process(self):
        # Each rank casts its base as the run starts, and rank 0's weights are
        # broadcast in bf16.
        gaps, difference, moved = self.compare("bf16 base under bf16 autocast",
                                               mixed_precision="bf16", base_dtype="bf16")
        # Step 1 runs the same weights on the same tokens.
        self.assertLess(gaps[0], 1e-6)
        # After it, bf16 autocast rounds the matmuls of batch 2 and batch 4
        # apart (1e-3 relative), and AdamW's normalised update turns that
        # into up to lr for nearly cancelled gradients: with a float32 base
        # under the same autocast the adapters differ by 0.017 where B moved
        # 0.040. The losses stay within 1e-4.
        self.assertLess(max(gaps), 1e-4)
        self.assertLess(difference, moved)


class ShardingTest(unittest.TestCase):
    """--sharding: 2 fully sharded ranks (ZeRO-3: each keeps its own
    parameters, gradients and AdamW state only) train as 2 unsharded ones;
    the checkpoints taken at their step boundaries, written by rank 0 from
    parameters gathered one at a time, hold the unsharded run's weights and
    load in transformers with its loss; an evaluation asked for mid-run
    gathers the model unit by unit; the model is whole again after the run. Ranks started
    with different levels, or with an unknown level, do not start."""
    # Long enough that an evaluation asked for after step 1 runs inside the
    # run, and that two checkpoints (steps 4 and 8) fall at its boundaries.
    STEPS = 12
    EVERY = 4

    def test_fully_sharded_ranks_train_as_unsharded_ones(self):
        root = tempfile.TemporaryDirectory(prefix="memprofd-sharding-")
        self.addCleanup(root.cleanup)
        runs = {level: start_ranks(2, "--sharding=" + level,
                                   "--snapshot_root=" + os.path.join(root.name, level),
                                   "--snapshot_every_steps=%d" % self.EVERY)
                for level in ("none", "full")}
        try:
            reports, statuses, weights_after, evals, periodic = {}, {}, {}, {}, {}
            held, held_after_eval, idle_evals, next_runs = {}, {}, {}, {}
            kept, after_lora, after_load, kept_ctl = {}, {}, {}, {}
            for level, ranks in runs.items():
                leader = ranks[0]
                train_op = train(leader, steps=self.STEPS, batch_size=2)
                stream = leader.stub.StreamStepReports(
                    pb.StreamStepReportsRequest(operation_id=train_op.id), timeout=300)
                for r in stream:
                    if r.step >= 1:
                        stream.cancel()
                        break
                # Queued for the next step boundary of the run.
                eval_id = leader.call("Evaluate", pb.EvaluateRequest(
                    batch_size=2, seq_len=32, max_batches=2)).id
                op = wait_done(leader, train_op.id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
                evaluated = wait_done(leader, eval_id)
                self.assertEqual(evaluated.state, pb.OPERATION_STATE_SUCCEEDED,
                                 evaluated.error.message)
                evals[level] = evaluated.evaluate
                reports[level] = [step_reports(d) for d in ranks]
                statuses[level] = [status_at_steps(d, self.STEPS) for d in ranks]
                # Between runs: each rank's parameter and optimizer bytes, then
                # an evaluation there, and the bytes again after it.
                held[level] = [model_state_bytes(d) for d in ranks]
                evaluated = wait_done(leader, leader.call("Evaluate", pb.EvaluateRequest(
                    batch_size=2, seq_len=32, max_batches=2)).id)
                self.assertEqual(evaluated.state, pb.OPERATION_STATE_SUCCEEDED,
                                 evaluated.error.message)
                idle_evals[level] = evaluated.evaluate
                held_after_eval[level] = [model_state_bytes(d) for d in ranks]
                listed = leader.call("ListSnapshots", pb.ListSnapshotsRequest()).snapshots
                periodic[level] = {m.name: m for m in listed}
                # Written by rank 0 after the run: the whole model, every
                # parameter back from the rank that owns it.
                weights_after[level] = weights(snapshot(leader, "after-" + level).directory)
                # A run after it goes on from the model it kept, sharded or
                # not: fully sharded, from the shards, never gathered whole.
                op = wait_done(leader, train(leader, steps=2, batch_size=2).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
                next_runs[level] = op.train
                # (A follower keeps its shards a moment after rank 0.)
                kept[level] = [data_parallel_when(
                    d, lambda dp: dp.model_sharded == (level == "full")) for d in ranks]
                kept_ctl[level] = (leader.ctl("status"), leader.ctl(
                    "evaluate", "--batch_size", "2", "--seq_len", "32", "--max_batches", "1"))
                # A run that would add adapters is refused (fully sharded:
                # before anything changes), and the model stays as it was.
                op = wait_done(leader, train(leader, steps=1, batch_size=2, lora_r=4).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
                self.assertIn("--sharding=gradients" if level == "full"
                              else "trained every parameter", op.error.message)
                after_lora[level] = [data_parallel_when(
                    d, lambda dp: dp.model_sharded == (level == "full")) for d in ranks]
                # A load gathers the sharded model whole first, once, on
                # every rank, and leaves the new model whole.
                op = wait_done(leader, leader.call("LoadModel", pb.LoadModelRequest(
                    preset="tiny", seed=3)).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
                after_load[level] = [data_parallel_when(
                    d, lambda dp: dp.whole_model_gathers == int(level == "full"))
                    for d in ranks]
            sharded = runs["full"]
            metrics = [d.metrics_text() for d in sharded]
            ctl = sharded[1].ctl("status")
        finally:
            close_all(runs["none"] + runs["full"])
        steps = list(range(1, self.STEPS + 1))
        for level in runs:
            for rank, status in enumerate(statuses[level]):
                self.assertEqual(status.data_parallel.sharding, level)
                # The levels --sharding accepts, as features a client can test.
                for built in ("optimizer", "gradients", "full"):
                    self.assertIn("sharding_" + built, status.build.features)
                self.assertEqual(status.model.steps_trained, self.STEPS)
                # Full sharding keeps one copy of each parameter: no drift
                # between replicas to check.
                self.assertEqual(status.data_parallel.has_parameter_drift, level == "none")
                self.assertEqual(sorted(reports[level][rank]), steps)
                # The parameter gathers of the last step: full sharding only.
                dp = status.data_parallel
                if level == "full":
                    self.assertGreater(dp.owned_parameter_bytes, 0)
                    self.assertGreater(dp.peak_gathered_parameter_bytes, 0)
                    self.assertGreater(dp.parameter_gathers, 0)
                    self.assertGreaterEqual(dp.gather_exposed_seconds, 0)
                else:
                    self.assertEqual((dp.owned_parameter_bytes, dp.parameter_gathers), (0, 0))
        owned = [s.data_parallel.owned_parameter_bytes for s in statuses["full"]]
        model_bytes = sum(t.numel() * t.element_size() for t in weights_after["none"].values())
        # Each parameter is owned by one rank (the tied head is the embedding).
        self.assertEqual(sum(owned), model_bytes)
        gaps = [abs(reports["full"][rank][k].loss - reports["none"][0][k].loss)
                / reports["none"][0][k].loss for rank in (0, 1) for k in steps]
        gap = max_difference(weights_after["full"], weights_after["none"])
        print("\n2 ranks, fully sharded vs unsharded, %d steps: largest relative loss gap "
              "%.3g, largest weight difference after the run %.3g" % (self.STEPS, max(gaps), gap))
        self.assertLess(max(gaps), 1e-6)
        self.assertLess(gap, 1e-6)

        # The model stays sharded after the run, and after an evaluation
        # there: each rank's parameters (gathered ones included) and
        # optimizer state are about half of one whole model's.
        whole = held["none"][0]["parameters"] + held["none"][0]["optimizer_state"]
        for when, figures in (("after the run", held), ("after an evaluation", held_after_eval)):
            for rank, h in enumerate(figures["full"]):
                self.assertEqual(h["gathered_parameters"], 0, (when, rank))
                mine = h["parameters"] + h["gathered_parameters"] + h["optimizer_state"]
                self.assertLessEqual(mine, 0.55 * whole, (when, rank, h))
                print("rank %d %s: parameters and optimizer state %d bytes, %.3f of one "
                      "process's %d" % (rank, when, mine, mine / whole, whole))
        # The evaluation between runs gathered unit by unit, and saw the
        # unsharded run's model.
        self.assertEqual(idle_evals["none"].peak_gathered_parameter_bytes, 0)
        self.assertGreater(idle_evals["full"].peak_gathered_parameter_bytes, 0)
        self.assertLess(idle_evals["full"].peak_gathered_parameter_bytes, model_bytes)
        self.assertAlmostEqual(idle_evals["full"].loss, idle_evals["none"].loss, delta=1e-6)
        # The next run went on from the kept shards as from the whole model,
        # and so did the refused LoRA run; only the load gathered it whole.
        for field in ("first_loss", "last_loss"):
            self.assertAlmostEqual(getattr(next_runs["full"], field),
                                   getattr(next_runs["none"], field), delta=1e-5)
        for level in runs:
            # memprofctl says so, and what an evaluation gathered.
            status_ctl, eval_ctl = kept_ctl[level]
            for ctl_run in (status_ctl, eval_ctl):
                self.assertEqual(ctl_run.returncode, 0, ctl_run.stderr)
            self.assertEqual("model kept sharded" in status_ctl.stdout, level == "full")
            self.assertEqual("fully sharded: at most" in eval_ctl.stdout, level == "full",
                             eval_ctl.stdout)
            for rank in (0, 1):
                for dp in (kept[level][rank], after_lora[level][rank]):
                    self.assertEqual(dp.model_sharded, level == "full", (level, rank))
                    self.assertEqual(dp.whole_model_gathers, 0, (level, rank))
                loaded = after_load[level][rank]
                self.assertFalse(loaded.model_sharded, (level, rank))
                self.assertEqual(loaded.whole_model_gathers, int(level == "full"),
                                 (level, rank))

        # The checkpoints at the step boundaries: the unsharded run's weights,
        # and in transformers its loss.
        names = ["step-%d" % k for k in range(self.EVERY, self.STEPS, self.EVERY)]
        largest = max(t.numel() * t.element_size() for t in weights_after["none"].values())
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
        transformers.logging.set_verbosity_error()
        ids = torch.arange(3, 35, dtype=torch.int64).unsqueeze(0)
        for name in names:
            full, none = periodic["full"][name], periodic["none"][name]
            self.assertEqual(full.kind, pb.SNAPSHOT_KIND_CHECKPOINT)
            self.assertEqual(max_difference(weights(full.directory), weights(none.directory)),
                             0.0, name)
            losses = {}
            for level, m in (("full", full), ("none", none)):
                model = AutoModelForCausalLM.from_pretrained(m.directory).float().eval()
                with torch.no_grad():
                    losses[level] = model(input_ids=ids, labels=ids).loss.item()
            self.assertEqual(losses["full"], losses["none"], name)
            # Rank 0 held one gathered parameter at a time while writing:
            # at most the largest tensor. float32 host tensors are written
            # from their own memory, so no staging buffer either.
            self.assertGreater(full.peak_gathered_bytes, 0, name)
            self.assertLessEqual(full.peak_gathered_bytes, largest, name)
            self.assertEqual(none.peak_gathered_bytes, 0, name)
            self.assertEqual(full.peak_extra_host_bytes, 0, name)
            print("%s of the fully sharded run: transformers' loss %.6f (unsharded %.6f); "
                  "gathered at most %d bytes at once while writing (largest tensor %d)"
                  % (name, losses["full"], losses["none"], full.peak_gathered_bytes, largest))

        # The evaluation ran between two steps of the run. Fully sharded,
        # every rank gathered the model's units with rank 0 one at a time:
        # at most two of them at once, never the whole model.
        for level, result in evals.items():
            self.assertGreater(result.tokens, 0, level)
            self.assertTrue(0 < result.loss < 100, (level, result.loss))
        units = {}
        for name, t in weights_after["none"].items():
            parts = name.split(".")
            unit = ".".join(parts[:3]) if parts[1] == "layers" else parts[1]
            units[unit] = units.get(unit, 0) + t.numel() * t.element_size()
        # The head is the final norm and the (tied) embedding.
        units["norm"] += units["embed_tokens"]
        two_largest = sum(sorted(units.values())[-2:])
        # Each parameter of a unit padded to 2 chunks of a multiple of 16.
        padding = len(weights_after["none"]) * 2 * 16 * 4
        peak = evals["full"].peak_gathered_parameter_bytes
        self.assertEqual(evals["none"].peak_gathered_parameter_bytes, 0)
        self.assertGreater(peak, 0)
        self.assertLessEqual(peak, two_largest + padding)
        self.assertLess(peak, model_bytes)
        print("the evaluation in the fully sharded run held at most %d bytes of gathered "
              "parameters (two largest units %d, the whole model %d)"
              % (peak, two_largest, model_bytes))
        self.assertLess(evals["full"].global_step, self.STEPS)
        if evals["full"].global_step == evals["none"].global_step:
            self.assertAlmostEqual(evals["full"].loss, evals["none"].loss, delta=1e-6)

        for rank, text in enumerate(metrics):
            self.assertEqual(metric(text, "memprofd_dp_owned_parameter_bytes"), owned[rank])
            self.assertGreater(metric(text, "memprofd_dp_gathered_parameter_bytes_peak"), 0)
            self.assertGreater(metric(text, "memprofd_dp_parameter_gathers"), 0)
            self.assertGreaterEqual(metric(text, "memprofd_dp_gather_exposed_seconds_total"), 0)
            self.assertEqual(metric(text, "memprofd_dp_sharding_info"), 1.0)
            # Whole again since the load, once.
            self.assertEqual(metric(text, "memprofd_dp_model_sharded"), 0.0)
            self.assertEqual(metric(text, "memprofd_dp_whole_model_gathers_total"), 1.0)
            self.assertRegex(text, r'memprofd_dp_sharding_info\{[^}]*level="full"')
        self.assertEqual(ctl.returncode, 0, ctl.stderr)
        self.assertIn("sharding full", ctl.stdout)

    def test_ranks_started_with_different_levels_do_not_start(self):
        ranks = start_ranks(2, timeout=5, wait=False,
                            rank_flags=[["--sharding=none"], ["--sharding=optimizer"]])
        try:
            codes = [d.proc.wait(timeout=60) for d in ranks]
            outputs = [d.output() for d in ranks]
        finally:
            close_unready(ranks)
        for code, output in zip(codes, outputs):
            self.assertNotEqual(code, 0, output)
            self.assertIn("start every rank with the same sharding", output)
        self.assertIn("rank 1 was started with sharding=optimizer, rank 0 with sharding=none",
                      outputs[0])
        self.assertIn("--sharding", outputs[0])

    def test_an_unknown_level_fails_at_start_and_one_process_ignores_it(self):
        for level in ("zero1", "Full"):
            with self.subTest(level):
                d = Daemon("--model=" + MICRO_DIR, "--sharding=" + level, wait=False)
                try:
                    code = d.proc.wait(timeout=60)
                    output = d.output()
                finally:
                    close_unready([d])
                self.assertNotEqual(code, 0, output)
                self.assertIn("--sharding", output)
                self.assertIn(level, output)
                self.assertRegex(output, r"none.*optimizer")
        # A single process accepts a built level and trains unsharded.
        d = Daemon("--model=" + MICRO_DIR, "--sharding=optimizer")
        try:
            status = d.call("GetStatus", pb.GetStatusRequest())
            self.assertEqual(status.data_parallel.sharding, "none")
            self.assertIn("has no effect in a single process", d.output())
        finally:
            d.close()


class BudgetTest(unittest.TestCase):
    """Train under memory_budget_bytes on 2 gradient-sharded ranks: rank 0
    plans each candidate for every rank of the run, both ranks train the
    configuration it chose with each step's peak under the budget (one the
    request's own configuration exceeds), and a budget below the model state
    is refused before any rank starts."""

    BATCH = 8

    def plan(self, leader, **train_fields):
        planned = wait_done(leader, leader.call("PlanMemory", pb.PlanMemoryRequest(
            train=pb.TrainRequest(batch_size=self.BATCH, seq_len=RUN["seq_len"],
                                  **train_fields),
            world_size=2, sharding="gradients")).id)
        self.assertEqual(planned.state, pb.OPERATION_STATE_SUCCEEDED, planned.error.message)
        return planned.plan

    def test_every_rank_trains_under_a_budget_its_request_exceeds(self):
        ranks = start_ranks(2, "--sharding=gradients")
        leader, follower = ranks
        try:
            # The request's own configuration does not fit; checkpointing
            # every layer does (on the micro model the model state and the
            # gradient buckets dominate, so halfway to the model state would
            # fit nothing).
            p = self.plan(leader)
            smaller = self.plan(leader, gradient_checkpointing=True)
            self.assertLess(smaller.peak_allocated_bytes, p.peak_allocated_bytes)
            budget = (smaller.peak_allocated_bytes + p.peak_allocated_bytes) // 2
            op = wait_done(leader, train(leader, steps=3, batch_size=self.BATCH,
                                         memory_budget_bytes=budget).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            t = op.train
            self.assertTrue(t.budget_choice)
            self.assertLessEqual(t.planned_peak_bytes, budget)
            peaks = []
            for d in ranks:
                reports = step_reports(d)
                self.assertEqual(sorted(reports), [1, 2, 3])
                for r in reports.values():
                    self.assertLessEqual(r.peak_allocated_bytes, budget, t.budget_choice)
                peaks.append(max(r.peak_allocated_bytes for r in reports.values()))
            print("\n2 gradient-sharded ranks, budget %d (model state %d, unconstrained "
                  "peak %d per rank): %s, planned %d, measured peaks %s"
                  % (budget, p.model_state_bytes, p.peak_allocated_bytes, t.budget_choice,
                     t.planned_peak_bytes, peaks))

            refused = wait_done(leader, train(leader, steps=3, batch_size=self.BATCH,
                                              memory_budget_bytes=p.model_state_bytes // 2).id)
            self.assertEqual(refused.state, pb.OPERATION_STATE_FAILED)
            self.assertEqual(refused.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                             refused.error.message)
            # The follower was never told to train it.
            ops = follower.call("ListOperations", pb.ListOperationsRequest(
                kind=pb.OPERATION_KIND_TRAIN)).operations
            self.assertEqual(len(ops), 1)
            self.assertEqual(status_at_steps(follower, 3).model.steps_trained, 3)
        finally:
            close_all(ranks)


class RankFailureTest(unittest.TestCase):
    # Long enough that rank 1 is killed mid-run however fast the steps are
    # (micro steps take tens of milliseconds); a checkpoint every 5.
    STEPS = 100

    def test_killed_rank_fails_the_run_and_a_restart_resumes_exactly(self):
        tmp = tempfile.TemporaryDirectory(prefix="memprofd-dist-kill-")
        flags = ["--snapshot_every_steps=5", "--keep_last=2", "--resume=latest"]
        try:
            # The uninterrupted run.
            ranks = start_ranks(2, "--snapshot_root=" + os.path.join(tmp.name, "whole"), *flags)
            try:
                op = wait_done(ranks[0], train(ranks[0], steps=self.STEPS, batch_size=2).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
                uninterrupted = weights(snapshot(ranks[0], "end").directory)
            finally:
                close_all(ranks)

            # The same run, rank 1 SIGKILLed once rank 0 reported step 12.
            root = os.path.join(tmp.name, "killed")
            ranks = start_ranks(2, "--snapshot_root=" + root, *flags)
            leader, victim = ranks
            try:
                op = train(leader, steps=self.STEPS, batch_size=2)
                stream = leader.stub.StreamStepReports(
                    pb.StreamStepReportsRequest(operation_id=op.id), timeout=300)
                for r in stream:
                    if r.global_step >= 12:
                        victim.proc.kill()
                        killed_at = time.time()
                        stream.cancel()
                        break
                # Rank 0 fails the step within the collective timeout (10 s),
                # then stops serving and exits non-zero.
                code = leader.proc.wait(timeout=60)
                took = time.time() - killed_at
                output = leader.output()
                print("\nrank 1 killed: rank 0 exited with %d after %.1f s" % (code, took))
                self.assertNotEqual(code, 0, output)
                self.assertLess(took, 30, output)
                self.assertIn("data-parallel run is broken", output)
                self.assertRegex(output, r"rank 0: (all-reduce|broadcast|all-gather)[^\n]* failed")
                # Nothing partial: every directory in the root is a whole,
                # published checkpoint, taken before the run broke.
                published = sorted(n for n in os.listdir(root) if n.startswith("step-"))
                self.assertTrue(published)
                for name in published:
                    for f in ("model.safetensors", "optimizer.safetensors", "trainer_state.json"):
                        self.assertTrue(os.path.exists(os.path.join(root, name, f)), (name, f))
                latest = max(int(n.split("-")[1]) for n in published)
                self.assertLess(latest, self.STEPS)
            finally:
                close_all(ranks)

            # Both restarted, as torchrun or Kubernetes would: they resume
            # from the newest checkpoint and finish the run.
            ranks = start_ranks(2, "--snapshot_root=" + root, *flags)
            try:
                for d in ranks:
                    self.assertEqual(d.call("GetStatus", pb.GetStatusRequest())
                                     .model.steps_trained, latest)
                op = wait_done(ranks[0], ranks[0].call("Train", pb.TrainRequest(resume=True)).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
                self.assertEqual(status_at_steps(ranks[1], self.STEPS).model.steps_trained,
                                 self.STEPS)
                resumed = weights(snapshot(ranks[0], "end").directory)
            finally:
                close_all(ranks)
            print("resumed from step %d: max |dw| against the uninterrupted run %.3g"
                  % (latest, max_difference(resumed, uninterrupted)))
            self.assertEqual(max_difference(resumed, uninterrupted), 0.0)
        finally:
            tmp.cleanup()


class HungAndLostRanksTest(unittest.TestCase):
    """A rank that hangs (SIGSTOP) fails rank 0's step when the collective
    timeout runs out; a follower whose rank 0 dies stops too. Both exit
    non-zero, so that the launcher restarts the run."""

    def run_until_step(self, leader, step):
        op = train(leader, steps=100000, batch_size=1, seq_len=16)
        stream = leader.stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=op.id),
                                               timeout=300)
        for r in stream:
            if r.global_step >= step:
                stream.cancel()
                break
        return op

    def test_a_hung_follower_fails_the_step_within_the_timeout(self):
        ranks = start_ranks(2, timeout=5)
        leader, hung = ranks
        try:
            self.run_until_step(leader, 3)
            hung.proc.send_signal(signal.SIGSTOP)
            stopped = time.time()
            code = leader.proc.wait(timeout=60)
            took = time.time() - stopped
            output = leader.output()
            print("\nrank 1 stopped: rank 0 exited with %d after %.1f s (timeout 5 s)"
                  % (code, took))
            self.assertEqual(code, 1, output)
            self.assertGreaterEqual(took, 4, output)
            self.assertLess(took, 30, output)
            self.assertIn("DEADLINE_EXCEEDED", output)
        finally:
            hung.proc.send_signal(signal.SIGCONT)
            close_all(ranks)

    def test_a_follower_whose_rank_zero_died_stops_non_zero(self):
        ranks = start_ranks(2, timeout=5)
        leader, follower = ranks
        try:
            self.run_until_step(leader, 3)
            leader.proc.kill()
            code = follower.proc.wait(timeout=60)
            output = follower.output()
            self.assertEqual(code, 1, output)
            self.assertIn("data-parallel run is broken", output)
            self.assertRegex(output, r"rank 1: ")
        finally:
            close_all(ranks)

    def test_idle_follower_stops_non_zero_when_rank_zero_dies(self):
        # No collective is running: the follower learns it from the store.
        ranks = start_ranks(2, timeout=5)
        leader, follower = ranks
        try:
            leader.proc.kill()
            code = follower.proc.wait(timeout=60)
            self.assertEqual(code, 1, follower.output())
            self.assertIn("rank 0 is gone", follower.output())
        finally:
            close_all(ranks)

    def test_sigterm_to_rank_zero_stops_every_rank_cleanly(self):
        ranks = start_ranks(2)
        try:
            code, _ = ranks[0].stop()
            self.assertEqual(code, 0, ranks[0].output())
            self.assertEqual(ranks[1].proc.wait(timeout=30), 0, ranks[1].output())
        finally:
            close_all(ranks)


class TorchrunTest(unittest.TestCase):
    def test_torchrun_no_python_starts_a_two_rank_run(self):
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        tmp = tempfile.TemporaryDirectory(prefix="memprofd-torchrun-")
        port_file = os.path.join(tmp.name, "ports-{rank}.json")
        log = open(os.path.join(tmp.name, "torchrun.log"), "wb")
        proc = subprocess.Popen(
            [torchrun, "--nproc_per_node=2", "--no-python", "--master_addr=127.0.0.1",
             "--master_port=%d" % free_port(), harness.MEMPROFD,
             "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--port_file=" + port_file,
             "--model=" + MICRO_DIR, "--collective_timeout_seconds=20"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            ports = []
            deadline = time.time() + 120
            for rank in range(2):
                path = port_file.replace("{rank}", str(rank))
                while not os.path.exists(path):
                    if proc.poll() is not None or time.time() > deadline:
                        with open(log.name) as f:
                            self.fail("torchrun's ranks did not start:\n" + f.read())
                    time.sleep(0.1)
                with open(path) as f:
                    ports.append(json.load(f)["grpc_port"])
            channels = [grpc.insecure_channel("127.0.0.1:%d" % p) for p in ports]
            stubs = [harness.memprofd_pb2_grpc.MemprofdStub(c) for c in channels]
            op = stubs[0].Train(pb.TrainRequest(steps=4, batch_size=1, seq_len=16), timeout=30)
            while not op.done:
                op = stubs[0].WaitOperation(pb.WaitOperationRequest(id=op.id, timeout_ms=10000),
                                            timeout=20)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            for rank, stub in enumerate(stubs):
                deadline = time.time() + 30  # a follower ends a moment after rank 0
                status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
                while status.model.steps_trained < 4 and time.time() < deadline:
                    time.sleep(0.05)
                    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
                self.assertEqual(status.data_parallel.rank, rank)
                self.assertEqual(status.data_parallel.launcher, "torchrun")
                self.assertEqual(status.model.steps_trained, 4)
            for c in channels:
                c.close()
            # SIGTERM to torchrun reaches both ranks; rank 0 releases rank 1.
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
            tmp.cleanup()


class DashboardAcrossRanksTest(unittest.TestCase):
    """The Grafana dashboard against a real Prometheus scraping both ranks of
    a training run: every query returns data (the data-parallel ones too),
    those grouped by rank return both ranks."""

    def test_every_dashboard_query_returns_both_ranks(self):
        exprs, by_rank = harness.dashboard_queries()
        self.assertGreaterEqual(len(by_rank), 3)
        self.assertGreaterEqual(len([e for e in exprs if "memprofd_dp_" in e]), 2)
        root = tempfile.TemporaryDirectory(prefix="memprofd-dist-dash-")
        ranks = start_ranks(2, "--snapshot_root=" + root.name, timeout=30)
        try:
            with harness.Prometheus(*(d.metrics_port for d in ranks)) as prom:
                # What the single-process DashboardTest runs, on two ranks.
                op = ranks[0].call("Train", harness.dashboard_training_request(100000))
                wait_done(ranks[0], ranks[0].call("Snapshot",
                                                  pb.SnapshotRequest(name="dash")).id)
                self.assertEqual(
                    harness.queries_without_data(prom, exprs, by_rank, ranks=("0", "1")), [],
                    "queries without data from both ranks")
                # The drift panel's query, read back: the replicas agree.
                code, out = prom.query("max(memprofd_dp_parameter_drift)")
                self.assertEqual(code, 0, out)
                self.assertRegex(out, r"=> 0 @")
                ranks[0].call("CancelOperation", pb.CancelOperationRequest(id=op.id))
                wait_done(ranks[0], op.id)
        finally:
            close_all(ranks)
            root.cleanup()


def run(*command):
    subprocess.run(command, check=True, capture_output=True, text=True)


def can_make_namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = "mpd-probe-%d" % os.getpid()
    try:
        run("ip", "netns", "add", probe)
    except (subprocess.CalledProcessError, OSError):
        return False
    run("ip", "netns", "del", probe)
    return True


# What the client runs inside host A's namespace (the daemons' addresses are
# only reachable there): Train on rank 0, then both ranks' status, as JSON.
CLIENT = r"""
import json, sys, time
sys.path[:0] = sys.argv[1:3]
import grpc
from memprofd.v1 import memprofd_pb2, memprofd_pb2_grpc, operation_pb2, train_pb2
stubs = [memprofd_pb2_grpc.MemprofdStub(grpc.insecure_channel(a)) for a in sys.argv[3:5]]
op = stubs[0].Train(train_pb2.TrainRequest(steps=6, batch_size=2, seq_len=32, seed=5), timeout=60)
while not op.done:
    op = stubs[0].WaitOperation(operation_pb2.WaitOperationRequest(id=op.id, timeout_ms=10000),
                                timeout=20)
out = {"state": op.state, "error": op.error.message, "ranks": []}
for stub in stubs:
    deadline = time.time() + 30  # a follower ends a moment after rank 0
    s = stub.GetStatus(memprofd_pb2.GetStatusRequest(), timeout=10)
    while s.model.steps_trained < 6 and time.time() < deadline:
        time.sleep(0.05)
        s = stub.GetStatus(memprofd_pb2.GetStatusRequest(), timeout=10)
    out["ranks"].append({"rank": s.data_parallel.rank, "node": s.data_parallel.node_rank,
                         "steps": s.model.steps_trained,
                         "drift": s.data_parallel.parameter_drift,
                         "has_drift": s.data_parallel.has_parameter_drift})
print(json.dumps(out))
"""


@unittest.skipUnless(can_make_namespaces(),
                     "needs root and iproute2 to make network namespaces")
class TwoHostsTest(unittest.TestCase):
    """Two ranks on two hosts: network namespaces joined by a veth pair, the
    store and Gloo's connections over 10.77.0.0/24 and nothing else (each
    namespace has only its loopback and its end of the pair)."""

    def setUp(self):
        tag = os.getpid() % 100000
        self.hosts = [("mpd%d-a" % tag, "10.77.0.1", "mpa%d" % tag),
                      ("mpd%d-b" % tag, "10.77.0.2", "mpb%d" % tag)]
        for namespace, _, _ in self.hosts:
            run("ip", "netns", "add", namespace)
            self.addCleanup(run, "ip", "netns", "del", namespace)
        (ns_a, _, if_a), (ns_b, _, if_b) = self.hosts
        run("ip", "link", "add", if_a, "netns", ns_a, "type", "veth", "peer", "name", if_b,
            "netns", ns_b)
        for namespace, address, interface in self.hosts:
            run("ip", "-n", namespace, "addr", "add", address + "/24", "dev", interface)
            run("ip", "-n", namespace, "link", "set", interface, "up")
            run("ip", "-n", namespace, "link", "set", "lo", "up")

    def test_two_ranks_on_two_hosts_train_as_one_run(self):
        ranks = start_ranks(2, hosts=self.hosts)
        try:
            addresses = ["%s:%d" % (h[1], d.grpc_port) for h, d in zip(self.hosts, ranks)]
            result = subprocess.run(
                ["ip", "netns", "exec", self.hosts[0][0], sys.executable, "-c", CLIENT,
                 os.path.join(harness.BUILD_DIR, "python"),
                 os.path.join(harness.BUILD_DIR, "python", "grpcstd")] + addresses,
                capture_output=True, text=True, timeout=300)
            self.assertEqual(result.returncode, 0, result.stderr + ranks[0].output())
            out = json.loads(result.stdout)
            self.assertEqual(out["state"], pb.OPERATION_STATE_SUCCEEDED, out["error"])
            self.assertEqual([(r["rank"], r["node"], r["steps"]) for r in out["ranks"]],
                             [(0, 0, 6), (1, 1, 6)])
            for r in out["ranks"]:
                self.assertTrue(r["has_drift"])
                self.assertEqual(r["drift"], 0.0)
            self.assertIn("store 10.77.0.1:", ranks[1].output())
        finally:
            close_all(ranks)


if __name__ == "__main__":
    unittest.main()
