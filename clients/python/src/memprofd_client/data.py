"""DataSource builders for TrainRequest.data, eval_data and EvaluateRequest.data."""

from __future__ import annotations

from typing import Iterable, Optional

from . import pb


def embedded_corpus() -> pb.DataSource:
    """The English text embedded in the daemon (the default when data is unset)."""
    return pb.DataSource(embedded_corpus=True)


def text_file(path: str) -> pb.DataSource:
    """A text file on the daemon's host, read as bytes."""
    return pb.DataSource(text_file=path)


def token_file(path: str, bytes_per_token: Optional[int] = None) -> pb.DataSource:
    """Little-endian token ids on the daemon's host; bytes_per_token 2 (default) or 4."""
    return pb.DataSource(token_file=pb.TokenFile(path=path, bytes_per_token=bytes_per_token))


def indexed_dataset(prefix: str, within_documents: bool = False) -> pb.DataSource:
    """A Megatron indexed dataset (prefix.bin + prefix.idx) on the daemon's host; windows
    packed across documents (Megatron's default) unless within_documents."""
    windows = (pb.INDEXED_WINDOWS_WITHIN_DOCUMENTS if within_documents
               else pb.INDEXED_WINDOWS_PACKED)
    return pb.DataSource(indexed_dataset=pb.IndexedDataset(prefix=prefix, windows=windows))


def inline_tokens(ids: Iterable[int]) -> pb.DataSource:
    """Token ids sent in the request."""
    return pb.DataSource(inline_tokens=pb.InlineTokens(ids=list(ids)))
