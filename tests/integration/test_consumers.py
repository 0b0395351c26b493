"""The real consumers over the wire: transformers and safetensors read what the
daemon writes and the daemon reads what they write, with the same loss on
both sides; PyTorch's own torch.cuda._memory_viz reads the daemon's memory
history dumps and reports the daemon's own totals.

Losses are compared on one fixed sequence of T + 1 tokens. The daemon's loss
is step 1 of a Train request whose only data is that sequence (batch 1,
seq_len T: the whole sequence is the one window), which the daemon computes
with the weights it holds before the optimizer's update; so every snapshot a
comparison reads is taken before that step. transformers' loss is
LlamaForCausalLM's with labels=input_ids (it shifts the labels itself), in
float32. Models are first trained a few steps on the sequence, so that their
weights, positions and attention matter to the loss: a fresh model's loss is
ln(vocab) give or take a little whatever its weights are.
"""

import base64
import collections
import copy
import json
import os
import pickle
import re
import subprocess
import sys
import time
import unittest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local

import torch  # noqa: E402
import torch.cuda._memory_viz as memory_viz  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import harness  # noqa: E402
from harness import pb, wait_done  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# The fixed sequence: T + 1 = 33 byte-level tokens (every preset's vocabulary
# holds the 256 byte values).
TOKENS = list(b"memprofd knows where every byte!!")
assert len(TOKENS) == 33
SEQ_LEN = len(TOKENS) - 1

# float32 on both sides, the same equations in a different order: the losses
# agree to a few float32 ulps (~1e-7 at a loss of ~1).
FP32_TOLERANCE = 1e-5

# The dtype each snapshot dtype stores, as safetensors and torch name it.
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --- the daemon's side -------------------------------------------------------

def succeeded(test, op):
    """Waits for operation `op`; fails `test` unless it succeeded; returns it done."""
    final = wait_done(test.d, op.id)
    test.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
    return final


def load_model(test, **kwargs):
    """LoadModel(**kwargs) to success; returns the ModelInfo."""
    return succeeded(test, test.d.call("LoadModel", pb.LoadModelRequest(**kwargs))).model


def take_snapshot(test, name, **kwargs):
    """Snapshot `name` (SnapshotRequest fields as kwargs) to success; returns its manifest."""
    return succeeded(test, test.d.call("Snapshot", pb.SnapshotRequest(name=name, **kwargs))).snapshot


def parameters(test):
    """DescribeModel's ParameterInfo list."""
    return test.d.call("DescribeModel", pb.DescribeModelRequest()).parameters


def train_on_tokens(test, steps, learning_rate=None):
    """Trains `steps` steps with TOKENS as the one window (at the daemon's
    learning rate unless given); returns (result, step reports)."""
    req = pb.TrainRequest(steps=steps, batch_size=1, seq_len=SEQ_LEN,
                          data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=TOKENS)))
    if learning_rate is not None:
        req.learning_rate = learning_rate
    op = test.d.call("Train", req)
    reports = list(test.d.stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=op.id),
                                                 timeout=300, metadata=test.d.metadata()))
    return succeeded(test, op).train, reports


def warm_up(test):
    """Ten steps at a high learning rate: the model starts to memorise TOKENS."""
    result, _ = train_on_tokens(test, steps=10, learning_rate=1e-2)
    test.assertLess(result.last_loss, result.first_loss - 1.0)


def daemon_loss(test):
    """The daemon's loss on TOKENS with the weights it holds now (then it trains one step)."""
    result, reports = train_on_tokens(test, steps=1)
    test.assertEqual([r.step for r in reports], [1])
    test.assertEqual(reports[0].tokens, SEQ_LEN)  # the whole sequence, once
    # The stream and the operation's result report the same number.
    test.assertEqual(reports[0].loss, result.first_loss)
    test.assertEqual(result.last_loss, result.first_loss)
    return result.first_loss


# --- the consumers' side -------------------------------------------------------

