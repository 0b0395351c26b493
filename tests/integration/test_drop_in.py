"""Snapshots are drop-in Hugging Face directories, and the checkpoints users
bring load as transformers loads them.

A chat model as transformers saves it in bfloat16, with token ids (an eos
list, as Llama 3.1 has), keys the daemon does not model (initializer_range),
a generation config and a real fast tokenizer with a chat template, is
loaded by the daemon, trained in float32 and snapshotted. transformers,
AutoTokenizer and GenerationConfig then read the snapshot alone: the config
names the dtype its tensors are in, every key of the source comes back, the
tokenizer encodes as the source's does. Older checkpoints that hold the
rotary_emb.inv_freq buffers load with transformers' loss, and a tied head is
listed once.

The real daemon (harness.Daemon), transformers, tokenizers and safetensors
from the venv."""

import json
import os
import unittest

import safetensors.torch
import tokenizers
import torch
import transformers

import harness
from harness import pb, wait_done

SEQ_LEN = 32
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=True,
              initializer_range=0.041, bos_token_id=0, eos_token_id=[1, 8, 9])
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>"
                 "{% endfor %}")
TEXT = "hello memprofd, where does every byte go?"


def make_tokenizer():
    """A byte-level BPE tokenizer of 256 ids trained here (no download), as
    transformers' fast tokenizer files."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=256, special_tokens=["<s>", "</s>", "<pad>"], show_progress=False)
    tok.train_from_iterator([TEXT, "where every byte goes", "memory is a promise"] * 20,
                            trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def hf_loss(model, ids):
    with torch.no_grad():
        return model(input_ids=ids.unsqueeze(0), labels=ids.unsqueeze(0)).loss.item()


def tokens(seed, n=SEQ_LEN + 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CONFIG["vocab_size"], (n,), generator=g)


def safetensors_dtypes(directory):
    dtypes = set()
    for name in os.listdir(directory):
        if name.endswith(".safetensors") and name.startswith("model"):
            with safetensors.safe_open(os.path.join(directory, name), "pt") as f:
                dtypes |= {f.get_slice(k).get_dtype() for k in f.keys()}
    return dtypes


class DropInSnapshotTest(harness.DaemonTestCase):
    SNAPSHOTS = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        torch.manual_seed(11)
        cls.source = os.path.join(cls.scratch, "chat-bf16")
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
        model.to(torch.bfloat16).save_pretrained(cls.source)
        cls.generation = transformers.GenerationConfig(
            bos_token_id=0, eos_token_id=[1, 8, 9], do_sample=True, temperature=0.6, top_p=0.9,
            max_new_tokens=7)
        cls.generation.save_pretrained(cls.source)
        cls.tokenizer = make_tokenizer()
        cls.tokenizer.save_pretrained(cls.source)
        with open(os.path.join(cls.source, "config.json")) as f:
            cls.source_config = json.load(f)

    def load(self, directory):
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=directory)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        return self.d.call("DescribeModel", pb.DescribeModelRequest())

    def snapshot(self, name, **fields):
        op = wait_done(self.d, self.d.call("Snapshot", pb.SnapshotRequest(name=name, **fields)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        return op.snapshot.directory

    def evaluate(self, ids):
        op = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=ids.tolist())),
            batch_size=1, seq_len=len(ids) - 1)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        return op.evaluate.loss

    def test_1_snapshot_of_a_bf16_chat_model_is_a_drop_in_directory(self):
        info = self.load(self.source)
        notes = "\n".join(info.load_notes)
        print("load notes:", notes)
        for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            self.assertIn(name, notes)
        ids = tokens(1).tolist() * 4
        op = wait_done(self.d, self.d.call("Train", pb.TrainRequest(
            steps=2, batch_size=2, seq_len=SEQ_LEN, seed=1,
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=ids)))).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        probe = tokens(2)
        trained_loss = self.evaluate(probe)

        for kind, fields in (("keep", {}), ("checkpoint", dict(kind=pb.SNAPSHOT_KIND_CHECKPOINT)),
                             ("bf16", dict(dtype=pb.SNAPSHOT_DTYPE_BF16))):
            with self.subTest(kind):
                snap = self.snapshot("drop-in-" + kind, **fields)
                with open(os.path.join(snap, "config.json")) as f:
                    written = json.load(f)
                want = "bfloat16" if kind == "bf16" else "float32"
                # The label is the tensors' dtype, so from_pretrained's default
                # does not round float32 weights to the source's bfloat16.
                self.assertEqual(written["torch_dtype"], want, written)
                self.assertEqual(safetensors_dtypes(snap), {"BF16" if kind == "bf16" else "F32"})
                # Every key of the source config comes back (the dtype aside).
                for key, value in self.source_config.items():
                    if key in ("dtype", "torch_dtype"):
                        continue
                    self.assertEqual(written.get(key), value, "%s: %s" % (kind, key))
                back = transformers.AutoModelForCausalLM.from_pretrained(snap)
                self.assertEqual(back.dtype, torch.bfloat16 if kind == "bf16" else torch.float32)
                self.assertEqual((back.config.bos_token_id, back.config.eos_token_id), (0, [1, 8, 9]))
                self.assertEqual(back.config.initializer_range, 0.041)
                if kind != "bf16":
                    self.assertAlmostEqual(hf_loss(back.eval(), probe), trained_loss,
                                           delta=1e-5 * abs(trained_loss))
                # Generation settings and the tokenizer, from the snapshot alone.
                generation = transformers.GenerationConfig.from_pretrained(snap)
                self.assertEqual(generation.to_diff_dict(), self.generation.to_diff_dict())
                tokenizer = transformers.AutoTokenizer.from_pretrained(snap)
                self.assertEqual(tokenizer(TEXT)["input_ids"], self.tokenizer(TEXT)["input_ids"])
                self.assertEqual(tokenizer.eos_token, "</s>")
                chat = [{"role": "user", "content": TEXT}]
                self.assertEqual(tokenizer.apply_chat_template(chat, tokenize=False),
                                 self.tokenizer.apply_chat_template(chat, tokenize=False))
                manifest = self.d.call("ListSnapshots", pb.ListSnapshotsRequest())
                self.assertTrue(any(s.name == "drop-in-" + kind for s in manifest.snapshots))
                with open(os.path.join(snap, "memprofd_manifest.json")) as f:
                    carried = json.load(f)["carried_files"]
                self.assertIn("tokenizer.json", carried)
                self.assertIn("generation_config.json", carried)

        # The snapshot itself loads back with its tokenizer carried on.
        again = self.load(os.path.join(self.root, "drop-in-keep"))
        self.assertIn("tokenizer.json", "\n".join(again.load_notes))
        self.assertAlmostEqual(self.evaluate(probe), trained_loss, delta=1e-6 * abs(trained_loss))

    def test_2_a_preset_snapshot_says_it_carries_nothing(self):
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(preset="tiny")).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        snap = self.snapshot("drop-in-preset")
        with open(os.path.join(snap, "memprofd_manifest.json")) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["carried_files"], [])
        self.assertIn("preset", manifest["carried_note"])
        self.assertFalse(os.path.exists(os.path.join(snap, "tokenizer.json")))

    def test_3_inv_freq_buffers_of_older_checkpoints_are_ignored_as_transformers_does(self):
        torch.manual_seed(5)
        config = transformers.LlamaConfig(**dict(CONFIG, tie_word_embeddings=False))
        model = transformers.LlamaForCausalLM(config).eval()
        directory = os.path.join(self.scratch, "with-inv-freq")
        model.save_pretrained(directory)
        path = os.path.join(directory, "model.safetensors")
        state = safetensors.torch.load_file(path)
        inv_freq = model.model.rotary_emb.inv_freq.clone()
        for i in range(config.num_hidden_layers):
            state["model.layers.%d.self_attn.rotary_emb.inv_freq" % i] = inv_freq.clone()
        safetensors.torch.save_file(state, path, metadata={"format": "pt"})
        # transformers itself loads it, ignoring the keys.
        reloaded, loading = transformers.AutoModelForCausalLM.from_pretrained(
            directory, output_loading_info=True)
        self.assertEqual(list(loading["unexpected_keys"]), [])

        info = self.load(directory)
        self.assertTrue(any("ignored 2 rotary_emb.inv_freq" in n for n in info.load_notes),
                        list(info.load_notes))
        probe = tokens(3)
        self.assertAlmostEqual(self.evaluate(probe), hf_loss(reloaded.eval(), probe), delta=1e-5)

        # Another unknown key is still refused, naming the cause.
        state["model.layers.7.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"].clone()
        safetensors.torch.save_file(state, path, metadata={"format": "pt"})
        op = wait_done(self.d, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=directory)).id)
        self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
        self.assertEqual(op.error.code, 3, op.error.message)  # INVALID_ARGUMENT
        self.assertIn("num_hidden_layers is 2", op.error.message)

    def test_4_a_tied_head_is_listed_once(self):
        info = self.load(self.source)
        names = [p.name for p in info.parameters]
        self.assertNotIn("lm_head.weight", names)
        embedding = next(p for p in info.parameters if p.name == "model.embed_tokens.weight")
        self.assertEqual(list(embedding.tied), ["lm_head.weight"])
        numel = sum(int(torch.tensor(list(p.shape)).prod()) for p in info.parameters)
        self.assertEqual(numel, info.num_parameters)
        self.assertEqual(sum(p.bytes for p in info.parameters), info.parameter_bytes)


if __name__ == "__main__":
    unittest.main(verbosity=2)
