"""Mixtures by tokens or by stages of weights: the per-lane credit chooser, its carry,
stages, ends, the no-tokens guard, and locating and regenerating draws."""

from __future__ import annotations

import numpy as np
import pytest

from zephon_jax.core.lineage import Element
from zephon_jax.errors import PipelineError, RecordError, StateError
from zephon_jax.sampler import scheduled_mixture
from zephon_jax.sampler.mixture import MixtureNode
from zephon_jax.sampler.resolve import resolve
from zephon_jax.sampler.scheduled_mixture import (
    MixtureDrawer,
    ScheduledMixtureNode,
    draw_table,
    locate_draws,
    locate_roots,
    parse_weight_stages,
    quantize,
    read_draws_ahead,
)
from zephon_jax.sampler.source import SourceNode
from zephon_jax.transforms import DROP


def docs(length, n, base=0):
    return [{"tokens": np.full(length, base + i, np.int32)} for i in range(n)]


SOURCES = [docs(2, 10), docs(1, 10, base=100)]  # component 0: 2 tokens each; 1: 1 token


def make(weights=(0.5, 0.5), unit="tokens", sources=SOURCES, epochs=None, transforms=()):
    children = tuple(SourceNode(s, num_epochs=epochs) for s in sources)
    node = ScheduledMixtureNode(
        children, parse_weight_stages(weights, len(children)), unit=unit, transforms=transforms
    )

    def read(leaf, records):
        return [sources[leaf][r] for r in records]

    def transform(transforms, data, lineage, where):
        for t in transforms:
            data = t(data)
        return data

    return MixtureDrawer(node, 0, 1, read, transform)


def components(drawer, count, stage=0, start=0):
    out = []
    for position in range(start, start + count):
        element = drawer.draw(stage, position)
        out.append(element.lineage[1])
    return out


def test_by_tokens_the_one_token_component_is_drawn_twice_as_often():
    drawer = make()
    drawn = components(drawer, 30)
    # credits return to zero every 3 draws: one 2-token record and two 1-token records
    for k in range(10):
        assert sorted(drawn[3 * k : 3 * k + 3]) == [0, 1, 1]
    stage, credits, next_sub = drawer.carry()
    assert stage == 0 and sum(credits) == 0 and next_sub == (10, 20)


def test_by_records_both_alternate_and_lineages_name_the_draw():
    drawer = make(unit="records")
    elements = [drawer.draw(0, p) for p in range(6)]
    assert sorted(e.lineage[1] for e in elements[:2]) == [0, 1]
    assert [e.lineage[0] for e in elements] == list(range(6))
    for e in elements:
        position, component, sub = e.lineage
        assert e.data is SOURCES[component][sub]
    assert drawer.carry()[2] == (3, 3)


def test_a_stage_change_restarts_credits_and_follows_its_weights():
    drawer = make(weights={0: [0.5, 0.5], 3: [0.0, 1.0]})
    components(drawer, 4)
    before = drawer.carry()[2]
    assert components(drawer, 5, stage=1, start=4) == [1] * 5  # weight 0: never drawn
    assert drawer.carry()[0] == 1 and drawer.carry()[2] == (before[0], before[1] + 5)


def test_finite_components_end_with_none():
    drawer = make(unit="records", sources=[docs(1, 2), docs(1, 3)], epochs=1)
    drawn = components(drawer, 5)
    assert sorted(drawn) == [0, 0, 1, 1, 1]
    assert drawer.draw(0, 5) is None


def test_set_carry_round_trips_and_refuses_a_foreign_carry():
    drawer = make()
    components(drawer, 7)
    carry = drawer.carry()
    fresh = make()
    fresh.set_carry(carry)
    assert components(fresh, 6, start=7) == components(drawer, 6, start=7)
    too_big = 1 << 62  # credits and draws are counted in int64 by the kernels
    for bad in [(0, (1, 0), (0, 0)), (2, (0, 0), (0, 0)), (0, (0,), (0,)), (0, (0, 0), (-1, 0)),
                (0, (too_big, -too_big), (0, 0)), (0, (0, 0), (too_big, 0))]:  # fmt: skip
        with pytest.raises(StateError, match="mixture carry"):
            fresh.set_carry(bad)


def test_a_component_that_never_gives_tokens_is_named():
    drawer = make(sources=[docs(0, 1), docs(1, 1)])
    with pytest.raises(RecordError, match="mixture component 0 .* gave no tokens"):
        for position in range(5000):
            drawer.draw(0, position)


def test_a_draw_of_more_tokens_than_the_credits_can_count_is_refused():
    drawer = make()
    assert drawer.max_tokens == (1 << 62) // (2 * sum(quantize([0.5, 0.5])))
    drawer.max_tokens = 1  # component 0's records have 2 tokens
    with pytest.raises(RecordError, match="has 2 tokens, more than a mixture of 2 datasets"):
        components(drawer, 3)


