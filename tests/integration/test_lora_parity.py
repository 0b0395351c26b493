"""Three LoRA training steps in the daemon equal transformers + peft +
torch.optim.AdamW on the same tokens, for every family that loads.

peft makes the adapter (init_lora_weights=False draws A and B as nn.Linear
does, so B is not zero and every step's gradients reach both), saves it, and
the daemon loads it onto the same base (LoadModel's lora_adapter) and trains
it with a Train that names no lora fields. The reference loads the same
directory with peft.PeftModel.from_pretrained(is_trainable=True) and trains
its adapters as test_optimizer_parity's reference trains a whole model: the
daemon's batches, its loss, AdamW decaying the >= 2-D parameters (every
adapter), clip_grad_norm_ over what trains, transformers' scheduler. The
daemon's adapter snapshot is then compared with peft's trained adapters.

Tolerances: the step losses and gradient norms within 1e-6 relative (the
issue asks 1e-5); the adapters as test_optimizer_parity's weights (the same
float32 rounding of nearly cancelled gradients that AdamW's g / sqrt(v)
turns into part of an update).

The real daemon (harness.Daemon), transformers, peft and safetensors from the
venv; no mocks.
"""

import os
import unittest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import peft  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import harness  # noqa: E402
from harness import pb, wait_done  # noqa: E402
from test_optimizer_parity import (BATCH, CASES, HYPER, SEED, SEQ_LEN,  # noqa: E402
                                   TOKENS, check_steps, check_weights, make,
                                   train_as_the_daemon)

STEPS, WARMUP = 3, 1
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name in test_optimizer_parity.CASES -> LoraConfig settings beyond TARGETS.
LORA = {
    "llama-tied": dict(r=4, lora_alpha=8),
    "llama-biases": dict(r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "up_proj"]),
    "mistral": dict(r=4, lora_alpha=16),
    "qwen2": dict(r=8, lora_alpha=8),
    "qwen3": dict(r=4, lora_alpha=8, use_rslora=True),
}


def peft_names(model):
    """peft's trainable parameters under the names its saved adapter uses."""
    return {name.replace(".default", ""): p
            for name, p in model.named_parameters() if p.requires_grad}


class LoraParityTest(harness.DaemonTestCase):
    SNAPSHOTS = True

    def op(self, method, request):
        return wait_done(self.d, self.d.call(method, request).id)

    def daemon(self, base, adapter, snapshot):
        """Loads `base` with `adapter` and trains it: (step reports, the
        adapter snapshot's tensors)."""
        op = self.op("LoadModel", pb.LoadModelRequest(hf_directory=base, lora_adapter=adapter))
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        op = self.d.call("Train", pb.TrainRequest(
            steps=STEPS, batch_size=BATCH, seq_len=SEQ_LEN, seed=SEED, warmup_steps=WARMUP,
            grad_accumulation_steps=1, mixed_precision="no",
            data=pb.DataSource(inline_tokens=pb.InlineTokens(ids=TOKENS.tolist())), **HYPER))
        reports = list(self.d.stub.StreamStepReports(
            pb.StreamStepReportsRequest(operation_id=op.id), timeout=300,
            metadata=self.d.metadata()))
        op = wait_done(self.d, op.id)
        self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)
        snap = self.op("Snapshot", pb.SnapshotRequest(name=snapshot,
                                                      kind=pb.SNAPSHOT_KIND_ADAPTER))
        self.assertEqual(snap.state, pb.OPERATION_STATE_SUCCEEDED, snap.error.message)
        return reports, safetensors.torch.load_file(
            os.path.join(snap.snapshot.directory, "adapter_model.safetensors"))

    def check(self, name, settings):
        base = os.path.join(self.scratch, name)
        cls = make(base, CASES[name])
        torch.manual_seed(17)
        config = peft.LoraConfig(**dict(dict(target_modules=TARGETS, lora_dropout=0.0,
                                             init_lora_weights=False,
                                             task_type="CAUSAL_LM"), **settings))
        made = peft.get_peft_model(cls.from_pretrained(base), config)
        adapter = os.path.join(self.scratch, name + "-adapter")
        made.save_pretrained(adapter)

        model = peft.PeftModel.from_pretrained(cls.from_pretrained(base), adapter,
                                               is_trainable=True).train()
        trained = peft_names(model)
        initial = {k: v.detach().clone() for k, v in trained.items()}
        expected = train_as_the_daemon(model, list(trained.values()), STEPS, WARMUP)
        reports, weights = self.daemon(base, adapter, name + "-trained")

        check_steps(self, name, reports, expected, STEPS)
        check_weights(self, name, weights, trained, initial, STEPS)

    def test_three_steps_equal_peft_on_each_family(self):
        for name, settings in LORA.items():
            with self.subTest(name):
                self.check(name, settings)


if __name__ == "__main__":
    unittest.main()
