"""LoRA fine-tuning as peft users know it, end to end.

A Llama checkpoint made by transformers is loaded by the real daemon, which
trains LoRA adapters on it (TrainRequest's lora_* fields) and saves them as
an adapter snapshot. peft reads that directory alone onto the base model
transformers loads from the same checkpoint: the loss on held-out tokens is
the daemon's, with the adapters merged too, and differs from the base's. A
merged snapshot loads into transformers alone with that loss and peft's
merged weights. A weights snapshot of the adapted model is refused (it would
drop the training),
a run asking for other adapters is refused, and a run without lora fields
trains the model's adapters on. An adapter peft made loads onto its base with
peft's loss and trains on; one peft computes and memprofd does not (DoRA) is
refused naming the key. A checkpoint of the adapters (their AdamW and
training state beside them) is a peft adapter directory too, and resumes
onto its base with the losses of the run that went straight on; onto another
base it is refused.

The real daemon (harness.Daemon), transformers, peft and safetensors from
the venv."""

import json
import os
import unittest

import grpc
import peft
import safetensors
import torch
import transformers

import harness
from harness import pb, wait_done

SEQ_LEN = 32
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False)


def tokens(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CONFIG["vocab_size"], (n,), generator=g)


def hf_loss(model, ids):
    with torch.no_grad():
        return model(input_ids=ids.unsqueeze(0), labels=ids.unsqueeze(0)).loss.item()