def input_ids():
    return torch.tensor([TOKENS], dtype=torch.int64)


def hf_loss(model):
    """transformers' loss on TOKENS of `model`, computed in float32."""
    model = model.float().eval()
    with torch.no_grad():
        return model(input_ids(), labels=input_ids()).loss.item()


def load_with_transformers(test, directory):
    """AutoModelForCausalLM.from_pretrained(directory) with no option; fails
    `test` unless every weight matched a parameter. Returns the model as loaded."""
    model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    test.assertIsInstance(model, LlamaForCausalLM)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        test.assertEqual(set(info[key]), set(), "%s: %s" % (directory, key))
    test.assertEqual(list(info["error_msgs"]), [], directory)
    return model


def write_config(directory, **fields):
    """A config.json in the daemon's own (transformers 4) style: rope_theta at the top level."""
    os.makedirs(directory, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "rope_scaling": None, "torch_dtype": "float32"}
    config.update(fields)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


# The tiny preset's shape with an untied head, and a rope_theta other than
# the default so that reading it wrong changes the loss.
UNTIED_TINY = dict(vocab_size=256, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                   rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)


class DaemonWithSnapshotsTest(harness.DaemonTestCase):
    """One daemon per class with a snapshot root, and a scratch folder for inputs."""

    SNAPSHOTS = True


