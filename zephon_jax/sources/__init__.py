"""Random-access data sources: TokenArray, TokenStore, ArrayRecord, JSON Lines and Parquet files.

Every source takes local paths or ``s3://`` / ``gs://`` URLs (see
:mod:`zephon_jax.sources.storage`). Hugging Face ``datasets.Dataset`` objects need no
wrapper: :meth:`zephon_jax.Dataset.source` reads them directly, in batches.
"""

from zephon_jax.sources.array_record import ArrayRecordTokens
from zephon_jax.sources.jsonl import JsonlSource
from zephon_jax.sources.parquet import ParquetSource
from zephon_jax.sources.storage import RetryPolicy, StorageError, retry_policy, set_retry_policy
from zephon_jax.sources.token_array import TokenArray
from zephon_jax.sources.token_store import (
    TokenStore,
    TokenStoreError,
    TokenStoreWriter,
    commit_token_store,
    create_token_store,
    write_token_range,
    write_token_store,
)

__all__ = [
    "ArrayRecordTokens",
    "JsonlSource",
    "ParquetSource",
    "RetryPolicy",
    "StorageError",
    "TokenArray",
    "TokenStore",
    "TokenStoreError",
    "TokenStoreWriter",
    "commit_token_store",
    "create_token_store",
    "retry_policy",
    "set_retry_policy",
    "write_token_range",
    "write_token_store",
]
