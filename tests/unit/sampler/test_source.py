"""A sampler leaf: descriptions and labels of sources, the checks on a source, records
and epochs of lane draws (one lane or an array of lanes), and how many draws fit."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.permutation import derive_key, permute
from zephon_jax.errors import PipelineError
from zephon_jax.sampler.source import SourceNode, describe_source, source_label


class Fingerprinted:
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i

    def fingerprint(self):
        return "abc"


def test_describe_source_uses_a_fingerprint_or_the_length():
    assert describe_source([1, 2, 3]) == "list(len=3)"
    assert describe_source(Fingerprinted(None)) == "Fingerprinted(abc)"


def test_source_label_adds_up_to_three_paths():
    assert source_label([1]) == "list(len=1)"
    assert source_label(Fingerprinted("a.jsonl")) == "Fingerprinted(abc) [files: a.jsonl]"
    many = Fingerprinted(["a", "b", "c", "d"])
    assert source_label(many) == "Fingerprinted(abc) [files: a, b, c, ...]"
    assert source_label(Fingerprinted([])) == "Fingerprinted(abc)"


def test_a_source_needs_len_getitem_and_a_record():
    with pytest.raises(PipelineError, match="random-access source.*got generator"):
        SourceNode(x for x in range(3))
    with pytest.raises(PipelineError, match=r"list\(len=0\) is empty"):
        SourceNode([])


def test_locate_maps_draws_to_global_indices_of_the_lane():
    node = SourceNode(list(range(5)), num_epochs=2)
    # lane 2 of 3: global indices 2, 5, 8, 11 -> records 2, 0, 3, 1 of epochs 0, 1, 1, 2
    records, epochs, valid = node.locate(2, np.arange(4), 3)
    assert records.tolist() == [2, 0, 3, 1]
    assert epochs.tolist() == [0, 1, 1, 2]
    assert valid.tolist() == [True, True, True, False]
    # an array of lanes: draw i of lane lanes[i]
    records, epochs, _ = node.locate(np.array([0, 1, 2]), np.array([1, 1, 3]), 3)
    assert records.tolist() == [3, 4, 1] and epochs.tolist() == [0, 0, 2]


@pytest.mark.parametrize("lanes", ["one lane", "lanes out of order"])
def test_a_shuffled_source_permutes_each_draw_by_its_epochs_key(lanes):
    """Each draw's record is its unshuffled record permuted by its epoch's key, whether
    a lane's draws come in order (several epochs: slices) or lanes' draws one after the
    other (their epochs out of order: sorted first), over many epochs."""
    n, seed, num_lanes = 7, 11, 3
    node = SourceNode(list(range(n)), shuffle_seed=seed)
    if lanes == "one lane":
        lane, draws = 2, np.arange(0, 40)
    else:
        lane = np.array([0] * 10 + [2] * 10 + [1] * 10)
        draws = np.concatenate([np.arange(10, 20), np.arange(0, 10), np.arange(5, 15)])
    records, epochs, _ = node.locate(lane, draws, num_lanes)
    g = draws * num_lanes + lane
    assert epochs.tolist() == (g // n).tolist() and len(set(epochs.tolist())) > 3
    want = [int(permute(np.array([k % n]), n, derive_key(seed, int(k // n)))[0]) for k in g]
    assert records.tolist() == want


def test_draws_available_counts_a_lanes_draws_inside_the_epochs():
    node = SourceNode(list(range(5)), num_epochs=2)  # 10 global indices
    # lanes of 3: lane 0 reads 0, 3, 6, 9 (4); lane 1: 1, 4, 7 (3); lane 2: 2, 5, 8 (3)
    assert [node.draws_available(lane, 3) for lane in range(3)] == [4, 3, 3]
    assert node.draws_available(11, 12) == 0
    assert SourceNode([1]).draws_available(0, 1) is None
    d = node.describe()
    assert d == {"source": "list(len=5)", "shuffle_seed": None, "num_epochs": 2, "transforms": []}
