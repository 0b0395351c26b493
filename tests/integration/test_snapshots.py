"""Snapshots over the wire: save_pretrained-style directories read back by an
independent parser, taken at step boundaries during training."""

import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import unittest
import time

import grpc

import harness
from harness import Daemon, pb, wait_done


def parse_safetensors(path):
    """Strictly parses one file; returns {name: (dtype, shape)}."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, "header not padded to 8"
    header_text = data[8:8 + n].decode("utf-8")
    assert header_text.startswith("{")
    header = json.loads(header_text)
    assert header.pop("__metadata__") == {"format": "pt"}
    sizes = {"F32": 4, "BF16": 2, "F16": 2}
    spans = []
    out = {}
    for name, entry in header.items():
        assert set(entry) == {"dtype", "shape", "data_offsets"}, entry
        begin, end = entry["data_offsets"]
        numel = 1
        for d in entry["shape"]:
            numel *= d
        assert end - begin == numel * sizes[entry["dtype"]], name
        spans.append((begin, end))
        out[name] = (entry["dtype"], entry["shape"])
    spans.sort()
    pos = 0
    for begin, end in spans:
        assert begin == pos, "gap or overlap"
        pos = end
    assert len(data) == 8 + n + pos, "trailing bytes or truncation"
    return out


class SnapshotTest(harness.DaemonTestCase):
    SNAPSHOTS = True

    def snapshot(self, **kwargs):
        op = self.d.call("Snapshot", pb.SnapshotRequest(**kwargs))
        final = wait_done(self.d, op.id)
        self.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
        return final.snapshot

    def test_snapshot_during_training_is_taken_at_a_step_boundary(self):
        op = self.d.call("Train", pb.TrainRequest(steps=12, batch_size=2, seq_len=32))
        snap_op = None
        steps = []
        for r in self.d.stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=op.id),
                                               timeout=300):
            steps.append(r.global_step)
            if r.step == 3:
                snap_op = self.d.call("Snapshot", pb.SnapshotRequest(name="mid-training"))
        train = wait_done(self.d, op.id)
        self.assertEqual(train.state, pb.OPERATION_STATE_SUCCEEDED)
        self.assertEqual(train.train.steps_completed, 12)  # training went on after it
        snap = wait_done(self.d, snap_op.id)
        self.assertEqual(snap.state, pb.OPERATION_STATE_SUCCEEDED, snap.error.message)
        # Taken between two steps: its step is one the stream reported.
        self.assertIn(snap.snapshot.global_step, steps)
        self.assertGreaterEqual(snap.snapshot.global_step, steps[2])
        self.assertLess(snap.snapshot.global_step, steps[-1])
        self.assertEqual(snap.progress.completed, snap.progress.total)
        self.assertEqual(snap.progress.unit, "bytes")

    def test_sharded_bf16_files_parse_and_match_the_model(self):
        m = self.snapshot(name="sharded-bf16", max_shard_size="3MB", dtype=pb.SNAPSHOT_DTYPE_BF16)
        files = sorted(os.listdir(m.directory))
        shards = [f for f in files if f.endswith(".safetensors")]
        self.assertGreater(len(shards), 1)
        self.assertNotIn("model.safetensors", files)
        self.assertIn("model.safetensors.index.json", files)
        self.assertIn("config.json", files)
        with open(os.path.join(m.directory, "model.safetensors.index.json")) as f:
            index = json.load(f)
        tensors = {}
        for shard in shards:
            for name, (dtype, shape) in parse_safetensors(os.path.join(m.directory, shard)).items():
                self.assertEqual(index["weight_map"][name], shard)
                self.assertEqual(dtype, "BF16")
                tensors[name] = shape
        self.assertEqual(set(index["weight_map"]), set(tensors))
        self.assertEqual(index["metadata"]["total_size"], m.total_size)
        self.assertEqual(sum(2 * max(1, _numel(s)) for s in tensors.values()), m.total_size)
        model = self.d.call("DescribeModel", pb.DescribeModelRequest())
        expected = {p.name: list(p.shape) for p in model.parameters}
        # Tied head: written once, as transformers does, and listed once, on
        # the embedding.
        self.assertTrue(model.config.tie_word_embeddings)
        self.assertNotIn("lm_head.weight", expected)
        self.assertEqual([list(p.tied) for p in model.parameters if p.tied], [["lm_head.weight"]])
        self.assertEqual(tensors, expected)
        with open(os.path.join(m.directory, "config.json")) as f:
            config = json.load(f)
        self.assertEqual(config["architectures"], ["LlamaForCausalLM"])
        self.assertEqual(config["torch_dtype"], "bfloat16")
        self.assertEqual({f.name for f in m.files}, set(files) - {"memprofd_manifest.json"})

    def test_reloading_a_snapshot_gives_the_same_loss_bit_for_bit(self):
        m = self.snapshot(name="reload")
        self.assertEqual([f.name for f in m.files], ["model.safetensors", "config.json"])
        req = pb.TrainRequest(steps=1, batch_size=2, seq_len=32, seed=5)
        first = wait_done(self.d, self.d.call("Train", req).id).train.first_loss
        load = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=m.directory)).id)
        self.assertEqual(load.state, pb.OPERATION_STATE_SUCCEEDED, load.error.message)
        self.assertEqual(load.model.source, m.directory)
        again = wait_done(self.d, self.d.call("Train", req).id).train.first_loss
        self.assertEqual(first, again)

    def test_async_snapshot_reports_its_host_copy(self):
        m = self.snapshot(name="async-1", mode=pb.SNAPSHOT_MODE_ASYNC)
        self.assertEqual(m.mode, pb.SNAPSHOT_MODE_ASYNC)
        self.assertGreaterEqual(m.peak_extra_host_bytes, m.total_size)
        parse_safetensors(os.path.join(m.directory, "model.safetensors"))

    def test_bad_names_sizes_and_unknown_snapshots(self):
        self.snapshot(name="taken")
        for kwargs, code in (({"name": ""}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"name": "a/b"}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"name": ".."}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"name": ".hidden"}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"name": "x" * 201}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"name": "ok", "max_shard_size": "5GiB"}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"name": "ok", "max_shard_size": "lots"}, grpc.StatusCode.INVALID_ARGUMENT),
                             ({"name": "taken"}, grpc.StatusCode.ALREADY_EXISTS)):
            with self.assertRaises(grpc.RpcError, msg=str(kwargs)) as e:
                self.d.call("Snapshot", pb.SnapshotRequest(**kwargs))
            self.assertEqual(e.exception.code(), code, str(kwargs))
            self.assertTrue(e.exception.details())
        for method, req in (("DescribeSnapshot", pb.DescribeSnapshotRequest(name="nope")),
                            ("DeleteSnapshot", pb.DeleteSnapshotRequest(name="nope"))):
            with self.assertRaises(grpc.RpcError) as e:
                self.d.call(method, req)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.d.call("DeleteSnapshot", pb.DeleteSnapshotRequest(name="taken"))
        names = [s.name for s in self.d.call("ListSnapshots", pb.ListSnapshotsRequest()).snapshots]
        self.assertNotIn("taken", names)
        self.assertEqual([n for n in os.listdir(self.root) if n.startswith(".")], [])

    def test_corrupt_snapshot_is_data_loss_and_nothing_is_lost(self):
        m = self.snapshot(name="to-corrupt")
        bad = tempfile.mkdtemp(prefix="memprofd-bad-")
        try:
            for f in ("model.safetensors", "config.json"):
                shutil.copy(os.path.join(m.directory, f), bad)
            path = os.path.join(bad, "model.safetensors")
            os.truncate(path, os.path.getsize(path) - 100)
            before = self.d.call("GetStatus", pb.GetStatusRequest()).model
            op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=bad)).id)
            self.assertEqual(op.error.code, grpc.StatusCode.DATA_LOSS.value[0], op.error.message)
            self.assertIn("model.safetensors", op.error.message)
            after = self.d.call("GetStatus", pb.GetStatusRequest()).model
            self.assertEqual((before.source, before.steps_trained), (after.source, after.steps_trained))
        finally:
            shutil.rmtree(bad)

    def test_config_only_directory_gets_fresh_weights_only_when_asked(self):
        m = self.snapshot(name="for-config")
        only_config = tempfile.mkdtemp(prefix="memprofd-cfg-")
        empty = tempfile.mkdtemp(prefix="memprofd-empty-")
        try:
            shutil.copy(os.path.join(m.directory, "config.json"), only_config)
            before = self.d.call("GetStatus", pb.GetStatusRequest()).model
            # Weights gone missing must not turn into random ones silently.
            op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=only_config)).id)
            self.assertEqual(op.error.code, grpc.StatusCode.FAILED_PRECONDITION.value[0])
            self.assertIn("no weights", op.error.message)
            self.assertIn("init_weights", op.error.message)
            after = self.d.call("GetStatus", pb.GetStatusRequest()).model
            self.assertEqual((before.source, before.steps_trained), (after.source, after.steps_trained))
            for bad in (pb.LoadModelRequest(preset="tiny", init_weights=True),
                        pb.LoadModelRequest(hf_directory=m.directory, init_weights=True, resume=True)):
                with self.assertRaises(grpc.RpcError) as e:
                    self.d.call("LoadModel", bad)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("init_weights", e.exception.details())
            op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
                hf_directory=only_config, init_weights=True)).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            self.assertEqual(op.model.num_parameters, 4000000)
            # init_weights ignores the weights a directory holds: the same
            # first loss as the config alone with the same seed, another seed
            # another loss.
            probe = pb.TrainRequest(steps=1, batch_size=1, seq_len=16, seed=5)

            def first_loss(directory, seed):
                op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
                    hf_directory=directory, init_weights=True, seed=seed)).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
                return wait_done(self.d, self.d.call("Train", probe).id).train.first_loss

            self.assertEqual(first_loss(m.directory, 7), first_loss(only_config, 7))
            self.assertNotEqual(first_loss(only_config, 7), first_loss(only_config, 8))
            op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=empty)).id)
            self.assertEqual(op.error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
            self.assertIn("config.json", op.error.message)
        finally:
            shutil.rmtree(only_config)
            shutil.rmtree(empty)

    def test_placement_from_a_snapshot_keeps_no_hold_on_it(self):
        m = self.snapshot(name="to-map")
        req = pb.LoadModelRequest(hf_directory=m.directory, placement=[
            pb.ModulePlacement(module="model.layers.0", placement=pb.PLACEMENT_CPU),
            pb.ModulePlacement(module="model.layers.2", placement=pb.PLACEMENT_DISK)])
        op = wait_done(self.d, self.d.call("LoadModel", req).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        info = self.d.call("DescribeModel", pb.DescribeModelRequest())
        placement = {p.name: p.placement for p in info.parameters}
        self.assertEqual(placement["model.layers.2.mlp.up_proj.weight"], pb.PLACEMENT_DISK)
        self.assertEqual(placement["model.layers.0.mlp.up_proj.weight"], pb.PLACEMENT_CPU)
        self.assertEqual(placement["model.layers.1.mlp.up_proj.weight"], pb.PLACEMENT_DEVICE)
        train = wait_done(self.d, self.d.call("Train", pb.TrainRequest(steps=2, batch_size=2, seq_len=32)).id)
        self.assertEqual(train.state, pb.OPERATION_STATE_SUCCEEDED, train.error.message)
        # Training writes nothing back: the published snapshot is intact.
        parse_safetensors(os.path.join(m.directory, "model.safetensors"))
        # The disk-placed weights live in a spill file of the daemon's own,
        # so the snapshot may go while the model is loaded, and the model
        # trains on.
        self.d.call("DeleteSnapshot", pb.DeleteSnapshotRequest(name="to-map"))
        train = wait_done(self.d, self.d.call("Train", pb.TrainRequest(steps=1, batch_size=2, seq_len=32)).id)
        self.assertEqual(train.state, pb.OPERATION_STATE_SUCCEEDED, train.error.message)
        wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(preset="tiny")).id)

    def test_a_snapshot_a_queued_load_will_read_cannot_be_deleted(self):
        m = self.snapshot(name="to-load")
        # A long evaluation holds the owner thread, so the load waits in line.
        evaluation = self.d.call("Evaluate", pb.EvaluateRequest(batch_size=8, seq_len=256))
        load = self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=m.directory))
        with self.assertRaises(grpc.RpcError) as e:
            self.d.call("DeleteSnapshot", pb.DeleteSnapshotRequest(name="to-load"))
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn(load.id, e.exception.details())
        self.d.call("CancelOperation", pb.CancelOperationRequest(id=evaluation.id))
        done = wait_done(self.d, load.id)
        self.assertEqual(done.state, pb.OPERATION_STATE_SUCCEEDED, done.error.message)
        # Once the load is done, the snapshot is the client's to delete.
        self.d.call("DeleteSnapshot", pb.DeleteSnapshotRequest(name="to-load"))
        self.assertFalse(os.path.exists(m.directory))

    def test_memprofctl_snapshot_json_prints_the_manifest(self):
        r = self.d.ctl("snapshot", "cli-snap", "--json", "--dtype", "fp16")
        self.assertEqual(r.returncode, 0, r.stderr)
        manifest = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(manifest["name"], "cli-snap")
        self.assertTrue(os.path.isdir(manifest["directory"]))
        self.assertEqual(manifest["dtype"], "fp16")
        r = self.d.ctl("snapshots", "describe", "cli-snap")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("model.safetensors", r.stdout)
        r = self.d.ctl("snapshot", "bad/name")
        self.assertEqual(r.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", r.stderr)
        self.assertGreaterEqual(
            harness.metric(self.d.metrics_text(), "memprofd_snapshots_total", result="succeeded"), 1)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class SnapshotFaultTest(unittest.TestCase):
    def test_write_failure_midway_is_reported_and_cleaned_up(self):
        import resource
        root = tempfile.mkdtemp(prefix="memprofd-snaps-")
        d = Daemon("--snapshot_root=" + root)
        try:
            good = wait_done(d, d.call("Snapshot", pb.SnapshotRequest(name="good")).id)
            self.assertEqual(good.state, pb.OPERATION_STATE_SUCCEEDED)
            # Files may not grow past 1 MB from now on: the 16 MB model cannot be written.
            _, hard = resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (1 << 20, hard))
            bad = wait_done(d, d.call("Snapshot", pb.SnapshotRequest(name="too-big")).id)
            self.assertEqual(bad.state, pb.OPERATION_STATE_FAILED)
            self.assertEqual(bad.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                             bad.error.message)
            self.assertEqual(sorted(os.listdir(root)), ["good"])  # no partial or temporary dir
            resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (hard, hard))
            self.assertEqual(d.call("GetStatus", pb.GetStatusRequest()).serving_state, "SERVING")
            parse_safetensors(os.path.join(root, "good", "model.safetensors"))
            again = wait_done(d, d.call("Snapshot", pb.SnapshotRequest(name="too-big")).id)
            self.assertEqual(again.state, pb.OPERATION_STATE_SUCCEEDED, again.error.message)
            self.assertEqual(
                harness.metric(d.metrics_text(), "memprofd_snapshots_total", result="failed"), 1)
        finally:
            d.close()
            shutil.rmtree(root, ignore_errors=True)

    def test_unusable_snapshot_root_stops_the_start(self):
        with tempfile.NamedTemporaryFile() as f:  # a file, not a directory
            r = subprocess.run([harness.MEMPROFD, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                "--snapshot_root=" + f.name + "/snaps"],
                               capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("snaps", r.stderr)


class SnapshotFlagsTest(unittest.TestCase):
    def test_without_a_root_snapshots_are_off(self):
        d = Daemon()
        try:
            with self.assertRaises(grpc.RpcError) as e:
                d.call("Snapshot", pb.SnapshotRequest(name="x"))
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("--snapshot_root", e.exception.details())
        finally:
            d.close()

    def test_snapshot_on_shutdown_periodic_and_retention(self):
        root = tempfile.mkdtemp(prefix="memprofd-snaps-")
        # A leftover of a killed snapshot is cleaned at start.
        os.mkdir(os.path.join(root, ".tmp-old-abc123"))
        d = Daemon("--snapshot_root=" + root, "--snapshot_every_steps=2", "--keep_last=2",
                   "--snapshot_on_shutdown")
        try:
            self.assertFalse(os.path.exists(os.path.join(root, ".tmp-old-abc123")))
            wait_done(d, d.call("Train", pb.TrainRequest(steps=6, batch_size=1, seq_len=16)).id)
            # step-6 becomes visible when its directory is renamed into place; retention
            # removes step-2 just after that, when the snapshot operation finishes.
            names = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                names = sorted(s.name for s in d.call("ListSnapshots", pb.ListSnapshotsRequest()).snapshots)
                if names == ["step-4", "step-6"]:
                    break
                time.sleep(0.1)
            self.assertEqual(names, ["step-4", "step-6"])  # keep_last=2
            code, _ = d.stop(signal.SIGTERM, timeout=30)
            self.assertEqual(code, 0, d.output())
            shutdown = glob.glob(os.path.join(root, "shutdown-*"))
            self.assertEqual(len(shutdown), 1, os.listdir(root))
            parse_safetensors(os.path.join(shutdown[0], "model.safetensors"))
        finally:
            d.close()
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