class TransformersReadsSnapshotsTest(DaemonWithSnapshotsTest):
    """Every kind of daemon snapshot loads into transformers unchanged, with the daemon's loss."""

    def assert_same_loss(self, directory, expected):
        """transformers' loss of the float32 model in `directory` is the daemon's `expected`."""
        loss = hf_loss(load_with_transformers(self, directory))
        self.assertLessEqual(abs(loss - expected), FP32_TOLERANCE,
                             "%s: transformers %.8f, daemon %.8f" % (directory, loss, expected))

    def test_keep_and_fp32_snapshots_single_and_sharded_give_the_daemons_loss(self):
        load_model(self, preset="tiny", seed=1)
        warm_up(self)
        snaps = [take_snapshot(self, "tied-keep"),
                 take_snapshot(self, "tied-keep-sharded", max_shard_size="1MB"),
                 take_snapshot(self, "tied-fp32", dtype=pb.SNAPSHOT_DTYPE_FP32),
                 take_snapshot(self, "tied-fp32-sharded", dtype=pb.SNAPSHOT_DTYPE_FP32,
                               max_shard_size="1MB")]
        expected = daemon_loss(self)
        for m in snaps:
            files = {f.name for f in m.files}
            if "sharded" in m.name:
                self.assertIn("model.safetensors.index.json", files)
                self.assertGreater(len([f for f in files if f.endswith(".safetensors")]), 1)
            else:
                self.assertIn("model.safetensors", files)
            model = load_with_transformers(self, m.directory)
            self.assertEqual(model.dtype, torch.float32, m.name)
            # Tied: one tensor serves both, as in a model transformers made.
            self.assertEqual(model.lm_head.weight.data_ptr(), model.model.embed_tokens.weight.data_ptr())
            self.assertLessEqual(abs(hf_loss(model) - expected), FP32_TOLERANCE, m.name)

    def test_bf16_and_fp16_snapshots_are_the_rounded_weights_within_dtype_tolerance(self):
        load_model(self, preset="tiny", seed=2)
        warm_up(self)
        reference = take_snapshot(self, "rounding-reference")
        snaps = {"bfloat16": take_snapshot(self, "tied-bf16", dtype=pb.SNAPSHOT_DTYPE_BF16),
                 "float16": take_snapshot(self, "tied-fp16-sharded", dtype=pb.SNAPSHOT_DTYPE_FP16,
                                          max_shard_size="1MB")}
        expected = daemon_loss(self)
        fp32 = safetensors.torch.load_file(os.path.join(reference.directory, "model.safetensors"))
        for dtype_name, m in snaps.items():
            model = load_with_transformers(self, m.directory)
            # config.json's torch_dtype makes transformers load in that dtype...
            self.assertEqual(model.dtype, TORCH_DTYPES[dtype_name], m.name)
            # ... and the weights are the daemon's float32 ones rounded as torch rounds.
            state = model.state_dict()
            for name, weight in fp32.items():
                self.assertTrue(torch.equal(state[name], weight.to(TORCH_DTYPES[dtype_name])),
                                "%s: %s" % (m.name, name))
            # The loss of the rounded weights (computed in float32) against the
            # daemon's float32 loss, relative, within the dtype's machine
            # epsilon (2^-7 for bfloat16, 2^-10 for float16): rounding moves
            # each weight by at most half of that relative, and the loss moves
            # far less (measured on seeds 2-4: 0.5-2% of the bound for
            # bfloat16, 0.2-0.5% for float16). The exact check above pins the
            # weights themselves.
            loss = hf_loss(model)
            bound = torch.finfo(TORCH_DTYPES[dtype_name]).eps * abs(expected)
            self.assertLessEqual(abs(loss - expected), bound,
                                 "%s: transformers %.8f, daemon %.8f" % (m.name, loss, expected))

    def test_untied_head_snapshot_keeps_both_matrices_and_the_rope_theta(self):
        config_only = os.path.join(self.scratch, "untied-config")
        write_config(config_only, **UNTIED_TINY)
        info = load_model(self, hf_directory=config_only, seed=3, init_weights=True)  # fresh weights
        self.assertFalse(info.config.tie_word_embeddings)
        self.assertEqual(info.config.rope_theta, 500000.0)
        warm_up(self)
        snaps = [take_snapshot(self, "untied-keep"),
                 take_snapshot(self, "untied-sharded", max_shard_size="1MB")]
        expected = daemon_loss(self)
        for m in snaps:
            model = load_with_transformers(self, m.directory)
            self.assertFalse(model.config.tie_word_embeddings, m.name)
            self.assertEqual(model.config.rope_parameters["rope_theta"], 500000.0, m.name)
            self.assertNotEqual(model.lm_head.weight.data_ptr(), model.model.embed_tokens.weight.data_ptr())
            self.assertFalse(torch.equal(model.lm_head.weight, model.model.embed_tokens.weight))
            self.assertLessEqual(abs(hf_loss(model) - expected), FP32_TOLERANCE, m.name)

    def test_snapshots_of_cpu_and_disk_placed_models_give_the_daemons_loss(self):
        # Disk weights from a snapshot of the daemon's own (copied to a spill
        # file, as every directory's are).
        load_model(self, preset="tiny", seed=4)
        warm_up(self)
        base = take_snapshot(self, "placement-base")
        placement = {"model.embed_tokens": pb.PLACEMENT_CPU, "model.layers.0": pb.PLACEMENT_DISK,
                     "model.layers.2": pb.PLACEMENT_CPU, "model.norm": pb.PLACEMENT_DISK}
        load_model(self, hf_directory=base.directory, placement=[
            pb.ModulePlacement(module=k, placement=v) for k, v in placement.items()])
        described = {p.name: p.placement for p in parameters(self)}
        self.assertEqual(described["model.layers.0.self_attn.q_proj.weight"], pb.PLACEMENT_DISK)
        self.assertEqual(described["model.embed_tokens.weight"], pb.PLACEMENT_CPU)
        placed = take_snapshot(self, "placement-from-snapshot")
        expected = daemon_loss(self)
        # The placed model is the same model: same tensors, and one loss on all three sides.
        base_tensors = safetensors.torch.load_file(os.path.join(base.directory, "model.safetensors"))
        placed_tensors = safetensors.torch.load_file(os.path.join(placed.directory, "model.safetensors"))
        self.assertEqual(set(base_tensors), set(placed_tensors))
        for name, tensor in base_tensors.items():
            self.assertTrue(torch.equal(placed_tensors[name], tensor), name)
        self.assert_same_loss(placed.directory, expected)
        self.assert_same_loss(base.directory, expected)

        # Disk weights from a spill file: a preset has no safetensors to map.
        load_model(self, preset="tiny", seed=5, placement=[
            pb.ModulePlacement(module="model.layers.1", placement=pb.PLACEMENT_DISK),
            pb.ModulePlacement(module="model.layers.3", placement=pb.PLACEMENT_CPU)])
        warm_up(self)
        spilled = take_snapshot(self, "placement-spilled", max_shard_size="1MB")
        self.assert_same_loss(spilled.directory, daemon_loss(self))
        load_model(self, preset="tiny")  # nothing mapped any more


