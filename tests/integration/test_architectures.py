"""The models users bring, made and saved by transformers itself: Llama with
each rotary scaling the daemon reads (default, linear, dynamic, llama3, yarn;
from transformers 5's rope_parameters and from the older rope_scaling form),
an explicit head_dim and attention and MLP biases; Mistral with and without
its sliding window; Qwen2 (q/k/v biases, a window on its upper layers) and
Qwen3 (q/k norms, head_dim 128 by default), at a sequence longer than the
windows and than original_max_position_embeddings so that each setting
matters. The daemon's evaluation loss equals transformers' on the same
tokens in both attention implementations, and its snapshot loads in
AutoModelForCausalLM as the same class with the same settings and the same
loss.

The real daemon (harness.Daemon) and the real transformers from the venv."""

import json
import os
import unittest

import torch
import transformers

import harness
from harness import pb, wait_done

SEQ_LEN = 96  # longer than ORIGINAL_MAX below: the scaled frequencies matter
ORIGINAL_MAX = 32
WINDOW = 16  # sliding windows shorter than SEQ_LEN

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
            initializer_range=0.2)  # far from uniform logits: the rotary settings show in the loss

# name -> (transformers class, config kwargs beyond BASE)
LLAMA = transformers.LlamaForCausalLM
CASES = {
    "default": (LLAMA, dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "linear": (LLAMA, dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                            "factor": 4.0})),
    # Dynamic NTK rescales only past max_position_embeddings (the daemon's
    # limit), so it computes as default; transformers agrees.
    "dynamic": (LLAMA, dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                             "factor": 2.0})),
    "llama3": (LLAMA, dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                            "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": ORIGINAL_MAX})),
    "yarn": (LLAMA, dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                          "factor": 4.0,
                                          "original_max_position_embeddings": ORIGINAL_MAX})),
    # An explicit head_dim other than hidden / heads (as Qwen3 and many recent
    # configs have) with a tied head.
    "head_dim": (LLAMA, dict(head_dim=32, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "biases": (LLAMA, dict(attention_bias=True, mlp_bias=True)),
    "mistral": (transformers.MistralForCausalLM, dict(sliding_window=WINDOW)),
    "mistral-full": (transformers.MistralForCausalLM, dict(sliding_window=None)),
    # Layer 1 of 2 slides (max_window_layers 1), layer 0 attends to all.
    "qwen2": (transformers.Qwen2ForCausalLM, dict(use_sliding_window=True, sliding_window=WINDOW,
                                                  max_window_layers=1)),
    "qwen3": (transformers.Qwen3ForCausalLM, dict(head_dim=32)),
    "qwen3-window": (transformers.Qwen3ForCausalLM, dict(attention_bias=True, use_sliding_window=True,
                                                         sliding_window=WINDOW, max_window_layers=0)),
}
# What the snapshot's config must give back, beyond rope_parameters.
FIELDS = ("head_dim", "sliding_window", "layer_types", "attention_bias", "mlp_bias",
          "tie_word_embeddings")


def tokens(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, BASE["vocab_size"], (SEQ_LEN + 1,), generator=g)


def hf_loss(model, ids):
    with torch.no_grad():
        return model(input_ids=ids.unsqueeze(0), labels=ids.unsqueeze(0)).loss.item()


class ArchitectureParityTest(harness.DaemonTestCase):
    SNAPSHOTS = True

    def make(self, name, cls, kwargs):
        config = cls.config_class(**dict(BASE, **kwargs))
        torch.manual_seed(7)
        model = cls(config).eval()
        with torch.no_grad():  # norms away from 1 and biases away from 0, so a dropped one shows
            for n, p in model.named_parameters():
                if "norm" in n or n.endswith(".bias"):
                    p.add_(torch.randn_like(p) * 0.1)
        directory = os.path.join(self.scratch, name)
        model.save_pretrained(directory)
        return model, directory

    def daemon_loss(self, ids, attention="sdpa"):
        op = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=ids.tolist())),
            batch_size=1, seq_len=SEQ_LEN, attn_implementation=attention)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        return op.evaluate.loss

    def check(self, name, cls, kwargs):
        model, directory = self.make(name, cls, kwargs)
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=directory)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, "%s: %s" % (name, op.error.message))
        ids = tokens(3)
        expected = hf_loss(model, ids)
        for attention in ("sdpa", "eager"):
            model.config._attn_implementation = attention
            reference = hf_loss(model, ids)
            got = self.daemon_loss(ids, attention)
            print("%-12s %-5s transformers %.7f daemon %.7f |diff| %.2e"
                  % (name, attention, reference, got, abs(reference - got)))
            self.assertAlmostEqual(got, reference, delta=1e-5 * max(1.0, abs(reference)),
                                   msg="%s %s" % (name, attention))

        # DescribeModel says what the daemon built.
        described = self.d.call("DescribeModel", pb.DescribeModelRequest()).config
        self.assertEqual(described.architecture, cls.__name__, name)
        self.assertEqual(described.model_type, model.config.model_type, name)
        head_dim = getattr(model.config, "head_dim", None) or BASE["hidden_size"] // BASE["num_attention_heads"]
        self.assertEqual(described.head_dim, head_dim, name)
        windowed = [i for i, t in enumerate(getattr(model.config, "layer_types", None) or [])
                    if t == "sliding_attention" and model.config.sliding_window]
        if cls is transformers.MistralForCausalLM and model.config.sliding_window:
            windowed = list(range(BASE["num_hidden_layers"]))
        self.assertEqual(list(described.sliding_window_layers), windowed, name)

        # The daemon's snapshot is the same model to transformers.
        snap = wait_done(self.d, self.d.call("Snapshot", pb.SnapshotRequest(name="arch-" + name)).id)
        self.assertEqual(snap.state, pb.OPERATION_STATE_SUCCEEDED, snap.error.message)
        with open(os.path.join(snap.snapshot.directory, "config.json")) as f:
            written = json.load(f)
        back, info = transformers.AutoModelForCausalLM.from_pretrained(
            snap.snapshot.directory, output_loading_info=True)
        self.assertIs(type(back), cls)
        self.assertEqual((list(info["missing_keys"]), list(info["unexpected_keys"])), ([], []), name)
        for field in FIELDS:
            self.assertEqual(getattr(back.config, field, None), getattr(model.config, field, None),
                             "%s: %s in %s" % (name, field, written))
        rope = model.config.rope_parameters
        for key, value in rope.items():
            self.assertEqual(back.config.rope_parameters.get(key), value, "%s: %s in %s" % (name, key, written))
        self.assertAlmostEqual(hf_loss(back.eval(), ids), expected, delta=1e-5, msg=name)

    def test_each_family_and_setting_gives_transformers_loss(self):
        for name, (cls, kwargs) in CASES.items():
            with self.subTest(name):
                self.check(name, cls, kwargs)

    def train(self, directory, **fields):
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=directory)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        ids = tokens(5).tolist() * 3
        op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
            steps=3, batch_size=2, seq_len=SEQ_LEN // 2, seed=1,
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=ids)), **fields)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        return op.train.last_loss

    def check_attribution(self):
        # The family's own parameters carry their names and categories, and
        # the q/k norms' work is attention's.
        rows = self.d.call("GetMemoryBreakdown", pb.GetMemoryBreakdownRequest(by="module", top=10000)).rows
        by_key = {}
        for r in rows:
            by_key.setdefault(r.key, set()).add(r.category)
        for name in ("model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
                     "model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.o_proj.bias"):
            self.assertTrue({"parameters", "gradients", "optimizer_state"} <= by_key.get(name, set()),
                            "%s: %s" % (name, by_key.get(name)))
        kinds = {r.key: r.module_kind for r in rows}
        self.assertEqual(kinds.get("model.layers.0.self_attn.q_norm"), "attention", sorted(kinds)[:40])

    def test_offloading_checkpointing_and_bf16_train_each_family(self):
        # Offloading never changes the math: the same losses bit for bit;
        # checkpointing recomputes the same forward; bf16 autocast trains too.
        for name in ("biases", "mistral", "qwen2", "qwen3-window"):
            with self.subTest(name):
                _, directory = self.make("train-" + name, *CASES[name])
                plain = self.train(directory)
                offload = pb.OffloadOptions(enabled=True, target=pb.OFFLOAD_TARGET_DISK,
                                            min_offload_bytes=1)
                offloaded = self.train(directory, offload=offload)
                checkpointed = self.train(directory, gradient_checkpointing=True, offload=offload)
                bf16 = self.train(directory, mixed_precision="bf16")
                print("%-12s plain %.7f offloaded %.7f +checkpointing %.7f bf16 %.5f"
                      % (name, plain, offloaded, checkpointed, bf16))
                self.assertEqual(offloaded, plain, name)
                if name == "qwen3-window":
                    self.check_attribution()
                self.assertAlmostEqual(checkpointed, plain, delta=1e-6 * abs(plain), msg=name)
                self.assertAlmostEqual(bf16, plain, delta=0.05 * abs(plain), msg=name)

    def test_placement_on_cpu_and_disk_keeps_each_familys_loss(self):
        # Layer 0 on the CPU placement, layer 1 on disk (frozen; a spill file
        # of the daemon's own, the directory being no snapshot of its own):
        # the same evaluation loss as all on the device.
        for name in ("biases", "qwen2", "qwen3-window"):
            with self.subTest(name):
                model, directory = self.make("placed-" + name, *CASES[name])
                ids = tokens(6)
                expected = hf_loss(model, ids)
                op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
                    hf_directory=directory, placement=[
                        pb.ModulePlacement(module="model.layers.0", placement=pb.PLACEMENT_CPU),
                        pb.ModulePlacement(module="model.layers.1", placement=pb.PLACEMENT_DISK)])).id)
                self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
                placed = {p.name: p.placement for p in
                          self.d.call("DescribeModel", pb.DescribeModelRequest()).parameters}
                bias = "model.layers.1.self_attn.q_proj.bias"
                self.assertEqual(placed[bias], pb.PLACEMENT_DISK, name)
                self.assertAlmostEqual(self.daemon_loss(ids), expected, delta=1e-5 * expected, msg=name)
                train = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
                    steps=1, batch_size=1, seq_len=SEQ_LEN,
                    data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=ids.tolist())))).id)
                self.assertEqual(train.state, pb.OPERATION_STATE_SUCCEEDED, train.error.message)

    def test_a_preset_saved_by_the_daemon_is_the_same_model_to_transformers(self):
        # SmolLM2-135M's shape from random weights: the reverse direction.
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(preset="smollm2-135m", seed=3)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        info = self.d.call("DescribeModel", pb.DescribeModelRequest())
        self.assertEqual(info.num_parameters, 134515008)
        g = torch.Generator().manual_seed(9)
        ids = torch.randint(0, info.config.vocab_size, (65,), generator=g)
        ev = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=ids.tolist())),
            batch_size=1, seq_len=64)).id)
        self.assertEqual(ev.state, pb.OPERATION_STATE_SUCCEEDED, ev.error.message)
        snap = wait_done(self.d, self.d.call("Snapshot", pb.SnapshotRequest(name="smollm2")).id)
        self.assertEqual(snap.state, pb.OPERATION_STATE_SUCCEEDED, snap.error.message)
        back = transformers.AutoModelForCausalLM.from_pretrained(snap.snapshot.directory).eval()
        self.assertIs(type(back), transformers.LlamaForCausalLM)
        self.assertEqual(back.num_parameters(), 134515008)
        expected = hf_loss(back, ids)
        print("smollm2-135m preset: daemon %.7f transformers %.7f" % (ev.evaluate.loss, expected))
        self.assertAlmostEqual(ev.evaluate.loss, expected, delta=1e-5 * expected)

    def test_the_older_rope_scaling_form_reads_the_same(self):
        # A transformers 4 config.json: "rope_scaling" with "type" and a
        # top-level rope_theta.
        model, directory = self.make("llama3-v4", *CASES["llama3"])
        path = os.path.join(directory, "config.json")
        with open(path) as f:
            config = json.load(f)
        rope = config.pop("rope_parameters")
        config["rope_theta"] = rope.pop("rope_theta")
        rope["type"] = rope.pop("rope_type")
        config["rope_scaling"] = rope
        with open(path, "w") as f:
            json.dump(config, f)
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=directory)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        ids = tokens(4)
        self.assertAlmostEqual(self.daemon_loss(ids), hf_loss(model, ids), delta=1e-5)

    def test_unsupported_rope_types_are_refused_by_name(self):
        for rope_type in ("longrope", "made-up"):
            directory = os.path.join(self.scratch, "rope-" + rope_type)
            os.makedirs(directory)
            config = dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama",
                          rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0,
                                           "factor": 2.0})
            with open(os.path.join(directory, "config.json"), "w") as f:
                json.dump(config, f)
            op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
                hf_directory=directory, init_weights=True)).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_FAILED, rope_type)
            self.assertIn("rope", op.error.message)
            self.assertIn("llama3", op.error.message)  # it lists what is supported

    def test_other_families_are_refused_naming_what_is_supported(self):
        for arch, model_type in (("GemmaForCausalLM", "gemma"), ("MixtralForCausalLM", "mixtral")):
            directory = os.path.join(self.scratch, model_type)
            os.makedirs(directory)
            with open(os.path.join(directory, "config.json"), "w") as f:
                json.dump(dict(BASE, architectures=[arch], model_type=model_type), f)
            op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(
                hf_directory=directory, init_weights=True)).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_FAILED, arch)
            self.assertEqual(op.error.code, 3, op.error.message)  # INVALID_ARGUMENT
            self.assertIn("model_type", op.error.message)
            self.assertIn("Qwen3ForCausalLM", op.error.message)


if __name__ == "__main__":
    unittest.main()
