"""Random-access data sources."""

from zephon_jax.sources.array_record import ArrayRecordTokens
from zephon_jax.sources.token_store import (
    TokenStore,
    TokenStoreError,
    TokenStoreWriter,
    write_token_store,
)

__all__ = [
    "ArrayRecordTokens",
    "TokenStore",
    "TokenStoreError",
    "TokenStoreWriter",
    "write_token_store",
]
