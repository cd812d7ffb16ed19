"""n-to-m operators with explicit carry (one file per operator)."""

from zephon_jax.operators.base import LineageOperator, Operator, Saved
from zephon_jax.operators.concat import ConcatPackOperator
from zephon_jax.operators.contract import (
    ContractOperator,
    Made,
    lineage_operator,
    made_from,
    stateless,
)
from zephon_jax.operators.flat_map import FlatMapOperator
from zephon_jax.operators.pack import BinPackOperator
from zephon_jax.operators.split import SplitOperator
from zephon_jax.operators.user import UserOperator
from zephon_jax.operators.window_shuffle import WindowShuffleOperator

__all__ = [
    "BinPackOperator",
    "ConcatPackOperator",
    "ContractOperator",
    "FlatMapOperator",
    "LineageOperator",
    "Made",
    "Operator",
    "Saved",
    "SplitOperator",
    "UserOperator",
    "WindowShuffleOperator",
    "lineage_operator",
    "made_from",
    "stateless",
]
