"""Random-access data sources."""

from zephon_jax.sources.token_store import (
    TokenStore,
    TokenStoreError,
    TokenStoreWriter,
    write_token_store,
)

__all__ = ["TokenStore", "TokenStoreError", "TokenStoreWriter", "write_token_store"]