class SafetensorsReadsSnapshotsTest(DaemonWithSnapshotsTest):
    """The safetensors library opens every file the daemon writes, as its index says."""

    def test_safe_open_reads_every_file_with_the_index_names_and_shapes(self):
        # Every layout and dtype, tied and untied.
        load_model(self, preset="tiny", seed=1)
        take_snapshot(self, "tied-keep")
        take_snapshot(self, "tied-bf16-sharded", dtype=pb.SNAPSHOT_DTYPE_BF16, max_shard_size="1MB")
        take_snapshot(self, "tied-fp16", dtype=pb.SNAPSHOT_DTYPE_FP16)
        untied = os.path.join(self.scratch, "untied")
        write_config(untied, **UNTIED_TINY)
        load_model(self, hf_directory=untied, seed=2, init_weights=True)
        take_snapshot(self, "untied-fp32-sharded", dtype=pb.SNAPSHOT_DTYPE_FP32, max_shard_size="1MB")
        take_snapshot(self, "untied-bf16", dtype=pb.SNAPSHOT_DTYPE_BF16)
        # All the daemon wrote, these five and any other test's.
        manifests = self.d.call("ListSnapshots", pb.ListSnapshotsRequest()).snapshots
        self.assertLessEqual({"tied-keep", "tied-bf16-sharded", "tied-fp16", "untied-fp32-sharded",
                              "untied-bf16"}, {m.name for m in manifests})
        for m in manifests:
            with open(os.path.join(m.directory, "config.json")) as f:
                config = json.load(f)
            # What transformers would hold for that config.json, from
            # transformers itself (on the meta device: shapes, no memory).
            with torch.device("meta"):
                reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(m.directory))
            expected = {name: list(t.shape) for name, t in reference.state_dict().items()}
            if config["tie_word_embeddings"]:
                del expected["lm_head.weight"]  # written once, under the embedding's name
            names = sorted(f.name for f in m.files if f.name.endswith(".safetensors"))
            if len(names) > 1:
                with open(os.path.join(m.directory, "model.safetensors.index.json")) as f:
                    index = json.load(f)
            else:
                self.assertEqual(names, ["model.safetensors"], m.name)
                index = {"weight_map": {name: names[0] for name in expected},
                         "metadata": {"total_size": m.total_size}}
            self.assertEqual(set(index["weight_map"]), set(expected), m.name)
            self.assertEqual(set(index["weight_map"].values()), set(names), m.name)
            seen, total = {}, 0
            for name in names:
                path = os.path.join(m.directory, name)
                with safetensors.safe_open(path, framework="pt") as f:
                    self.assertEqual(f.metadata(), {"format": "pt"}, path)
                    for key in f.keys():
                        self.assertNotIn(key, seen, path)
                        self.assertEqual(index["weight_map"][key], name, key)
                        piece = f.get_slice(key)
                        seen[key] = piece.get_shape()
                        self.assertEqual(piece.get_dtype(), SAFETENSORS_DTYPES[config["torch_dtype"]], key)
                # load_file reads the same tensors, with the bytes the header promises.
                tensors = safetensors.torch.load_file(path)
                self.assertEqual({k: list(t.shape) for k, t in tensors.items()},
                                 {k: s for k, s in seen.items() if index["weight_map"][k] == name})
                for t in tensors.values():
                    self.assertEqual(t.dtype, TORCH_DTYPES[config["torch_dtype"]])
                    total += t.numel() * t.element_size()
            self.assertEqual(seen, expected, m.name)
            self.assertEqual(total, index["metadata"]["total_size"], m.name)
            self.assertEqual(total, m.total_size, m.name)

    def test_a_file_safetensors_wrote_loads_and_snapshots_back_bit_for_bit(self):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                             tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        directory = os.path.join(self.scratch, "save-file")
        config.save_pretrained(directory)
        safetensors.torch.save_file(state, os.path.join(directory, "model.safetensors"),
                                    metadata={"format": "pt"})
        load_model(self, hf_directory=directory)
        described = {p.name: list(p.shape) for p in parameters(self)}
        self.assertEqual(described, {k: list(v.shape) for k, v in state.items()})
        back = take_snapshot(self, "save-file-round-trip")
        self.assertLessEqual(abs(daemon_loss(self) - hf_loss(model)), FP32_TOLERANCE)
        written = safetensors.torch.load_file(os.path.join(back.directory, "model.safetensors"))
        self.assertEqual(set(written), set(state))
        for name, tensor in state.items():
            self.assertTrue(torch.equal(written[name], tensor), name)


