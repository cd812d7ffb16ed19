"""The index-based sampler: a pure map from (lane, lane-local position) to a record."""

from zephon_jax.core.permutation import derive_key, permute
from zephon_jax.sampler.mixture import MixtureNode
from zephon_jax.sampler.resolve import Resolution, resolve
from zephon_jax.sampler.source import SourceNode

__all__ = ["MixtureNode", "Resolution", "SourceNode", "derive_key", "permute", "resolve"]
