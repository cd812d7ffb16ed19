"""A user module of pipelines for the ``zephon-jax`` command's tests, and its fixture."""

from __future__ import annotations

import pytest
from pipelines import user_module

PIPELINES = '''
import itertools
import random

import numpy as np

import zephon_jax as zj


def docs():
    rng = np.random.default_rng(0)
    return [
        {"tokens": rng.integers(2, 250, int(rng.integers(1, 70))).astype(np.int32)}
        for _ in range(300)
    ]


def double(record):
    return {"tokens": record["tokens"] * 2}


def pure():
    d = docs()
    a = zj.Dataset.source(d[:200]).map(double)
    b = zj.Dataset.source(d[200:])
    return (
        zj.Dataset.mix([a, b], [0.75, 0.25]).shuffle(7).split(24)
        .pack(24, method="first_fit", num_bins=3).window_shuffle(4, 9).batch(8, num_lanes=4)
    )


class CoinFlip(zj.Operator):
    """Not deterministic: draws from the global random module."""

    def init(self):
        return 0

    def step(self, carry, record):
        tokens = record["tokens"].copy()
        if random.random() < 0.2:
            tokens[0] += 1
        return carry, [{"tokens": tokens}]


def coin_flip():
    return zj.Dataset.source(docs()).shuffle(1).apply(CoinFlip()).split(24).pack(24).batch(8)


_counter = itertools.count()


def stamp(record):
    return {"tokens": record["tokens"] + next(_counter)}  # never the same twice


def counter():
    return zj.Dataset.source(docs()).map(stamp).split(24).pack(24).batch(4)


def unbatched():
    return zj.Dataset.source(docs())


def a_map_function_with_a_name_much_longer_than_any_column_of_a_table(record):
    return record


def long_names():
    return (
        zj.Dataset.source(docs())
        .split(24)
        .map(a_map_function_with_a_name_much_longer_than_any_column_of_a_table)
        .pack(24)
        .batch(4)
    )
'''


@pytest.fixture
def pipelines(tmp_path, monkeypatch):
    yield from user_module(tmp_path, monkeypatch, "user_pipelines", PIPELINES)