class DaemonReadsTransformersTest(harness.DaemonTestCase):
    """A model transformers made and saved loads into the daemon with transformers' loss."""

    def test_sharded_save_pretrained_gqa_untied_model_gives_the_same_loss(self):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                             rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
        # Some steps on TOKENS, so that positions (and so rope_theta) matter.
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(20):
            model(input_ids(), labels=input_ids()).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        expected = hf_loss(model)
        # The comparison can tell rope_theta apart: the default 10000 gives another loss.
        other_config = copy.deepcopy(config)
        other_config.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
        other = LlamaForCausalLM(other_config)
        other.load_state_dict(model.state_dict())
        self.assertGreater(abs(hf_loss(other) - expected), 1000 * FP32_TOLERANCE)  # measured: 0.086

        directory = os.path.join(self.scratch, "save-pretrained")
        model.save_pretrained(directory, max_shard_size="100KB")
        shards = [f for f in os.listdir(directory) if f.endswith(".safetensors")]
        self.assertGreater(len(shards), 1)
        info = load_model(self, hf_directory=directory)
        self.assertEqual(info.source, directory)
        described = {p.name: list(p.shape) for p in parameters(self)}
        self.assertEqual(described, {k: list(v.shape) for k, v in model.state_dict().items()})
        # The config as transformers wrote it (transformers 5 writes rope_theta
        # inside "rope_parameters", and "dtype" for "torch_dtype").
        for field, value in (("num_attention_heads", 4), ("num_key_value_heads", 2),
                             ("tie_word_embeddings", False), ("rms_norm_eps", 1e-5),
                             ("rope_theta", 500000.0), ("max_position_embeddings", 128)):
            with self.subTest(field=field):
                self.assertEqual(getattr(info.config, field), value)
        with self.subTest("loss"):
            loss = daemon_loss(self)
            self.assertLessEqual(abs(loss - expected), FP32_TOLERANCE,
                                 "daemon %.8f, transformers %.8f" % (loss, expected))


def cpu_memory(d):
    """The daemon's CPU DeviceMemory once it is idle: two reads 0.3 s apart agree."""
    def read():
        stats = d.call("GetMemoryStats", pb.GetMemoryStatsRequest())
        cpu = [m for m in stats.devices if m.device == "cpu"][0]
        return stats, (cpu.current_bytes, cpu.allocations_total, cpu.frees_total)
    _, last = read()
    deadline = time.time() + 30
    while time.time() < deadline:
        time.sleep(0.3)
        stats, now = read()
        if now == last:
            return stats, now
        last = now
    raise AssertionError("CPU memory never settled: %r" % (last,))