def test_by_tokens_a_record_without_tokens_is_refused():
    drawer = make(sources=[[{"text": "a"}], docs(1, 3)])
    with pytest.raises(RecordError, match=r"has none \(its fields: \['text'\]\)"):
        components(drawer, 4)


def test_a_dropping_mixture_transform_returns_drop():
    def drop_odd(data):
        return DROP if int(data["tokens"][0]) % 2 else data

    drawer = make(unit="records", transforms=(drop_odd,))
    out = [drawer.draw(0, p) for p in range(4)]
    assert any(x is DROP for x in out) and any(isinstance(x, Element) for x in out)


def test_locate_and_regenerate_read_draws_back():
    drawer = make()
    elements = [drawer.draw(0, p) for p in range(6)]
    lineages = [e.lineage for e in elements]
    assert locate_roots(drawer.node, 0, 1, lineages) == [(c, s, 0) for _, c, s in lineages]
    assert drawer.locate([(0, 1, 12)]) == [(1, 2, 1)]  # component draw 12 of 10: epoch 1
    again = make().regenerate(lineages)
    for e in elements:
        assert again[e.lineage].data is e.data


def test_locate_draws_of_many_lanes_is_each_lanes_resolve():
    """Draws of several lanes, interleaved, located in one call, against each draw's own
    component resolved lane by lane: a shuffled source over several epochs and a nested
    mixture (located a lane at a time)."""
    nested = MixtureNode((SourceNode(docs(1, 5)), SourceNode(docs(1, 4))), (0.5, 0.5))
    children = (SourceNode(docs(2, 7), shuffle_seed=3), nested)
    node = ScheduledMixtureNode(children, parse_weight_stages((0.5, 0.5), 2), unit="records")
    rng = np.random.default_rng(0)
    lane_of = rng.integers(0, 6, 200)
    roots = [(int(p), int(c), int(s)) for p, c, s in zip(
        rng.integers(0, 99, 200), rng.integers(0, 2, 200), rng.integers(0, 40, 200)
    )]  # fmt: skip
    located = locate_draws(node, lane_of, draw_table(roots), 6)
    bases = (0, 1)
    for i, (_, component, sub) in enumerate(roots):
        want = resolve(children[component], int(lane_of[i]), np.array([sub]), 6)
        assert located.leaf[i] == bases[component] + want.leaf[0]
        assert (located.record[i], located.epoch[i]) == (want.record[0], want.epoch[0])
    one = [root for root, lane in zip(roots, lane_of) if lane == 2]
    assert locate_roots(node, 2, 6, one) == [
        (int(leaf), int(record), int(epoch))
        for leaf, record, epoch, lane in zip(located.leaf, located.record, located.epoch, lane_of)
        if lane == 2
    ]


def test_weights_parsing_quantizing_and_describe():
    stages = parse_weight_stages({0: [1, 3], 10: [0, 2]}, 2)
    assert stages.starts == (0, 10) and stages.values == ((0.25, 0.75), (0.0, 1.0))
    assert parse_weight_stages([1, 1], 2).values == ((0.5, 0.5),)
    with pytest.raises(PipelineError, match="has 3 weights for 2 datasets"):
        parse_weight_stages([1, 1, 1], 2)
    with pytest.raises(PipelineError, match="are all zero"):
        parse_weight_stages([0, 0], 2)
    with pytest.raises(PipelineError, match=r"weight 1 .* is -1.0"):
        parse_weight_stages([1, -1], 2)
    with pytest.raises(PipelineError, match="must be numbers"):
        parse_weight_stages(["a", 1], 2)
    assert quantize((0.0, 0.25, 1e-20)) == (0, 1 << 30, 1)
    node = make(weights={0: [1, 3]}).node
    assert node.describe()["weights"] == {"unit": "tokens", "stages": {"0": [0.25, 0.75]}}
    assert node.draws_available(0, [1, 2]) is None


