"""Learning-rate schedules, evaluation and bf16 mixed precision over the wire,
each against its independent reference: transformers' get_scheduler for the
rates, transformers' LlamaForCausalLM on the daemon's own snapshot for the
evaluation loss (float32, and under torch.autocast for bf16), and a
transformers + torch.optim.AdamW training loop under the same autocast for
bf16 training.

Tolerances. float32: the same equations in another order agree to a few
float32 ulps of the loss (~1e-7 at a loss of ~2), so 1e-5 (relative). bf16:
both sides run the same ATen kernels under the same autocast policy
(matmuls, linear layers and SDPA in bfloat16, the rest in float32), so they
differ only where a float32 op in another order (RMSNorm, rotary, residual
sums) lands a value on the other side of a bf16 rounding boundary; averaged
over thousands of tokens the loss moves by ~6e-8 (relative; measured:
5.4e-8 and 6.5e-8 for the evaluation loss, and equal to 7 digits for four
training steps). BF16_TOLERANCE is 1e-5, ~150 times that. It is below what
bf16 itself does to the training losses here (3e-5 to 3e-4 against float32),
and the training test checks that float32 losses would fail it, so the test
tells bf16 from float32; for the evaluation loss the bf16/float32 gap is
smaller (1e-6 to 1e-5), so there it only checks that they differ.
"""

import json
import math
import os
import tempfile
import unittest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import grpc  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.optimization import get_scheduler  # noqa: E402

import harness  # noqa: E402
from harness import Daemon, metric, pb, wait_done  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 1e-5
SEQ = 32


def succeeded(test, op):
    final = wait_done(test.d, op.id)
    test.assertEqual(final.state, pb.OPERATION_STATE_SUCCEEDED, final.error.message)
    return final


def train(test, **fields):
    """Train(**fields) to success; returns its step reports."""
    op = test.d.call("Train", pb.TrainRequest(**fields))
    reports = list(test.d.stub.StreamStepReports(pb.StreamStepReportsRequest(operation_id=op.id),
                                                 timeout=300, metadata=test.d.metadata()))
    succeeded(test, op)
    return reports


def evaluate(test, **fields):
    """Evaluate(**fields) to success; returns the EvaluateResult."""
    op = test.d.call("Evaluate", pb.EvaluateRequest(**fields))
    test.assertEqual(op.kind, pb.OPERATION_KIND_EVALUATE)
    return succeeded(test, op).evaluate


def inline(ids):
    return pb.DataSource(inline_tokens=pb.InlineTokens(ids=ids))


def random_tokens(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def invalid(test, method, request, *needles):
    with test.assertRaises(grpc.RpcError) as e:
        test.d.call(method, request)
    test.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
    for needle in needles:
        test.assertIn(needle, e.exception.details())


def hf_model(directory, attn_implementation="sdpa"):
    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation=attn_implementation)
    return model.float()


def hf_eval_loss(model, tokens, seq_len, windows, bf16=False):
    """Mean cross-entropy over consecutive windows (window i from token
    i * seq_len), the logits upcast to float32 as transformers' loss does."""
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for i in range(windows):
            w = torch.tensor([tokens[i * seq_len:i * seq_len + seq_len + 1]])
            logits = model(w[:, :-1]).logits.float()
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), w[0, 1:], reduction="sum").item()
            count += seq_len
    return total / count


class SchedulesTest(harness.DaemonTestCase):
    # (name, warmup, transformers' scheduler_specific_kwargs, memprofd's fields)
    CASES = [("constant", 0, {}, {}),
             ("constant_with_warmup", 3, {}, {}),
             ("linear", 2, {}, {}),
             ("cosine", 2, {}, {}),
             ("cosine_with_min_lr", 2, {"min_lr_rate": 0.1}, {"min_lr_ratio": 0.1})]

    def test_step_reports_carry_the_rates_of_transformers_get_scheduler(self):
        steps, peak = 7, 2e-3
        for name, warmup, kwargs, fields in self.CASES:
            reports = train(self, steps=steps, batch_size=1, seq_len=16, learning_rate=peak,
                            lr_scheduler_type=name, warmup_steps=warmup, **fields)
            ours = [r.learning_rate for r in reports]
            p = torch.nn.Parameter(torch.zeros(1))
            opt = torch.optim.SGD([p], lr=peak)
            sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=steps,
                                  scheduler_specific_kwargs=kwargs)
            theirs = []
            for _ in range(steps):
                theirs.append(sched.get_last_lr()[0])
                opt.step()
                sched.step()
            # The same formulas in the same order of operations: equal doubles.
            self.assertEqual(ours, theirs, name)
        self.assertAlmostEqual(metric(self.d.metrics_text(), "memprofd_train_learning_rate"),
                               ours[-1], delta=1e-12 * peak)

    def test_bad_schedules_and_precisions_are_invalid_argument(self):
        base = dict(steps=4, batch_size=1, seq_len=16)
        invalid(self, "Train", pb.TrainRequest(lr_scheduler_type="cosine_with_restarts", **base),
                "lr_scheduler_type", "constant, constant_with_warmup, linear, cosine, cosine_with_min_lr")
        invalid(self, "Train", pb.TrainRequest(lr_scheduler_type="linear", warmup_steps=5, **base),
                "warmup_steps must be in [0, steps] = [0, 4]")
        invalid(self, "Train", pb.TrainRequest(warmup_steps=1, **base), "constant_with_warmup")
        invalid(self, "Train", pb.TrainRequest(lr_scheduler_type="linear", min_lr_ratio=0.1, **base),
                "cosine_with_min_lr only")
        invalid(self, "Train", pb.TrainRequest(mixed_precision="fp16", **base), "bf16")
        invalid(self, "Train", pb.TrainRequest(eval_every_steps=2, **base), "eval_data")
        invalid(self, "Train", pb.TrainRequest(eval_every_steps=2, eval_data=inline([1] * 10), **base),
                "eval_data:", "fewer than seq_len + 1")


