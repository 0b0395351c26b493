"""Writes Megatron indexed datasets with megatron-core's own builder and dumps
what megatron-core's IndexedDataset reads back, for indexed_data_test.cc.

Usage: indexed_reference.py DIR. Writes DIR/u16.{bin,idx} (vocabulary 1000:
megatron picks uint16) and DIR/i32.{bin,idx} (vocabulary 70000: int32), and
DIR/reference.json: for each prefix, the dtype, the document indices and each
sequence's ids as IndexedDataset returns them.
"""

import json
import os
import sys

import numpy
import torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder


def build(prefix, vocab, seed):
    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(vocab))
    # Documents of one or more sequences (sentences), short and long.
    for doc_len in [3, 40, 7, 25, 1, 60, 12]:
        sentences = 1 + doc_len % 3
        for s in range(sentences):
            n = max(1, doc_len // sentences)
            builder.add_item(torch.from_numpy(rng.integers(0, vocab, n).astype(numpy.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    ds = IndexedDataset(prefix, mmap=True)
    return {
        "dtype": numpy.dtype(ds.index.dtype).name,
        "document_indices": [int(i) for i in ds.document_indices],
        "sequences": [[int(t) for t in ds[i]] for i in range(len(ds))],
        "spans": [[i, 1, 2, [int(t) for t in ds.get(i, offset=1, length=2)]]
                  for i in range(len(ds)) if ds.sequence_lengths[i] >= 3],
    }


def main():
    out = sys.argv[1]
    ref = {"u16": build(os.path.join(out, "u16"), 1000, 1),
           "i32": build(os.path.join(out, "i32"), 70000, 2)}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)


if __name__ == "__main__":
    main()
