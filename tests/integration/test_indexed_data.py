"""Megatron indexed datasets over the wire: a pair written by megatron-core's
own IndexedDatasetBuilder trains; a corrupt pair is DATA_LOSS naming the file
and offset, and the daemon keeps serving.

Run by the venv's Python (MEMPROFD_PYTHON: grpcio, protobuf, torch,
megatron-core)."""

import os
import unittest

import grpc
import numpy
import torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

import harness
from harness import pb, wait_done

DATA_LOSS = grpc.StatusCode.DATA_LOSS.value[0]


def build(prefix, vocab, documents=20, seed=0):
    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(vocab))
    for _ in range(documents):
        n = int(rng.integers(5, 60))
        builder.add_item(torch.from_numpy(rng.integers(0, vocab, n).astype(numpy.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")


class IndexedDataTest(harness.DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        cls.DAEMON_FLAGS = ("--model=" + harness.micro_model_dir(),)
        super().setUpClass()

    def train(self, prefix, windows=pb.INDEXED_WINDOWS_UNSPECIFIED):
        data = pb.DataSource(indexed_dataset=pb.IndexedDataset(prefix=prefix, windows=windows))
        return wait_done(self.d, self.d.call("Train", pb.TrainRequest(
            steps=3, batch_size=2, seq_len=4, data=data)).id, timeout=120)

    def test_a_megatron_pair_trains_packed_and_within_documents(self):
        prefix = os.path.join(self.scratch, "corpus_text_document")
        build(prefix, 256)
        for windows in (pb.INDEXED_WINDOWS_PACKED, pb.INDEXED_WINDOWS_WITHIN_DOCUMENTS):
            op = self.train(prefix, windows)
            self.assertEqual(op.state, pb.OPERATION_STATE_SUCCEEDED, op.error.message)

    def test_a_corrupt_pair_is_data_loss_and_the_daemon_keeps_serving(self):
        prefix = os.path.join(self.scratch, "broken")
        build(prefix, 256, seed=1)
        with open(prefix + ".bin", "r+b") as f:
            f.truncate(os.path.getsize(prefix + ".bin") - 2)
        op = self.train(prefix)
        self.assertEqual(op.state, pb.OPERATION_STATE_FAILED)
        self.assertEqual(op.error.code, DATA_LOSS, op.error.message)
        self.assertIn("broken.bin", op.error.message)
        self.assertIn("at byte", op.error.message)
        self.assertEqual(self.d.call("GetStatus", pb.GetStatusRequest()).serving_state, "SERVING")
        good = os.path.join(self.scratch, "good")
        build(good, 256, seed=2)
        self.assertEqual(self.train(good).state, pb.OPERATION_STATE_SUCCEEDED)


if __name__ == "__main__":
    unittest.main()
