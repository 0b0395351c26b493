"""Out of memory for real, and the records that outlive it: a daemon under
RLIMIT_AS asked for a step that cannot fit writes an OOM report (file,
GetLastOomReport, memprofctl memory oom) and keeps serving; --peak_file keeps
the last step's peaks through SIGKILL."""

import json
import os
import resource
import signal
import tempfile
import time
import unittest

import grpc

import harness
from harness import Daemon, pb, wait_done

SMALL = dict(steps=1, batch_size=2, seq_len=32)
# tiny at 64 x 512 tokens: ~4 GB of activations, far beyond the headroom.
BIG = dict(steps=1, batch_size=64, seq_len=512)
# Address space allowed beyond what a daemon that trained SMALL reached.
HEADROOM = 768 << 20


class OomReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The limit: what the same daemon reaches loading `tiny` and training
        # SMALL, plus HEADROOM (LibTorch maps gigabytes of address space it
        # never touches, so a fixed figure would not fit every build).
        probe = Daemon("--device=cpu")
        try:
            wait_done(probe, probe.call("Train", pb.TrainRequest(**SMALL)).id)
            limit = harness.proc_status_bytes(probe.proc.pid, "VmPeak") + HEADROOM
        finally:
            probe.close()
        cls.limit = limit
        cls._tmp = tempfile.TemporaryDirectory(prefix="memprofd-it-oom-")
        cls.report_dir = os.path.join(cls._tmp.name, "reports")  # made when needed

        def cap():
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        # The step must run to fail for real: a daemon refuses a step planned
        # beyond the device's room before it allocates, unless told not to.
        cls.d = Daemon("--device=cpu", "--report_dir=" + cls.report_dir,
                       "--refuse_unfit_steps=false", preexec_fn=cap)

    @classmethod
    def tearDownClass(cls):
        cls.d.close()
        cls._tmp.cleanup()

    def test_1_no_report_before_any_oom(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("GetLastOomReport", pb.GetLastOomReportRequest())
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("out of memory", e.exception.details())
        self.assertEqual(self.d.ctl("memory", "oom").returncode, 1)

    def test_2_step_that_cannot_fit_fails_writes_a_report_and_the_daemon_serves_on(self):
        d = self.d
        wait_done(d, d.call("Train", pb.TrainRequest(**SMALL)).id)
        # With the history on, each live allocation has its phase and step.
        d.call("StartMemoryRecording", pb.StartMemoryRecordingRequest())
        started = time.time()
        op = wait_done(d, d.call("Train", pb.TrainRequest(**BIG)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_FAILED, op)
        self.assertEqual(op.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], op.error.message)
        self.assertIn("out of memory", op.error.message)

        report = d.call("GetLastOomReport", pb.GetLastOomReportRequest())
        self.assertTrue(report.captured, report.error)
        self.assertEqual(report.device, "cpu")
        self.assertEqual(report.global_step, 2)
        self.assertGreater(report.requested_bytes, 0)
        self.assertIn(report.phase, ("forward", "backward"))
        self.assertLess(report.written_at_unix_ms - report.failed_at_unix_ms, 1000)
        self.assertGreaterEqual(report.failed_at_unix_ms, int(started * 1000) - 1000)
        # What filled the memory: the 20 largest, largest first, each with a
        # category; the parameters are among the live bytes.
        sizes = [a.bytes for a in report.largest_allocations]
        self.assertEqual(len(sizes), 20)
        self.assertEqual(sizes, sorted(sizes, reverse=True))
        self.assertGreater(sizes[0], 1 << 20)
        self.assertTrue(all(a.category for a in report.largest_allocations))
        # Each named by the attribution it was allocated with: the biggest is
        # a layer's activation or temporary, made by a module and an op.
        biggest = report.largest_allocations[0]
        self.assertIn(biggest.category, ("saved_activations", "temporaries"))
        self.assertEqual((biggest.phase, biggest.step), (report.phase, 2))
        self.assertTrue(biggest.module, biggest)
        self.assertTrue(biggest.op, biggest)
        # The failed request names the module and op that asked for it.
        self.assertTrue(report.module.startswith(("model.", "lm_head", "loss")), report.module)
        self.assertTrue(report.op, report)
        cats = {c.category: c.bytes for c in report.categories}
        self.assertGreater(cats["parameters"], 4 << 20)  # tiny: 4.0M float32 parameters
        self.assertGreater(cats["saved_activations"] + cats["temporaries"], 64 << 20)
        # Every category but the offloaded two (outside the allocator).
        self.assertIn("gathered_parameters", cats)
        self.assertEqual(sum(b for k, b in cats.items()
                             if k not in ("offloaded_host", "offloaded_disk")),
                         report.live_bytes)
        # The request could not fit in what the limit left.
        self.assertTrue(report.HasField("free_bytes"))
        self.assertLess(report.free_bytes, report.requested_bytes)
        self.assertLessEqual(report.total_bytes, self.limit)
        self.assertEqual([s.step for s in report.recent_steps], [1])

        # The file: under --report_dir, whole, the same report.
        self.assertTrue(report.path.startswith(self.report_dir + "/oom-step2-"), report.path)
        with open(report.path) as f:
            on_disk = json.load(f)
        self.assertEqual(on_disk, json.loads(report.json))
        self.assertEqual(on_disk["kind"], "memprofd.oom_report")
        self.assertEqual(on_disk["request"]["bytes"], report.requested_bytes)
        self.assertEqual(len(on_disk["largest_allocations"]), 20)
        self.assertEqual(on_disk["recent_steps"][0]["step"], 1)
        self.assertEqual(os.listdir(self.report_dir), [os.path.basename(report.path)])

        # The daemon keeps serving: status, a smaller step, the CLI, metrics.
        status = d.call("GetStatus", pb.GetStatusRequest())
        self.assertEqual(status.serving_state, "SERVING")
        ok = wait_done(d, d.call("Train", pb.TrainRequest(**SMALL)).id)
        self.assertEqual(ok.state, pb.OPERATION_STATE_SUCCEEDED, ok.error.message)
        out = d.ctl("memory", "oom")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("step 2 ran out of memory", out.stdout)
        self.assertIn("largest live allocations", out.stdout)
        self.assertIn(report.path, out.stdout)
        as_json = d.ctl("memory", "oom", "--json")
        self.assertEqual(as_json.returncode, 0, as_json.stderr)
        self.assertEqual(json.loads(as_json.stdout)["global_step"], "2")
        self.assertEqual(harness.metric(d.metrics_text(), "memprofd_oom_reports_total"), 1)

    def test_3_memprofctl_json_train_that_fails_says_why_on_stderr(self):
        # With --json, stdout carries only step reports; the failed run's
        # error must still reach the user, on stderr, with the failure's exit.
        r = self.d.ctl("--json", "--timeout_ms=600000", "train", "--steps", "1",
                       "--batch_size", str(BIG["batch_size"]), "--seq_len", str(BIG["seq_len"]),
                       timeout=600)
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("memprofctl: train:", r.stderr)
        self.assertIn("out of memory", r.stderr)
        for line in r.stdout.splitlines():
            json.loads(line)  # stdout stays machine-readable


class PeakFileTest(unittest.TestCase):
    def test_peak_file_has_the_last_step_and_survives_sigkill(self):
        tmp = tempfile.TemporaryDirectory(prefix="memprofd-it-peaks-")
        path = os.path.join(tmp.name, "peaks.json")
        d = Daemon("--device=cpu", "--peak_file=" + path, "--offload")
        try:
            op = wait_done(d, d.call("Train", pb.TrainRequest(steps=3, batch_size=2, seq_len=32)).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            with open(path) as f:
                before = json.load(f)
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            with open(path) as f:
                after = json.load(f)
            self.assertEqual(after, before)
            self.assertEqual(after["kind"], "memprofd.peak_file")
            self.assertEqual(after["step"], 3)
            cpu = after["devices"][0]
            self.assertEqual(cpu["device"], "cpu")
            phases = cpu["phase_peak_bytes"]
            self.assertGreater(phases["forward"], 0)
            self.assertGreater(phases["backward"], 0)
            self.assertEqual(cpu["peak_bytes"], max(phases.values()))
            self.assertGreater(after["category_bytes_at_end"]["parameters"], 0)
            # Per category and phase, each category's own peak: parameters
            # throughout, gradients in backward; no category's peak in a phase
            # exceeds the device's peak in it.
            cat_peaks = after["category_phase_peak_bytes"]
            self.assertGreater(cat_peaks["forward"]["parameters"], 0)
            self.assertGreater(cat_peaks["backward"]["gradients"], 0)
            for phase, by_category in cat_peaks.items():
                for category, peak in by_category.items():
                    self.assertLessEqual(peak, phases.get(phase, cpu["peak_bytes"]),
                                         (phase, category))
            offload = after["offload"]
            self.assertGreater(offload["bytes_out"], 0)
            self.assertEqual(offload["effective_bytes"] + offload["ineffective_bytes"],
                             offload["bytes_out"])
            self.assertFalse(os.path.exists(path + ".tmp"))
        finally:
            d.close()
            tmp.cleanup()

    def test_unwritable_peak_file_stops_the_daemon_at_start(self):
        with self.assertRaises(RuntimeError) as e:
            Daemon("--device=cpu", "--peak_file=/nonexistent-dir/peaks.json")
        # Core names the option; the daemon adds the flag that sets it.
        self.assertIn("peak_file='/nonexistent-dir/peaks.json' cannot be written", str(e.exception))
        self.assertIn("(peak_file is memprofd's --peak_file)", str(e.exception))


if __name__ == "__main__":
    unittest.main()
