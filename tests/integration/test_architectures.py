"""The models users bring, made and saved by transformers itself: Llama with
each rotary scaling the daemon reads (default, linear, llama3, yarn; from
transformers 5's rope_parameters and from the older rope_scaling form) and an
explicit head_dim, at a sequence longer than original_max_position_embeddings
so that the scaling matters. The daemon's evaluation loss equals transformers'
on the same tokens, and its snapshot loads in AutoModelForCausalLM as the same
class with the same rotary settings and the same loss.

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

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
            initializer_range=0.2)  # far from uniform logits: the rotary settings show in the loss

# name -> (config kwargs beyond BASE)
CASES = {
    "default": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "linear": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    "llama3": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": ORIGINAL_MAX}),
    "yarn": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": ORIGINAL_MAX}),
    # An explicit head_dim other than hidden / heads (as Qwen3 and many recent
    # configs have) with a tied head.
    "head_dim": dict(head_dim=32, tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}


def tokens(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, BASE["vocab_size"], (SEQ_LEN + 1,), generator=g)


def hf_loss(model, ids):
    with torch.no_grad():
        return model(input_ids=ids.unsqueeze(0), labels=ids.unsqueeze(0)).loss.item()


class ArchitectureParityTest(harness.DaemonTestCase):
    SNAPSHOTS = True

    def make(self, name, kwargs):
        config = transformers.LlamaConfig(**dict(BASE, **kwargs))
        torch.manual_seed(7)
        model = transformers.LlamaForCausalLM(config).eval()
        with torch.no_grad():  # norms away from 1, so a dropped one shows
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.add_(torch.randn_like(p) * 0.1)
        directory = os.path.join(self.scratch, name)
        model.save_pretrained(directory)
        return model, directory

    def daemon_loss(self, ids):
        op = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=ids.tolist())),
            batch_size=1, seq_len=SEQ_LEN)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        return op.evaluate.loss

    def check(self, name, kwargs):
        model, directory = self.make(name, kwargs)
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=directory)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, "%s: %s" % (name, op.error.message))
        ids = tokens(3)
        expected = hf_loss(model, ids)
        got = self.daemon_loss(ids)
        print("%-9s transformers %.7f daemon %.7f |diff| %.2e" % (name, expected, got, abs(expected - got)))
        self.assertAlmostEqual(got, expected, delta=1e-5 * max(1.0, abs(expected)), msg=name)

        # The daemon's snapshot is the same model to transformers.
        snap = wait_done(self.d, self.d.call("Snapshot", pb.SnapshotRequest(name="arch-" + name)).id)
        self.assertEqual(snap.state, pb.OPERATION_STATE_SUCCEEDED, snap.error.message)
        with open(os.path.join(snap.snapshot.directory, "config.json")) as f:
            written = json.load(f)
        back, info = transformers.AutoModelForCausalLM.from_pretrained(
            snap.snapshot.directory, output_loading_info=True)
        self.assertIs(type(back), transformers.LlamaForCausalLM)
        self.assertEqual((list(info["missing_keys"]), list(info["unexpected_keys"])), ([], []), name)
        self.assertEqual(back.config.head_dim, model.config.head_dim, name)
        rope = model.config.rope_parameters
        for key, value in rope.items():
            self.assertEqual(back.config.rope_parameters.get(key), value, "%s: %s in %s" % (name, key, written))
        self.assertAlmostEqual(hf_loss(back.eval(), ids), expected, delta=1e-5, msg=name)

    def test_each_rope_type_and_head_dim_gives_transformers_loss(self):
        for name, kwargs in CASES.items():
            with self.subTest(name):
                self.check(name, kwargs)

    def test_the_older_rope_scaling_form_reads_the_same(self):
        # A transformers 4 config.json: "rope_scaling" with "type" and a
        # top-level rope_theta.
        model, directory = self.make("llama3-v4", CASES["llama3"])
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
        for rope_type in ("dynamic", "longrope", "made-up"):
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


if __name__ == "__main__":
    unittest.main()
