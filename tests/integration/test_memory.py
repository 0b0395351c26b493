"""Memory accounting over the wire: stats, history dumps as memory_viz
pickles, and the Grafana dashboard's queries against a real Prometheus."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

import harness
from harness import Daemon, pb, wait_done

CATEGORIES = ["parameters", "frozen_parameters", "gathered_parameters", "gradients",
              "optimizer_state",
              "saved_activations", "temporaries", "offloaded_host", "offloaded_disk",
              "snapshot_staging", "other", "unknown"]

# Run by a torch-free interpreter: the dump must load with plain pickle.
CHECK_PICKLE = r'''
import collections, pickle, sys
with open(sys.argv[1], "rb") as f:
    raw = f.read()
assert raw[0] == 0x80 and 2 <= raw[1] <= 4, "protocol %d" % raw[1]
snap = pickle.loads(raw)
assert "torch" not in sys.modules
assert set(snap) >= {"segments", "device_traces", "allocator_settings"}, list(snap)
traces = snap["device_traces"]
entries = [e for t in traces for e in t]
actions = collections.Counter(e["action"] for e in entries)
for e in entries:
    assert {"action", "addr", "size", "stream"} <= set(e), e
for s in snap["segments"]:
    assert {"device", "address", "total_size", "stream", "blocks"} <= set(s), s
    assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
# Alloc/free pairs: a free_completed follows an alloc of the same address and
# size, unless that alloc fell out of the ring before the first entry.
for trace in traces:
    live = {}
    for e in trace:
        if e["action"] == "alloc":
            assert e["addr"] not in live, "double alloc at %x" % e["addr"]
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            assert live.pop(e["addr"]) == e["size"]
print(actions["alloc"], actions["free_completed"])
'''


class MemoryTest(harness.DaemonTestCase):
    def test_1_stats_report_devices_categories_and_phases(self):
        with self.assertRaises(grpc.RpcError) as e:
            list(self.d.stub.DumpMemoryHistory(pb.DumpMemoryHistoryRequest(), timeout=30))
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        wait_done(self.d, self.d.call("Train", pb.TrainRequest(steps=1, batch_size=2, seq_len=32)).id)
        stats = self.d.call("GetMemoryStats", pb.GetMemoryStatsRequest())
        cpu = stats.devices[0]
        self.assertEqual(cpu.device, "cpu")
        self.assertGreater(cpu.current_bytes, 16_000_000)
        self.assertGreaterEqual(cpu.peak_bytes, cpu.current_bytes)
        self.assertGreater(cpu.allocations_total, cpu.frees_total)
        categories = {c.category: c.bytes for c in stats.categories}
        self.assertEqual(list(categories), CATEGORIES)
        self.assertEqual(categories["parameters"], 16_000_000)  # tiny: 4M float32
        # AdamW: 2 moments, and a 4-byte step count per parameter tensor.
        self.assertGreaterEqual(categories["optimizer_state"], 32_000_000)
        self.assertLessEqual(categories["optimizer_state"], 32_000_000 + 4 * 64)
        # Everything but the offloaded bytes tiles the allocator.
        outside = categories["offloaded_disk"] + categories["offloaded_host"]
        self.assertLessEqual(abs(sum(categories.values()) - outside - cpu.current_bytes),
                             cpu.current_bytes // 1000)
        phases = {p.phase: p.peak_bytes for p in stats.last_step_phase_peaks}
        for phase in ("forward", "backward", "optimizer"):
            self.assertGreater(phases[phase], categories["parameters"])
            self.assertLessEqual(phases[phase], cpu.peak_bytes)
        self.assertEqual(stats.current_phase, "idle")

    def test_2_reset_peak(self):
        self.d.call("ResetPeakMemory", pb.ResetPeakMemoryRequest())
        stats = self.d.call("GetMemoryStats", pb.GetMemoryStatsRequest())
        self.assertLessEqual(stats.devices[0].peak_bytes - stats.devices[0].current_bytes, 1 << 20)

    def test_3_recording_bad_sizes(self):
        for n in (-1, 20_000_000):
            with self.assertRaises(grpc.RpcError) as e:
                self.d.call("StartMemoryRecording", pb.StartMemoryRecordingRequest(max_entries=n))
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_4_history_dump_is_a_plain_pickle_the_viewer_reads(self):
        self.d.call("StartMemoryRecording", pb.StartMemoryRecordingRequest(max_entries=500))
        wait_done(self.d, self.d.call("Train", pb.TrainRequest(steps=2, batch_size=2, seq_len=32)).id)
        self.d.call("StopMemoryRecording", pb.StopMemoryRecordingRequest())
        stats = self.d.call("GetMemoryStats", pb.GetMemoryStatsRequest())
        self.assertFalse(stats.recording)
        self.assertEqual(stats.history_entries, 500)  # exactly the newest N
        self.assertGreater(stats.history_dropped, 0)
        data = b"".join(c.data for c in self.d.stub.DumpMemoryHistory(pb.DumpMemoryHistoryRequest(), timeout=60))
        with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
            f.write(data)
            f.flush()
            r = subprocess.run([sys.executable, "-c", CHECK_PICKLE, f.name],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        allocs, frees = map(int, r.stdout.split())
        self.assertGreater(allocs, 0)
        self.assertGreater(frees, 0)

    def test_5_memprofctl_memory(self):
        r = self.d.ctl("memory")
        self.assertEqual(r.returncode, 0, r.stderr)
        for needle in ("device", "cpu", "MiB", "by category", "parameters", "last step's peak"):
            self.assertIn(needle, r.stdout)
        r = self.d.ctl("memory", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["devices"][0]["device"], "cpu")
        self.assertEqual(self.d.ctl("memory", "record", "start", "--max_entries", "1000").returncode, 0)
        self.assertEqual(self.d.ctl("memory", "reset-peak").returncode, 0)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "history.pickle")
            r = self.d.ctl("memory", "dump", "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out, "rb") as f:
                self.assertEqual(f.read(2), b"\x80\x02")
        self.assertEqual(self.d.ctl("memory", "record", "stop", "--clear").returncode, 0)
        self.assertEqual(self.d.ctl("memory", "record", "sideways").returncode, 2)


class AttributionTest(harness.DaemonTestCase):
    """Issue 12 over the wire: a daemon trains `tiny` with attribution on;
    GetMemoryBreakdown names the layers' attention and MLP modules as the
    largest activation holders in backward, categories tile the allocator,
    DiffMemory compares steps, the dump names modules and ops and PyTorch's
    _memory_viz reads it, memprofctl memory top/diff print it, /metrics has
    the bounded module-kind gauge."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.d.call("StartMemoryRecording", pb.StartMemoryRecordingRequest(max_entries=1_000_000))
        wait_done(cls.d, cls.d.call("Train", pb.TrainRequest(steps=3, batch_size=2, seq_len=32)).id)

    def test_1_breakdown_by_module_in_backward(self):
        b = self.d.call("GetMemoryBreakdown",
                        pb.GetMemoryBreakdownRequest(by="module", phase="backward", top=1000))
        self.assertEqual((b.device, b.step, b.by, b.phase), ("cpu", 3, "module", "backward"))
        saved = [r for r in b.rows if r.category == "saved_activations"]
        self.assertGreaterEqual(len(saved), 4)
        for r in saved[:4]:
            self.assertTrue(r.key.startswith("model.layers."), r)
            self.assertIn(r.module_kind, ("attention", "mlp"), r)
            self.assertGreater(r.peak_bytes, 0)
            self.assertEqual(r.peak_phase, "backward")
        names = {(r.key, r.category) for r in b.rows}
        self.assertIn(("model.layers.3.self_attn.q_proj.weight", "parameters"), names)
        self.assertEqual(sum(c.bytes for c in b.categories), b.attributed_bytes)
        self.assertLessEqual(abs(b.attributed_bytes - b.allocator_bytes), b.allocator_bytes // 1000)

    def test_2_breakdown_by_op_and_category(self):
        b = self.d.call("GetMemoryBreakdown", pb.GetMemoryBreakdownRequest(by="op"))
        self.assertLessEqual(len(b.rows), 20)  # the default top
        ops = [r.key for r in b.rows if r.allocated_bytes > 0]
        self.assertTrue(any(o.startswith("aten::") for o in ops), ops)
        self.assertTrue(any("Backward" in o for o in ops), ops)
        b = self.d.call("GetMemoryBreakdown", pb.GetMemoryBreakdownRequest(by="category", top=3))
        self.assertEqual(len(b.rows), 3)
        self.assertEqual(b.rows[0].peak_bytes, max(r.peak_bytes for r in b.rows))

    def test_3_bad_breakdown_and_diff_requests(self):
        for req, needle in ((pb.GetMemoryBreakdownRequest(by="layer"), "module"),
                            (pb.GetMemoryBreakdownRequest(phase="sideways"), "backward"),
                            (pb.GetMemoryBreakdownRequest(top=0), "top")):
            with self.assertRaises(grpc.RpcError) as e:
                self.d.call("GetMemoryBreakdown", req)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(needle, e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("DiffMemory", pb.DiffMemoryRequest(step_a=1, step_b=99))
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("1, 2, 3", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("DiffMemory", pb.DiffMemoryRequest(step_a=0, step_b=1))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_4_diff_between_steps(self):
        d = self.d.call("DiffMemory", pb.DiffMemoryRequest(step_a=1, step_b=3, top=5))
        self.assertEqual((d.step_a, d.step_b), (1, 3))
        self.assertEqual(list(d.steps_kept), [1, 2, 3])
        self.assertLessEqual(len(d.rows), 5)
        # Only what changed, largest change of peak first.
        changes = [abs(r.peak_b - r.peak_a) for r in d.rows]
        self.assertEqual(changes, sorted(changes, reverse=True))
        for r in list(d.rows) + list(d.categories):
            self.assertTrue(r.peak_a != r.peak_b or r.live_a != r.live_b, r)

    def test_5_dump_names_modules_and_ops_and_torch_reads_it(self):
        data = b"".join(c.data for c in self.d.stub.DumpMemoryHistory(pb.DumpMemoryHistoryRequest(), timeout=120))
        path = os.path.join(self.scratch, "attributed.pickle")
        with open(path, "wb") as f:
            f.write(data)
        r = subprocess.run([sys.executable, os.path.join(harness.SOURCE_DIR, "tests/memory/check_memory_viz.py"),
                            path, "--torch"], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        summary = json.loads(r.stdout)
        self.assertTrue(summary["torch_ok"])
        self.assertGreater(summary["allocs_with_module"], 100)
        self.assertGreater(summary["allocs_with_aten_op"], 100)
        self.assertGreater(summary["allocs_with_backward_op"], 10)
        self.assertGreaterEqual(summary["allocs_named_parameters"], 38)
        for c in ("parameters", "saved_activations", "temporaries", "gradients", "unknown"):
            self.assertIn(c, summary["categories"])
        self.assertEqual(summary["cpu_reserved_minus_live"], 0)

    def test_6_memprofctl_memory_top_and_diff(self):
        r = self.d.ctl("memory", "top", "--phase", "backward", "--top", "300")
        self.assertEqual(r.returncode, 0, r.stderr)
        for needle in ("by module", "model.layers.", "saved_activations", "live by category"):
            self.assertIn(needle, r.stdout)
        r = self.d.ctl("memory", "top", "--by", "op", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["by"], "op")
        r = self.d.ctl("memory", "diff", "2", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("step 2 -> 3", r.stdout)
        self.assertEqual(self.d.ctl("memory", "diff", "two", "3").returncode, 2)
        r = self.d.ctl("memory", "top", "--by", "layer")
        self.assertEqual(r.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", r.stderr)

    def test_7_metrics_have_bounded_module_kind_labels(self):
        text = self.d.metrics_text()
        lines = [l for l in text.splitlines() if l.startswith("memprofd_memory_module_kind_bytes{")]
        self.assertTrue(any('module_kind="mlp"' in l for l in lines), lines)
        kinds = {l.split('module_kind="')[1].split('"')[0] for l in lines}
        self.assertLessEqual(kinds, {"embed", "attention", "mlp", "norm", "head", "other"})
        self.assertFalse(any("model.layers" in l for l in lines))


@unittest.skipUnless(shutil.which("prometheus") and shutil.which("promtool"), "prometheus not installed")
class StepRecordsFollowTheModelTest(harness.DaemonTestCase):
    def test_a_new_model_forgets_the_steps_of_the_one_it_replaced(self):
        wait_done(self.d, self.d.call("Train", pb.TrainRequest(steps=3, batch_size=2, seq_len=32)).id)
        d = self.d.call("DiffMemory", pb.DiffMemoryRequest(step_a=1, step_b=3))
        self.assertEqual(list(d.steps_kept), [1, 2, 3])
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(preset="tiny", seed=5)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        wait_done(self.d, self.d.call("Train", pb.TrainRequest(steps=1, batch_size=2, seq_len=32)).id)
        # The new model's step 1 only: the old model's 2 and 3 are not its steps.
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("DiffMemory", pb.DiffMemoryRequest(step_a=1, step_b=3))
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(list(self.d.call("DiffMemory", pb.DiffMemoryRequest(step_a=1, step_b=1)).steps_kept),
                         [1])


class DashboardTest(unittest.TestCase):
    """Every PromQL expression of the Grafana dashboard returns data from a real
    Prometheus scraping a training daemon (read from the JSON, so they cannot drift);
    those grouped by rank return rank 0's. The data-parallel ones (memprofd_dp_*)
    have no data from a single process: Prometheus must accept them."""

    def test_every_dashboard_query_returns_data(self):
        exprs, by_rank = harness.dashboard_queries()
        self.assertGreaterEqual(len(exprs), 10)
        data_parallel = [e for e in exprs if "memprofd_dp_" in e]
        self.assertGreaterEqual(len(data_parallel), 2)
        exprs = [e for e in exprs if e not in data_parallel]
        by_rank = [e for e in by_rank if e in exprs]
        self.assertGreaterEqual(len(by_rank), 3)
        root = tempfile.mkdtemp(prefix="memprofd-dash-")
        d = Daemon("--snapshot_root=" + root)
        try:
            with harness.Prometheus(d.metrics_port) as prom:
                # Train (with offloading) while Prometheus scrapes, and snapshot.
                # A cosine schedule and evaluations feed the rate and eval panels.
                op = d.call("Train", harness.dashboard_training_request(1000))
                snap = d.call("Snapshot", pb.SnapshotRequest(name="dash"))
                wait_done(d, snap.id)
                self.assertEqual(harness.queries_without_data(prom, exprs, by_rank), [],
                                 "queries without data")
                for expr in data_parallel:
                    code, out = prom.query(expr)
                    self.assertEqual(code, 0, "Prometheus refuses %r: %s" % (expr, out))
                d.call("CancelOperation", pb.CancelOperationRequest(id=op.id))
                wait_done(d, op.id)
        finally:
            d.close()
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