class EvaluateTest(harness.DaemonTestCase):
    SNAPSHOTS = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Trained a little, so that the weights matter to the loss.
        op = cls.d.call("Train", pb.TrainRequest(steps=10, batch_size=4, seq_len=SEQ,
                                                 learning_rate=1e-2))
        wait_done(cls.d, op.id)

    def test_1_loss_equals_transformers_on_the_snapshot_in_float32_and_bf16(self):
        tokens = random_tokens(3 * 4 * SEQ + 5, 0)
        windows = 3 * 4
        ours = {(attn, mp): evaluate(self, data=inline(tokens), batch_size=4, seq_len=SEQ,
                                     attn_implementation=attn, mixed_precision=mp)
                for attn in ("sdpa", "eager") for mp in ("no", "bf16")}
        for r in ours.values():
            self.assertEqual(r.tokens, windows * SEQ)
            self.assertEqual(r.batches, 3)
            self.assertAlmostEqual(r.perplexity, math.exp(r.loss), places=9)
        directory = succeeded(self, self.d.call("Snapshot", pb.SnapshotRequest(name="eval"))).snapshot.directory
        for attn in ("sdpa", "eager"):
            model = hf_model(directory, attn)
            fp32 = hf_eval_loss(model, tokens, SEQ, windows)
            bf16 = hf_eval_loss(model, tokens, SEQ, windows, bf16=True)
            print("evaluate %s: memprofd fp32 %.7f, transformers %.7f; memprofd bf16 %.7f, "
                  "transformers autocast %.7f (rel. diff %.2e; bf16 vs fp32 %.2e)"
                  % (attn, ours[attn, "no"].loss, fp32, ours[attn, "bf16"].loss, bf16,
                     abs(ours[attn, "bf16"].loss - bf16) / bf16, abs(bf16 - fp32) / fp32))
            self.assertLess(abs(ours[attn, "no"].loss - fp32), FP32_TOLERANCE * fp32, attn)
            self.assertLess(abs(ours[attn, "bf16"].loss - bf16), BF16_TOLERANCE * bf16, attn)
            self.assertNotEqual(ours[attn, "bf16"].loss, ours[attn, "no"].loss, attn)

    def test_2_bad_input_is_invalid_argument(self):
        tokens = inline(random_tokens(200, 1))
        invalid(self, "Evaluate", pb.EvaluateRequest(data=tokens, seq_len=0), "seq_len")
        invalid(self, "Evaluate", pb.EvaluateRequest(data=tokens, seq_len=100000),
                "max_position_embeddings")
        invalid(self, "Evaluate", pb.EvaluateRequest(data=tokens, batch_size=0), "batch_size")
        invalid(self, "Evaluate", pb.EvaluateRequest(data=tokens, max_batches=-1), "max_batches")
        invalid(self, "Evaluate", pb.EvaluateRequest(data=tokens, mixed_precision="fp16"), "bf16")
        invalid(self, "Evaluate", pb.EvaluateRequest(data=tokens, attn_implementation="flash"), "sdpa")
        invalid(self, "Evaluate", pb.EvaluateRequest(data=inline([1] * 20), seq_len=SEQ),
                "fewer than seq_len + 1")
        invalid(self, "Evaluate", pb.EvaluateRequest(data=inline([1, 300] * 40), seq_len=SEQ),
                "token id 300")
        # A file is read in the operation (off gRPC's threads): its errors fail it.
        missing = os.path.join(tempfile.gettempdir(), "memprofd-no-such-file")
        for path, code, needle in ((missing, 3, "does not exist"),
                                   ("/no/such/file", 7, "outside the daemon's data roots")):
            op = wait_done(self.d, self.d.call("Evaluate", pb.EvaluateRequest(
                data=pb.DataSource(text_file=path))).id)
            self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
            self.assertEqual(op.error.code, code, op.error.message)  # INVALID_ARGUMENT, PERMISSION_DENIED
            self.assertIn(path, op.error.message)
            self.assertIn(needle, op.error.message)

    def test_3_training_evaluates_every_n_steps_into_reports_and_metrics(self):
        held_out = inline(random_tokens(2000, 2))
        reports = train(self, steps=4, batch_size=2, seq_len=SEQ, eval_every_steps=2,
                        eval_data=held_out, eval_max_batches=2)
        self.assertEqual([r.step for r in reports if r.HasField("eval")], [2, 4])
        last = reports[-1].eval
        self.assertEqual(last.tokens, 2 * 2 * SEQ)
        self.assertEqual(last.global_step, reports[-1].global_step)
        # The model is as step 4 left it: the same evaluation gives the same loss.
        now = evaluate(self, data=held_out, batch_size=2, seq_len=SEQ, max_batches=2)
        self.assertEqual(now.loss, last.loss)
        metrics = self.d.metrics_text()
        self.assertAlmostEqual(metric(metrics, "memprofd_eval_last_loss"), now.loss, places=6)
        self.assertAlmostEqual(metric(metrics, "memprofd_eval_last_perplexity"),
                               now.perplexity, places=4)
        self.assertGreaterEqual(metric(metrics, "memprofd_eval_evaluations_total"), 3)

    def test_4_memprofctl_evaluate_and_the_new_train_flags(self):
        r = self.d.ctl("evaluate", "--batch_size=2", "--seq_len=32", "--max_batches=1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("perplexity", r.stdout)
        self.assertIn("over 64 tokens (1 batches)", r.stdout)
        r = self.d.ctl("evaluate", "--mixed_precision=fp16")
        self.assertEqual(r.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", r.stderr)
        r = self.d.ctl("train", "--steps=2", "--batch_size=1", "--seq_len=16", "--lr=1e-3",
                       "--lr_scheduler_type=linear", "--warmup_steps=1", "--mixed_precision=bf16",
                       "--eval_every_steps=1", "--eval_data=embedded", "--eval_max_batches=1",
                       "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        steps = [json.loads(line) for line in r.stdout.splitlines()]
        self.assertEqual([s["learning_rate"] for s in steps], [0.0, 1e-3])
        self.assertEqual([s["eval"]["tokens"] for s in steps], ["16", "16"])


class NoModelTest(unittest.TestCase):
    def test_evaluate_without_a_model_is_failed_precondition(self):
        d = Daemon("--model=")
        try:
            with self.assertRaises(grpc.RpcError) as e:
                d.call("Evaluate", pb.EvaluateRequest())
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("LoadModel", e.exception.details())
        finally:
            d.close()


class Bf16TrainingTest(harness.DaemonTestCase):
    """bf16 training steps against transformers + torch.optim.AdamW under
    torch.autocast("cpu", bfloat16) from the same weights on the same batch:
    the data is one window of SEQ + 1 tokens, so every batch row is it."""

    SNAPSHOTS = True
    STEPS = 4

    def daemon_losses(self, directory, mixed_precision, **fields):
        succeeded(self, self.d.call("LoadModel", pb.LoadModelRequest(hf_directory=directory)))
        return [r.loss for r in train(self, steps=self.STEPS, batch_size=2, seq_len=SEQ,
                                      learning_rate=1e-3, data=inline(self.window),
                                      mixed_precision=mixed_precision, **fields)]

    def test_bf16_losses_track_transformers_autocast_with_fp32_master_weights(self):
        train(self, steps=10, batch_size=4, seq_len=SEQ, learning_rate=1e-2)
        self.window = random_tokens(SEQ + 1, 3)
        directory = succeeded(self, self.d.call("Snapshot", pb.SnapshotRequest(name="w0"))).snapshot.directory
        bf16 = self.daemon_losses(directory, "bf16")
        fp32 = self.daemon_losses(directory, "no")
        # Offloading to disk and checkpointing change nothing, in bf16 too.
        offloaded = self.daemon_losses(directory, "bf16", gradient_checkpointing=True,
                                       offload=pb.OffloadOptions(enabled=True, min_offload_bytes=0))
        self.assertEqual(offloaded, bf16)

        model = hf_model(directory).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.0)
        batch = torch.tensor([self.window, self.window])
        theirs = []
        for _ in range(self.STEPS):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(batch[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                     batch[:, 1:].reshape(-1))
            theirs.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for p in model.parameters():
            self.assertEqual(p.dtype, torch.float32)
        print("bf16 training: memprofd %s, transformers autocast %s, memprofd fp32 %s"
              % (["%.6f" % x for x in bf16], ["%.6f" % x for x in theirs],
                 ["%.6f" % x for x in fp32]))
        for i in range(self.STEPS):
            self.assertLess(abs(bf16[i] - theirs[i]), BF16_TOLERANCE * theirs[i], i)
            self.assertNotEqual(bf16[i], fp32[i], i)
        # float32 training would not pass for bf16 (so the test can fail).
        self.assertGreater(max(abs(f - t) / t for f, t in zip(fp32, theirs)), BF16_TOLERANCE)
        # The loss falls in bf16 as in float32.
        self.assertLess(bf16[-1], bf16[0])


if __name__ == "__main__":
    unittest.main()