class LoraTest(harness.DaemonTestCase):
    SNAPSHOTS = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        torch.manual_seed(7)
        cls.source = os.path.join(cls.scratch, "base")
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(
            cls.source)
        cls.data = pb.DataSource(inline_tokens=pb.InlineTokens(ids=tokens(1, 2000).tolist()))
        cls.probe = tokens(2, SEQ_LEN + 1)

    def op(self, method, request):
        return wait_done(self.d, self.d.call(method, request).id)

    def train(self, **fields):
        return self.op("Train", pb.TrainRequest(
            steps=3, batch_size=2, seq_len=SEQ_LEN, learning_rate=1e-2, seed=3,
            data=self.data, **fields))

    def evaluate(self):
        op = self.op("Evaluate", pb.EvaluateRequest(
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=self.probe.tolist())),
            batch_size=1, seq_len=SEQ_LEN))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        return op.evaluate.loss

    def assert_frozen_base_is_bf16(self, info):
        """The breakdown's frozen_parameters are the base in bf16: two bytes
        a weight, half of float32's."""
        base = [p for p in info.parameters if ".lora_" not in p.name]
        weights = sum(int(torch.Size(p.shape).numel()) for p in base)
        self.assertEqual({p.dtype for p in base}, {"BFloat16"})
        breakdown = self.d.call("GetMemoryBreakdown", pb.GetMemoryBreakdownRequest(
            by="category"))
        frozen = {c.category: c.bytes for c in breakdown.categories}["frozen_parameters"]
        print("frozen_parameters %d B for %d base weights" % (frozen, weights))
        self.assertEqual(frozen, 2 * weights)

    def test_1_adapters_trained_by_the_daemon_load_into_peft_with_its_loss(self):
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        refused = self.op("Snapshot", pb.SnapshotRequest(name="nothing-to-merge",
                                                         kind=pb.SNAPSHOT_KIND_MERGED))
        self.assertEqual(refused.error.code, 9, refused.error.message)  # FAILED_PRECONDITION
        self.assertIn("no LoRA adapters to merge", refused.error.message)
        op = self.train(lora_r=4, lora_alpha=16, lora_targets="q_proj,v_proj,down_proj")
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        trained = self.evaluate()
        names = [p.name for p in self.d.call("DescribeModel", pb.DescribeModelRequest()).parameters]
        self.assertIn("model.layers.0.self_attn.q_proj.lora_A.weight", names)

        refused = self.op("Snapshot", pb.SnapshotRequest(name="lora-weights"))
        self.assertEqual(refused.state, pb.OPERATION_STATE_FAILED)
        self.assertIn("adapter snapshot", refused.error.message)

        op = self.op("Snapshot", pb.SnapshotRequest(name="lora",
                                                    kind=pb.SNAPSHOT_KIND_ADAPTER))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.assertEqual(op.snapshot.kind, pb.SNAPSHOT_KIND_ADAPTER)
        directory = op.snapshot.directory
        self.assertIn("adapter_model.safetensors", os.listdir(directory))
        with open(os.path.join(directory, "adapter_config.json")) as f:
            config = json.load(f)
        self.assertEqual((config["peft_type"], config["task_type"], config["r"],
                          config["lora_alpha"], config["base_model_name_or_path"]),
                         ("LORA", "CAUSAL_LM", 4, 16.0, self.source))
        self.assertEqual(sorted(config["target_modules"]), ["down_proj", "q_proj", "v_proj"])
        with safetensors.safe_open(os.path.join(directory, "adapter_model.safetensors"),
                                   "pt") as f:
            keys = sorted(f.keys())
        self.assertEqual(len(keys), 2 * 3 * CONFIG["num_hidden_layers"])
        self.assertIn("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", keys)

        base = transformers.AutoModelForCausalLM.from_pretrained(self.source).eval()
        base_loss = hf_loss(base, self.probe)
        adapted = peft.PeftModel.from_pretrained(base, directory).eval()
        print("base %.6f, daemon with adapters %.6f, peft %.6f"
              % (base_loss, trained, hf_loss(adapted, self.probe)))
        self.assertAlmostEqual(hf_loss(adapted, self.probe), trained, delta=1e-5 * trained)
        self.assertGreater(abs(base_loss - trained), 1e-4)
        merged = adapted.merge_and_unload()
        self.assertAlmostEqual(hf_loss(merged, self.probe), trained, delta=1e-5 * trained)

        # A merged snapshot is a plain Hugging Face directory transformers
        # loads alone, with the daemon's loss and peft's merged weights; the
        # async mode (host copies at the boundary) writes the same bytes.
        peft_merged = merged.state_dict()
        for mode in (pb.SNAPSHOT_MODE_BLOCKING, pb.SNAPSHOT_MODE_ASYNC):
            op = self.op("Snapshot", pb.SnapshotRequest(
                name="lora-merged-%d" % mode, kind=pb.SNAPSHOT_KIND_MERGED, mode=mode))
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
            self.assertEqual(op.snapshot.kind, pb.SNAPSHOT_KIND_MERGED)
            files = os.listdir(op.snapshot.directory)
            self.assertIn("config.json", files)
            self.assertNotIn("adapter_config.json", files)
            if mode == pb.SNAPSHOT_MODE_BLOCKING:  # one merged projection at a time
                self.assertEqual(op.snapshot.peak_gathered_bytes,
                                 4 * CONFIG["hidden_size"] * CONFIG["intermediate_size"])
            alone = transformers.AutoModelForCausalLM.from_pretrained(
                op.snapshot.directory).eval()
            self.assertAlmostEqual(hf_loss(alone, self.probe), trained,
                                   delta=1e-5 * trained)
            worst = max((alone.state_dict()[k] - v).abs().max().item()
                        for k, v in peft_merged.items())
            print("merged snapshot (mode %d): loss %.6f, max |w - peft's merge| %.1e"
                  % (mode, hf_loss(alone, self.probe), worst))
            self.assertLess(worst, 1e-6)

    def test_2_other_adapters_are_refused_and_a_plain_run_trains_the_models_on(self):
        before = self.evaluate()
        op = self.train(lora_r=8)
        self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
        self.assertEqual(op.error.code, 9, op.error.message)  # FAILED_PRECONDITION
        self.assertIn("has LoRA adapters (r 4", op.error.message)
        self.assertEqual(self.evaluate(), before)
        op = self.train()
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.assertNotEqual(self.evaluate(), before)

    def test_3_an_adapter_made_by_peft_loads_onto_its_base_and_trains_on(self):
        # peft's adapter with a B away from zero (init_lora_weights=False
        # draws both as nn.Linear does), so that it changes the loss.
        torch.manual_seed(13)
        base = transformers.AutoModelForCausalLM.from_pretrained(self.source)
        config = peft.LoraConfig(r=2, lora_alpha=6, target_modules=["k_proj", "up_proj"],
                                 lora_dropout=0.1, init_lora_weights=False,
                                 task_type="CAUSAL_LM")
        made = peft.get_peft_model(base, config).eval()
        directory = os.path.join(self.scratch, "peft-made")
        made.save_pretrained(directory)
        peft_loss = hf_loss(made, self.probe)

        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source,
                                                      lora_adapter=directory))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        notes = "\n".join(op.model.load_notes)
        self.assertIn("LoRA adapters from", notes)
        self.assertIn("train with lora_dropout 0.1", notes)
        self.assertAlmostEqual(self.evaluate(), peft_loss, delta=1e-5 * peft_loss)
        # A Train without lora fields trains peft's adapters.
        op = self.train()
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.assertNotAlmostEqual(self.evaluate(), peft_loss, delta=1e-4)

        # What memprofd cannot compute is refused naming the key; the model
        # stays as it was.
        with open(os.path.join(directory, "adapter_config.json")) as f:
            dora = json.load(f)
        dora["use_dora"] = True
        bad = os.path.join(self.scratch, "peft-dora")
        os.mkdir(bad)
        for name in os.listdir(directory):
            if name.endswith(".safetensors"):
                os.link(os.path.join(directory, name), os.path.join(bad, name))
        with open(os.path.join(bad, "adapter_config.json"), "w") as f:
            json.dump(dora, f)
        before = self.evaluate()
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source,
                                                      lora_adapter=bad))
        self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
        self.assertIn("use_dora", op.error.message)
        self.assertEqual(self.evaluate(), before)

    def train_losses(self, **fields):
        """Trains as train() does: {global step: loss} from the step stream."""
        request = dict(steps=3, batch_size=2, seq_len=SEQ_LEN, learning_rate=1e-2, seed=3,
                       data=self.data)
        if fields.get("resume"):
            request = dict(steps=fields.pop("steps"))
        request.update(fields)
        op = self.d.call("Train", pb.TrainRequest(**request))
        losses = {r.global_step: r.loss for r in self.d.stub.StreamStepReports(
            pb.StreamStepReportsRequest(operation_id=op.id), timeout=300,
            metadata=self.d.metadata())}
        done = wait_done(self.d, op.id)
        self.assertEqual(done.state, pb.OPERATION_STATE_SUCCEEDED, done.error.message)
        return losses

    def test_4_a_checkpoint_of_adapters_resumes_onto_its_base_bit_for_bit(self):
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.train_losses(lora_r=4, lora_alpha=8, lora_targets="all-linear", steps=2)
        op = self.op("Snapshot", pb.SnapshotRequest(name="lora-ck",
                                                    kind=pb.SNAPSHOT_KIND_CHECKPOINT))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.assertEqual(op.snapshot.kind, pb.SNAPSHOT_KIND_CHECKPOINT)
        checkpoint = op.snapshot.directory
        at_checkpoint = self.evaluate()
        straight_on = self.train_losses(resume=True, steps=2)
        self.assertEqual(sorted(straight_on), [3, 4])

        # The checkpoint is a peft adapter directory too.
        base = transformers.AutoModelForCausalLM.from_pretrained(self.source).eval()
        adapted = peft.PeftModel.from_pretrained(base, checkpoint).eval()
        self.assertAlmostEqual(hf_loss(adapted, self.probe), at_checkpoint,
                               delta=1e-5 * at_checkpoint)

        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source,
                                                      lora_adapter=checkpoint, resume=True))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.assertEqual(op.model.steps_trained, 2)
        self.assertEqual(self.evaluate(), at_checkpoint)
        resumed = self.train_losses(resume=True, steps=2)
        print("adapter checkpoint at step 2: steps 3-4 straight on %r, resumed %r"
              % (straight_on, resumed))
        self.assertEqual(resumed, straight_on)

        # The checkpoint alone has no base; another base is refused.
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=checkpoint, resume=True))
        self.assertEqual(op.error.code, 9, op.error.message)  # FAILED_PRECONDITION
        self.assertIn("without their base", op.error.message)
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source, init_weights=True,
                                                      lora_adapter=checkpoint, resume=True))
        self.assertEqual(op.error.code, 9, op.error.message)
        self.assertIn("trained on another base", op.error.message)
        # So is an adapter snapshot the daemon saved, onto another base than
        # its own (peft's own directories carry no fingerprint to check).
        adapter = os.path.join(self.root, "lora")
        before = self.evaluate()
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source, init_weights=True,
                                                      lora_adapter=adapter))
        self.assertEqual(op.error.code, 9, op.error.message)
        self.assertIn("trained on another base", op.error.message)
        self.assertEqual(self.evaluate(), before)  # the model stays as it was
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source,
                                                      lora_adapter=adapter))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)

    def test_5_a_bf16_base_trains_under_autocast_with_peft_on_its_rounded_base(self):
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        with self.assertRaises(grpc.RpcError) as refused:  # no autocast
            self.train(lora_r=4, base_dtype="bf16")
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("needs mixed_precision bf16", refused.exception.details())
        op = self.train(lora_r=4, lora_alpha=16, lora_targets="all-linear",
                        mixed_precision="bf16", base_dtype="bf16")
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        info = self.d.call("DescribeModel", pb.DescribeModelRequest())
        dtypes = {p.name: p.dtype for p in info.parameters}
        self.assertEqual(dtypes["model.layers.0.mlp.up_proj.weight"], "BFloat16")
        self.assertEqual(dtypes["model.embed_tokens.weight"], "BFloat16")
        self.assertEqual(dtypes["model.layers.0.mlp.up_proj.lora_A.weight"], "Float")
        self.assert_frozen_base_is_bf16(info)
        # Its rounding cannot be undone; evaluation needs the autocast.
        refused = self.train(mixed_precision="bf16")
        self.assertEqual(refused.error.code, 9, refused.error.message)  # FAILED_PRECONDITION
        self.assertIn("cannot be undone", refused.error.message)
        refused = self.op("Evaluate", pb.EvaluateRequest(
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=self.probe.tolist())),
            batch_size=1, seq_len=SEQ_LEN))
        self.assertEqual(refused.error.code, 9, refused.error.message)
        op = self.op("Evaluate", pb.EvaluateRequest(
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=self.probe.tolist())),
            batch_size=1, seq_len=SEQ_LEN, mixed_precision="bf16"))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        trained = op.evaluate.loss
        type(self).bf16_base_loss = trained

        op = self.op("Snapshot", pb.SnapshotRequest(name="lora-bf16",
                                                    kind=pb.SNAPSHOT_KIND_ADAPTER))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        # peft on the base rounded to bf16 (float32 tensors), under the same
        # autocast: the daemon's loss.
        base = transformers.AutoModelForCausalLM.from_pretrained(self.source).eval()
        with torch.no_grad():
            for p in base.parameters():
                p.copy_(p.to(torch.bfloat16))
        adapted = peft.PeftModel.from_pretrained(base, op.snapshot.directory).eval()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            peft_loss = hf_loss(adapted, self.probe)
        # peft on the base transformers loads in bf16 (its residual stream and
        # norms in bf16 too): within 1e-3 of the daemon's, relative.
        base16 = transformers.AutoModelForCausalLM.from_pretrained(
            self.source, dtype=torch.bfloat16).eval()
        adapted16 = peft.PeftModel.from_pretrained(base16, op.snapshot.directory).eval()
        peft16_loss = hf_loss(adapted16, self.probe)
        print("bf16 base: daemon %.6f, peft on the rounded base under autocast %.6f, "
              "peft on the base loaded in bf16 %.6f" % (trained, peft_loss, peft16_loss))
        self.assertAlmostEqual(peft_loss, trained, delta=1e-5 * trained)
        self.assertAlmostEqual(peft16_loss, trained, delta=1e-3 * trained)

    def test_6_a_base_loaded_in_bf16_trains_as_the_one_cast_at_the_runs_start(self):
        with self.assertRaises(grpc.RpcError) as refused:
            self.d.call("LoadModel", pb.LoadModelRequest(
                hf_directory=self.source, base_dtype="bf16",
                placement=[pb.ModulePlacement(module="model.norm",
                                              placement=pb.PLACEMENT_DISK)]))
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("base_dtype is bf16", refused.exception.details())
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source,
                                                      base_dtype="bf16"))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        info = self.d.call("DescribeModel", pb.DescribeModelRequest())
        self.assertEqual({p.dtype for p in info.parameters}, {"BFloat16"})
        self.assertEqual(info.parameter_bytes, op.model.parameter_bytes)
        refused = self.train(mixed_precision="bf16", base_dtype="bf16")  # no adapters
        self.assertEqual(refused.error.code, 9, refused.error.message)  # FAILED_PRECONDITION
        self.assertIn("trains LoRA adapters only", refused.error.message)
        op = self.train(lora_r=4, lora_alpha=16, lora_targets="all-linear",
                        mixed_precision="bf16", base_dtype="bf16")
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.assert_frozen_base_is_bf16(
            self.d.call("DescribeModel", pb.DescribeModelRequest()))
        op = self.op("Evaluate", pb.EvaluateRequest(
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=self.probe.tolist())),
            batch_size=1, seq_len=SEQ_LEN, mixed_precision="bf16"))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        print("bf16 base loaded so: %.6f; cast at the run's start: %.6f"
              % (op.evaluate.loss, self.bf16_base_loss))
        self.assertEqual(op.evaluate.loss, self.bf16_base_loss)

    def test_7_a_bf16_base_resumes_from_its_checkpoint_bit_for_bit(self):
        # Trained on a base cast at the run's start; resumed onto the base
        # loaded in bf16: the same bits, so the same fingerprint and losses.
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=self.source))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        self.train_losses(lora_r=4, lora_targets="all-linear", mixed_precision="bf16",
                          base_dtype="bf16", steps=2)
        op = self.op("Snapshot", pb.SnapshotRequest(name="lora-bf16-ck",
                                                    kind=pb.SNAPSHOT_KIND_CHECKPOINT))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        checkpoint = op.snapshot.directory
        straight_on = self.train_losses(resume=True, steps=2)
        # Without base_dtype the resume loads the base in the run's: bf16.
        op = self.op("LoadModel", pb.LoadModelRequest(
            hf_directory=self.source, lora_adapter=checkpoint, resume=True))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        info = self.d.call("DescribeModel", pb.DescribeModelRequest())
        self.assertEqual(dict((p.name, p.dtype) for p in info.parameters)[
            "model.embed_tokens.weight"], "BFloat16")
        resumed = self.train_losses(resume=True, steps=2)
        print("bf16 base, checkpoint at step 2: straight on %r, resumed in bf16 %r"
              % (straight_on, resumed))
        self.assertEqual(sorted(resumed), [3, 4])
        self.assertEqual(resumed, straight_on)
        # Loaded in float32 when asked: the resumed run casts it, to the
        # same bits.
        op = self.op("LoadModel", pb.LoadModelRequest(
            hf_directory=self.source, lora_adapter=checkpoint, resume=True,
            base_dtype="float32"))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        info = self.d.call("DescribeModel", pb.DescribeModelRequest())
        self.assertEqual(dict((p.name, p.dtype) for p in info.parameters)[
            "model.embed_tokens.weight"], "Float")
        self.assertEqual(self.train_losses(resume=True, steps=2), straight_on)


if __name__ == "__main__":
    unittest.main()