def run_memory_viz(*args):
    """python -m torch.cuda._memory_viz ARGS, as an engineer runs it; returns stdout."""
    r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz"] + list(args),
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError("_memory_viz %s failed:\n%s" % (" ".join(args), r.stderr))
    return r.stdout


def embedded_snapshot(html):
    """The pickle a trace_plot/segment_plot page embeds, unpickled."""
    match = re.search(r"const local_files = (\[.*\])\n", html)
    assert match, "no embedded snapshot in the page"
    files = json.loads(match.group(1))
    assert [f["name"] for f in files] == ["snapshot.pickle"], files
    return pickle.loads(base64.b64decode(files[0]["base64"]))  # ignores the zero padding


class MemoryVizReadsHistoryTest(harness.DaemonTestCase):
    """torch.cuda._memory_viz reads a dump of a few training steps and reports the
    daemon's own counts: the dump is taken while the daemon is idle, so the live
    blocks in its segments are the allocated bytes GetMemoryStats reports, and
    its trace holds every allocation and free since recording started (nothing
    dropped from the ring)."""

    DAEMON_FLAGS = ("--device=cpu",)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        for op in cls.d.call("ListOperations", pb.ListOperationsRequest()).operations:
            wait_done(cls.d, op.id)  # the start-up load, if still running
        cpu_memory(cls.d)
        cls.d.call("StartMemoryRecording", pb.StartMemoryRecordingRequest(max_entries=1_000_000))
        # Recording starts with one synthetic alloc per block already live
        # (the parameters, with their names), so none shows as a ghost block.
        started, cls.at_start = cpu_memory(cls.d)
        cls.live_at_start = started.history_entries
        # The first steps of this model: the optimizer state is made while recording.
        op = cls.d.call("Train", pb.TrainRequest(steps=3, batch_size=1, seq_len=SEQ_LEN))
        cls.train = wait_done(cls.d, op.id)
        cls.before_dump, cls.at_dump = cpu_memory(cls.d)
        data = b"".join(c.data for c in cls.d.stub.DumpMemoryHistory(
            pb.DumpMemoryHistoryRequest(), timeout=60, metadata=cls.d.metadata()))
        _, cls.after_dump = cpu_memory(cls.d)
        cls.d.call("StopMemoryRecording", pb.StopMemoryRecordingRequest())
        cls.path = os.path.join(cls.scratch, "history.pickle")
        with open(cls.path, "wb") as f:
            f.write(data)
        cls.snap = pickle.loads(data)
        # CUDA devices first, then the CPU (none here, but a GPU host lists them).
        cls.cpu = len(cls.snap["device_traces"]) - 1

    def setUp(self):
        self.assertEqual(self.train.state, pb.OPERATION_STATE_SUCCEEDED, self.train.error.message)
        self.assertEqual(self.at_dump, self.after_dump, "the daemon allocated while dumping")
        self.assertEqual(self.before_dump.history_dropped, 0)

    def allocated_bytes(self):
        return self.at_dump[0]

    def recorded_counts(self):
        """(allocations, frees) the daemon counted while recording."""
        return self.at_dump[1] - self.at_start[1], self.at_dump[2] - self.at_start[2]

    def test_stats_reports_the_daemons_allocated_bytes(self):
        out = run_memory_viz("stats", self.path)  # segsum: checks its own accounting too
        cpu_segments = [s for s in self.snap["segments"] if s["device"] == self.cpu]
        self.assertEqual(cpu_segments, self.snap["segments"])  # --device=cpu: nothing else
        # total_allocated is the sum of the live blocks' requested sizes.
        self.assertIn("total_allocated: %r\n" % memory_viz.Bytes(self.allocated_bytes()), out)
        self.assertIn("segments: %d\n" % len(cpu_segments), out)
        reserved = sum(s["total_size"] for s in cpu_segments)
        self.assertIn("total_reserved: %r\n" % memory_viz.Bytes(reserved), out)
        self.assertEqual(out, memory_viz.segsum(self.snap) + "\n")  # the CLI prints the helper's text

    def test_trace_counts_every_allocation_and_free_the_daemon_counted(self):
        out = run_memory_viz("trace", self.path)
        allocs, frees = self.recorded_counts()
        self.assertGreater(allocs, 0)
        self.assertGreater(frees, 0)
        self.assertGreater(self.live_at_start, 0)
        self.assertEqual(self.before_dump.history_entries, self.live_at_start + allocs + frees)
        section = out.split("Device %d ----------------\n" % self.cpu)[1]
        # Every free is a free_requested ("del") directly followed by its
        # free_completed; each CPU block is its own segment (the CPU allocator
        # keeps no cache), so each alloc and free also maps and unmaps one; the
        # trace ends with one "snapshot" marker (of category "unknown", which
        # the viewer's category filter needs).
        trace = self.snap["device_traces"][self.cpu]
        actions = collections.Counter(e["action"] for e in trace)
        self.assertEqual(actions["alloc"], self.live_at_start + allocs)
        self.assertEqual(actions["free_requested"], frees)
        self.assertEqual(actions["free_completed"], frees)
        self.assertEqual(actions["segment_alloc"], actions["alloc"])
        self.assertEqual(actions["segment_free"], frees)
        self.assertEqual(actions["snapshot"], 1)
        self.assertTrue(section.startswith("%d entries\n" % len(trace)), section[:100])
        lines = section.splitlines()
        self.assertEqual(sum(1 for l in lines if re.match(r"\S+ = \S+\[\d+:", l)),
                         self.live_at_start + allocs)
        self.assertEqual(sum(1 for l in lines if l.startswith("del ")), frees)
        self.assertEqual(sum(1 for l in lines if l.startswith("# free completed for ")), frees)

    def test_segments_and_memory_flamegraphs_sum_to_the_allocated_bytes(self):
        # Without flamegraph.pl (it would be downloaded): the folded stack lines,
        # "stream_0;seg_ADDR;STATE;FRAMES BYTES".
        for view in (memory_viz.segments, memory_viz.memory):
            lines = view(self.snap, format_flamegraph=lambda folded: folded).splitlines()
            live = sum(int(l.rsplit(" ", 1)[1]) for l in lines
                       if ";active_allocated;" in l and ";<gaps> " not in l)
            self.assertEqual(live, self.allocated_bytes(), view.__name__)
            # The stacks name the phase and step of each live block made while
            # recording (the frame under its module:op frame).
            self.assertTrue(any(re.search(r";memprofd:1:optimizer step 1[; ]", l) for l in lines),
                            view.__name__)

    def test_trace_plot_embeds_the_dump_and_unfreed_allocations_are_the_live_ones(self):
        out = os.path.join(self.scratch, "trace.html")
        run_memory_viz("trace_plot", self.path, "-o", out)
        with open(out) as f:
            html = f.read()
        self.assertIn("Active Memory Timeline", html)
        self.assertEqual(embedded_snapshot(html), self.snap)
        self.assertEqual(embedded_snapshot(memory_viz.segment_plot(self.snap)), self.snap)
        # filter_freed keeps the allocations never freed: exactly the live
        # blocks that were allocated while recording (those carry a frame).
        filtered = embedded_snapshot(memory_viz.trace_plot(copy.deepcopy(self.snap), filter_freed=True))
        unfreed = sorted((e["addr"], e["size"]) for e in filtered["device_traces"][self.cpu]
                         if e["action"] == "alloc")
        live = sorted((b["address"], b["size"]) for s in self.snap["segments"] for b in s["blocks"]
                      if b["state"] == "active_allocated" and b["frames"])
        self.assertEqual(unfreed, live)
        # Among them AdamW's two moments of the 4M float32 parameters, made in step 1.
        self.assertGreaterEqual(sum(size for _, size in unfreed), 32_000_000)


if __name__ == "__main__":
    unittest.main()
