"""The index-based sampler: permutations, epochs, mixtures, and no lane resonance."""

from __future__ import annotations

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.sampler import MixtureNode, SourceNode, permute, resolve
from zephon_jax.sampler.mixture import normalize_weights


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4099, 65536 + 17])
def test_permute_is_a_bijection(n):
    for key in (0, 1, 12345):
        image = permute(np.arange(n), n, key)
        assert np.array_equal(np.sort(image), np.arange(n))


def test_permute_depends_on_key_and_looks_random():
    n = 5000
    a, b = permute(np.arange(n), n, 1), permute(np.arange(n), n, 2)
    assert (a == b).mean() < 0.01
    assert abs(np.corrcoef(np.arange(n), a)[0, 1]) < 0.1


def test_shuffled_source_covers_each_epoch_once_and_reshuffles():
    n, lanes = 50, 4
    node = SourceNode(list(range(n)), shuffle_seed=7)
    per_epoch = {}
    for lane in range(lanes):
        res = resolve(node, lane, np.arange(n), lanes)  # 4 lanes x 50 draws = 4 epochs
        for e, r in zip(res.epoch, res.record):
            per_epoch.setdefault(int(e), []).append(int(r))
    assert sorted(per_epoch) == [0, 1, 2, 3]
    orders = []
    for e in range(4):
        assert sorted(per_epoch[e]) == list(range(n))
        orders.append(per_epoch[e])
    assert orders[0] != orders[1]


def test_finite_epochs_mark_positions_past_the_end_invalid():
    node = SourceNode(list(range(10)), num_epochs=2)
    res = resolve(node, 1, np.arange(12), 2)
    assert res.valid.tolist() == [True] * 10 + [False] * 2


def _mixture(weights, order_seed=None):
    children = tuple(SourceNode(list(range(97 + 13 * i))) for i in range(len(weights)))
    return MixtureNode(children, normalize_weights(weights), order_seed=order_seed, node_key=3)


@pytest.mark.parametrize("num_lanes", [8, 64, 256])
@pytest.mark.parametrize("order_seed", [None, 5])
@pytest.mark.parametrize("weights", [[0.5, 0.5], [0.7, 0.2, 0.1], [1, 1, 1, 1], [0.9, 0.05, 0.05]])
def test_every_lane_gets_each_component_in_proportion(num_lanes, order_seed, weights):
    node = _mixture(weights, order_seed)
    draws = 2048
    w = np.asarray(normalize_weights(weights))
    for lane in range(num_lanes):
        leaf = resolve(node, lane, np.arange(draws), num_lanes).leaf
        counts = np.bincount(leaf, minlength=len(weights))
        # Each lane's schedule is exact per lane: within one draw per binary split.
        assert np.all(np.abs(counts - w * draws) <= len(weights)), (lane, counts)


def test_mixture_batches_are_not_in_lockstep_across_lanes():
    node = _mixture([0.5, 0.5])
    first = [int(resolve(node, lane, np.arange(1), 64).leaf[0]) for lane in range(64)]
    assert 16 < sum(first) < 48


def test_mixture_sub_indices_are_a_bijection_per_component():
    node = _mixture([0.6, 0.4], order_seed=9)
    lanes, draws = 8, 1000
    seen = {0: [], 1: []}
    for lane in range(lanes):
        res = resolve(node, lane, np.arange(draws), lanes)
        for leaf, epoch, record in zip(res.leaf, res.epoch, res.record):
            seen[int(leaf)].append((int(epoch), int(record)))
    for leaf, items in seen.items():
        assert len(set(items)) == len(items), f"component {leaf} repeats a record in one epoch"


def test_resolution_is_pure():
    node = _mixture([0.3, 0.7], order_seed=1)
    a = resolve(node, 5, np.arange(100, 300), 16)
    b = resolve(node, 5, np.arange(100, 300), 16)
    c = resolve(node, 5, np.arange(0, 300), 16)
    for field in ("leaf", "record", "epoch"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
        assert np.array_equal(getattr(a, field), getattr(c, field)[100:])


@pytest.mark.parametrize("order_seed", [None, 4])
def test_finite_mixture_reads_every_record_exactly_num_epochs_times(order_seed):
    from zephon_jax.sampler.resolve import end_position

    sizes, epochs, lanes = (37, 120, 9), 2, 5
    children = tuple(SourceNode(list(range(n)), shuffle_seed=1, num_epochs=epochs) for n in sizes)
    node = MixtureNode(children, normalize_weights([0.2, 0.5, 0.3]), order_seed=order_seed)
    counts = [np.zeros(n, int) for n in sizes]
    for lane in range(lanes):
        end = end_position(node, lane, lanes)
        res = resolve(node, lane, np.arange(end + 2 * 1024), lanes)
        assert not res.valid[end:].any()
        for leaf, record in zip(res.leaf[res.valid], res.record[res.valid]):
            counts[leaf][record] += 1
    for c in counts:
        assert (c == epochs).all()


@pytest.mark.parametrize(
    "weights, shares",
    [
        ([1e308, 1e308], (0.5, 0.5)),
        ([1e308, 5e307, 1e308], (0.4, 0.2, 0.4)),
        ([5e-324, 5e-324], (0.5, 0.5)),
        ([np.float32(3), np.int64(1)], (0.75, 0.25)),
        ([2**80, 2**80 * 3], (0.25, 0.75)),
    ],
)
def test_weights_of_any_magnitude_normalize_and_run(weights, shares):
    parts = [zj.Dataset.source([i] * 4) for i in range(len(weights))]
    ds = zj.Dataset.mix(parts, weights).batch(12)
    assert ds.dataset._sampler.weights == pytest.approx(shares, rel=1e-12)
    batch = next(iter(zj.Loader(ds)))
    counts = np.bincount(batch, minlength=len(weights)) / len(batch)
    np.testing.assert_allclose(counts, shares, atol=1 / 6)


@pytest.mark.parametrize(
    "weights, match",
    [
        ([1e308, 1e-308], r"weight 1 \(1e-308\) is 1e-616|weight 1 \(1e-308\) is 0 of the total"),
        ([1, 1e-12], "below the smallest share a mixture keeps"),
        ([True, 1], "weight 0 is True .bool."),
        (["1", 1], "weight 0 is '1' .str."),
        ("ab", "a sequence of numbers"),
        (3, "a sequence of numbers"),
    ],
)
def test_weights_that_cannot_be_kept_are_rejected_at_definition(weights, match):
    parts = [zj.Dataset.source([1, 2]), zj.Dataset.source([3])]
    with pytest.raises(zj.PipelineError, match=match):
        zj.Dataset.mix(parts, weights)