def test_drawers_read_ahead_together_exactly_where_each_next_draw_would():
    """read_draws_ahead finds, for all drawers at once, those whose next draw of a
    component is weighted in their stage, has draws left and is not read ahead with at
    least ``_DRAWS_MARGIN`` draws (or up to the component's end); it reads those (and
    only those) ahead, as each drawer would on its own."""
    sources = [docs(2, 10), docs(1, 4)]
    children = tuple(SourceNode(s, num_epochs=e) for s, e in zip(sources, (None, 1)))
    node = ScheduledMixtureNode(children, parse_weight_stages({0: [0.5, 0.5], 9: [1.0, 0.0]}, 2))

    def lengths(leaf_ids, records):
        return np.array([len(sources[l][r]["tokens"]) for l, r in zip(leaf_ids, records)])

    drawers = [MixtureDrawer(node, lane, 6, None, None, ids=lengths) for lane in range(6)]
    drawers[1].enter_stage(1)  # component 1 weighs nothing
    drawers[2].next_sub[1] = drawers[2].ends[1]  # component 1 has no draws left
    margin = scheduled_mixture._DRAWS_MARGIN
    while drawers[3].ids_ahead.size[0] < margin:  # (chunks double from 8)
        drawers[3].read_ids_ahead(0, 0)  # component 0's next draws are read ahead
    drawers[3].read_ids_ahead(1, 0)  # component 1's, up to its end (one draw)
    drawers[4].read_ids_ahead(0, 0)
    drawers[4].next_sub[0] = drawers[4].ids_ahead.first[0] + drawers[4].ids_ahead.size[0]
    drawers[5].read_ids_ahead(0, 0)  # 8 draws read ahead: fewer than the margin

    def reads(d, j):  # the rule, drawer by drawer
        sub, ahead = int(d.next_sub[j]), d.ids_ahead
        covered = ahead.first[j] + ahead.size[j]
        to_end = 0 <= d.ends[j] <= covered and sub < covered
        held = ahead.first[j] <= sub and (covered - sub >= margin or to_end)
        has_left = d.ends[j] < 0 or sub < d.ends[j]
        return bool(not held and d.quanta[d.stage][j] > 0 and has_left)

    want = [[reads(d, j) for j in range(2)] for d in drawers]
    # (lanes 4 and 5 get no draw of component 1's four records)
    assert want == [[True, True], [True, False], [True, False], [False, False], [True, False],
                    [True, False]]  # fmt: skip
    assert drawers[3].ends[1] == 1 and drawers[5].ids_ahead.size[0] == 8
    before = [(d.ids_ahead.first.copy(), d.ids_ahead.size.copy()) for d in drawers]
    read_draws_ahead(drawers)
    for d, (first, size), wanted in zip(drawers, before, want):
        for j in range(2):
            changed = (d.ids_ahead.first[j], d.ids_ahead.size[j]) != (first[j], size[j])
            assert changed == wanted[j]
            if wanted[j]:  # the next draw is held now
                assert d.ids_ahead.first[j] == d.next_sub[j] and d.ids_ahead.size[j] > 0


def test_draws_read_ahead_together_hold_what_each_drawer_reads_on_its_own():
    """Read ahead for all drawers at once (one resolve per component), each drawer holds
    the same draws, leaves, records and token counts as reading its own: also where a
    component is a nested mixture whose finite source leaves draws without a record."""
    sources = [docs(2, 10), docs(3, 3, base=50), docs(1, 7, base=100)]
    nested = MixtureNode((SourceNode(sources[1], num_epochs=1), SourceNode(sources[2])), (0.5, 0.5))
    node = ScheduledMixtureNode(
        (SourceNode(sources[0]), nested), parse_weight_stages([0.6, 0.4], 2)
    )

    def lengths(leaf_ids, records):
        return np.array([len(sources[l][r]["tokens"]) for l, r in zip(leaf_ids, records)])

    def drawers():
        return [MixtureDrawer(node, lane, 4, None, None, ids=lengths) for lane in range(4)]

    together, alone = drawers(), drawers()
    read_draws_ahead(together)
    for a in alone:
        for j in range(2):
            a.read_ids_ahead(j, 0)
    held = [t.ids_ahead for t in together]
    assert all(h.size.tolist() == [8, 8] for h in held)  # every drawer read both components
    invalid = 0
    for t, a in zip(held, (a.ids_ahead for a in alone)):
        for name in ("first", "size"):
            assert getattr(t, name).tolist() == getattr(a, name).tolist()
        for j in range(2):
            n = int(t.size[j])
            for name in ("leaf", "record", "tokens"):
                valid = t.leaf[j, :n] >= 0  # (a draw without a record holds leaf -1 only)
                assert np.array_equal(
                    getattr(t, name)[j, :n][valid], getattr(a, name)[j, :n][valid]
                )
            assert np.array_equal(t.leaf[j, :n] < 0, a.leaf[j, :n] < 0)
            invalid += int((t.leaf[j, :n] < 0).sum())
    assert invalid > 0  # the nested mixture's finite source ran out in some lane


def test_draws_read_ahead_shrink_with_many_lanes():
    """A lane reads at most 1024 draws of a component ahead; from 256 lanes on, fewer,
    all lanes together 131072, never fewer than 64 a lane."""
    assert [scheduled_mixture.max_chunk(n) for n in (1, 128, 256, 512, 1024, 2048, 8192)] == [
        1024, 1024, 512, 256, 128, 64, 64
    ]  # fmt: skip
