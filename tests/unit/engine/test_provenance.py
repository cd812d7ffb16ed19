"""Provenance: every row's segments are the records and slices the batch really holds."""

from __future__ import annotations

import numpy as np
import pytest
from pipelines import make_docs

import zephon_jax as zj
from zephon_jax.engine.explain import explain_step

STEPS = 12
BATCH = 8
SEQ = 48
DOCS = make_docs(300, 130, seed=5)
CODE = make_docs(90, 40, seed=6, vocab=50)
SOURCES = [DOCS, CODE]


def drop_first(record):
    return {"tokens": record["tokens"][1:]}


def not_empty(record):
    return len(record["tokens"]) > 0


def component(source, name):
    """The per-record transforms of a component, before the mixture."""
    return zj.Dataset.source(source, name=name).map(drop_first).filter(not_empty)


def transformed(source: int, record: int) -> np.ndarray:
    """``source[record]`` after its component's own transforms."""
    return drop_first(SOURCES[source][record])["tokens"]


def pipeline(method: str = "best_fit") -> zj.BatchedDataset:
    mixed = zj.Dataset.mix([component(DOCS, "docs"), component(CODE, "code")], [0.7, 0.3])
    packed = mixed.shuffle(seed=3).split(SEQ).pack(SEQ, method=method)
    return packed.window_shuffle(4, seed=9).batch(BATCH)


def run(loader: zj.Loader, steps: int, state=None):
    it = iter(loader)
    if state is not None:
        it.set_state(state)
    batches, provenance = [], []
    for _ in range(steps):
        batches.append(next(it))
        provenance.append(it.provenance())
    return it, batches, provenance


@pytest.fixture(scope="module")
def reference():
    _, batches, provenance = run(zj.Loader(pipeline()), STEPS)
    return batches, provenance


def assert_rows_match(batch, provenance):
    """Each segment's tokens are its record's slice, and the segments fill the row in order."""
    assert len(provenance) == len(batch["tokens"])
    for row, segments in enumerate(provenance):
        tokens, ids = batch["tokens"][row], batch["tokens_segment_ids"][row]
        assert len(segments) == int(ids.max())
        for k, seg in enumerate(segments):
            assert set(seg) == {"source", "label", "record", "epoch", "start", "stop"}
            assert seg["label"] == ("docs", "code")[seg["source"]]
            assert seg["epoch"] >= 0
            want = transformed(seg["source"], seg["record"])[seg["start"] : seg["stop"]]
            np.testing.assert_array_equal(tokens[ids == k + 1], want)


def test_every_segment_is_the_slice_of_its_record(reference):
    for batch, provenance in zip(*reference):
        assert_rows_match(batch, provenance)
    sources = {seg["source"] for p in reference[1] for row in p for seg in row}
    assert sources == {0, 1}


def test_concat_packing_pieces_are_slices():
    _, batches, provenance = run(zj.Loader(pipeline("concat")), 6)
    for batch, prov in zip(batches, provenance):
        for row, segments in enumerate(prov):
            pieces = [
                transformed(s["source"], s["record"])[s["start"] : s["stop"]] for s in segments
            ]
            np.testing.assert_array_equal(np.concatenate(pieces), batch["tokens"][row])


@pytest.mark.parametrize("processes", [2, 4])
def test_each_process_reports_its_rows_and_together_they_cover_the_batch(reference, processes):
    parts = [
        run(zj.Loader(pipeline(), process_index=i, process_count=processes), STEPS)[2]
        for i in range(processes)
    ]
    for t in range(STEPS):
        assert [row for part in parts for row in part[t]] == reference[1][t]
        assert all(len(part[t]) == BATCH // processes for part in parts)


def test_same_provenance_after_a_resume_on_another_topology(reference):
    iters = [run(zj.Loader(pipeline(), process_index=i, process_count=2), 5)[0] for i in range(2)]
    state = zj.merge_states([it.get_state() for it in iters])
    parts = [
        run(zj.Loader(pipeline(), process_index=i, process_count=4), STEPS - 5, state)[2]
        for i in range(4)
    ]
    for t in range(STEPS - 5):
        assert [row for part in parts for row in part[t]] == reference[1][5 + t]


def test_workers_and_device_prefetch_give_the_same_provenance(reference, sharding):
    _, _, with_workers = run(zj.Loader(pipeline(), num_workers=2), 4)
    assert with_workers == reference[1][:4]
    for prefetch in (0, 2):
        loader = zj.Loader(pipeline(), sharding=sharding, device_prefetch=prefetch)
        assert run(loader, 4)[2] == reference[1][:4]


def test_explain_step_from_a_state_runs_forward_only_from_it(reference):
    it, _, _ = run(zj.Loader(pipeline()), 4)
    state = it.get_state()
    assert explain_step(pipeline(), STEPS - 1, state=state) == reference[1][-1]
    assert explain_step(pipeline(), STEPS - 1) == reference[1][-1]
    rows = [6, 1]
    assert explain_step(pipeline(), 7, state=state, rows=rows) == [reference[1][7][r] for r in rows]
    with pytest.raises(zj.PipelineError, match="state is at step 4, after step 2"):
        explain_step(pipeline(), 2, state=state)
    other = zj.Dataset.source(DOCS).split(SEQ).pack(SEQ).batch(BATCH)
    with pytest.raises(zj.StateMismatchError):
        explain_step(other, 6, state=state)


def test_unpacked_and_flat_mapped_rows():
    # Unpacked rows have one segment whose slice is the row.
    ds = zj.Dataset.source(DOCS).split(16).filter(lambda r: len(r["tokens"]) == 16).batch(4)
    it = iter(zj.Loader(ds))
    for _ in range(5):
        batch = next(it)
        for row, segments in zip(batch["tokens"], it.provenance()):
            (seg,) = segments
            np.testing.assert_array_equal(
                DOCS[seg["record"]]["tokens"][seg["start"] : seg["stop"]], row
            )

    def halves(record):
        n = len(record["tokens"]) // 2
        return [{"tokens": record["tokens"][:n]}, {"tokens": record["tokens"][n:]}]

    ds = zj.Dataset.source(DOCS).flat_map(halves).pack(160).batch(2)
    it = iter(zj.Loader(ds))
    batch = next(it)
    for row, segments in enumerate(it.provenance()):
        ids = batch["tokens_segment_ids"][row]
        for k, seg in enumerate(segments):
            assert seg["start"] is None and seg["stop"] is None
            want = halves(DOCS[seg["record"]])[seg["output"]]["tokens"]
            np.testing.assert_array_equal(batch["tokens"][row][ids == k + 1], want)


def test_provenance_before_the_first_batch_raises():
    it = iter(zj.Loader(pipeline()))
    with pytest.raises(zj.PipelineError, match="call next\\(\\) first"):
        it.provenance()


EXPLAIN_PIPELINE = """
import numpy as np
import zephon_jax as zj

TEXTS = [("doc %d " % i) * (1 + i % 7) for i in range(200)]


def tokens(record):
    return {"tokens": np.frombuffer(record["text"].encode(), np.uint8).astype(np.int32)}


def decode(tokens):
    return bytes(np.asarray(tokens, np.uint8)).decode()


def pipeline():
    source = zj.Dataset.source([{"text": t} for t in TEXTS], name="texts")
    return source.shuffle(1).map(tokens).split(16).pack(16).batch(4)
"""


def test_explain_command_from_a_state_file_and_a_checkpoint(tmp_path, monkeypatch, capsys):
    import sys

    import orbax.checkpoint as ocp

    import zephon_jax.checkpoint as zc
    from zephon_jax.tools.cli import main

    (tmp_path / "explain_pipeline.py").write_text(EXPLAIN_PIPELINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("explain_pipeline", None)
    import explain_pipeline

    ds = explain_pipeline.pipeline()
    it = iter(zj.Loader(ds))
    for _ in range(6):
        next(it)
    zj.save_state(it.get_state(), tmp_path / "state.zjs")
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(6, args=ocp.args.Composite(data=zc.Save(it)))
        mngr.wait_until_finished()
    batch = next(it)
    want = it.provenance()

    common = ["explain", "explain_pipeline:pipeline", "--step", "6", "--row", "2"]
    common += ["--decode", "explain_pipeline:decode"]
    outputs = []
    for state in (None, tmp_path / "state.zjs", tmp_path / "ckpt" / "6"):
        assert main(common + ([] if state is None else ["--state", str(state)])) == 0
        out = capsys.readouterr().out
        outputs.append(out.split("\n", 1)[1])  # after the timing line
    # From a state, the rows are followed by the state's accounting (the same for both).
    accounted = [out.partition("the state's accounting")[2] for out in outputs[1:]]
    assert accounted[0] == accounted[1] and "6 batches delivered" in accounted[0]
    outputs[1:] = [out.partition("the state's accounting")[0] for out in outputs[1:]]
    assert outputs[0] == outputs[1] == outputs[2]
    text = outputs[0]
    assert f"row 2: {len(want[2])} segment" in text
    ids = batch["tokens_segment_ids"][2]
    for k, seg in enumerate(want[2]):
        assert f"record {seg['record']}, epoch {seg['epoch']}" in text
        assert f"slice [{seg['start']}:{seg['stop']}]" in text
        shown = explain_pipeline.decode(batch["tokens"][2][ids == k + 1])
        assert repr(shown)[1:-1] in text  # the slice's own text, decoded
    assert zj.load_state(tmp_path / "state.zjs")["step"] == 6
    assert main(common[:-2] + ["--step", "2", "--state", str(tmp_path / "state.zjs")]) == 1
    assert "after step 2" in capsys.readouterr().err


def test_state_files_reject_damage(tmp_path):
    it = iter(zj.Loader(pipeline()))
    next(it)
    path = tmp_path / "s.zjs"
    zj.save_state(it.get_state(), path)
    data = bytearray(path.read_bytes())
    data[-10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(zj.StateError, match="corrupt"):
        zj.load_state(path)
    (tmp_path / "other").write_text("hello")
    with pytest.raises(zj.StateError, match="not a zephon_jax state file"):
        zj.load_state(tmp_path / "other")


def test_token_weighted_staged_mixture_with_a_ramp():
    """Rows of a mixture by tokens with weight stages, batch ramped up, on two processes."""
    mixed = zj.Dataset.mix(
        [component(DOCS, "docs"), component(CODE, "code")],
        {0: [0.7, 0.3], 4: [0.0, 1.0], 8: [0.5, 0.5]},
        unit="tokens",
    )
    ds = mixed.shuffle(seed=3).split(SEQ).pack(SEQ).batch({0: 4, 5: 8})
    whole = [next(it) for it in [iter(zj.Loader(ds))] for _ in range(STEPS)]
    its = [iter(zj.Loader(ds, process_index=i, process_count=2)) for i in range(2)]
    for step in range(STEPS):
        parts = [next(it) for it in its]
        provenance = [seg for it in its for seg in it.provenance()]
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        np.testing.assert_array_equal(batch["tokens"], whole[step]["tokens"])
        assert_rows_match(batch, provenance)
        assert provenance == explain_step(ds, step)


def test_explain_step_with_a_ramp_needs_only_the_lanes_behind_its_rows():
    """Each process's own state explains its own rows, before and after the ramp's change."""
    mixed = zj.Dataset.mix([component(DOCS, "docs"), component(CODE, "code")], [0.7, 0.3])
    ds = mixed.shuffle(seed=3).split(SEQ).pack(SEQ).batch({0: 4, 5: 8})
    assert ds.num_lanes == 4
    _, _, whole = run(zj.Loader(ds), STEPS)
    its = [iter(zj.Loader(ds, process_index=i, process_count=2)) for i in range(2)]
    states: dict[int, list] = {}
    for step in range(7):
        if step in (3, 6):  # a state before the change (at 5) and one after it
            states[step] = [it.get_state() for it in its]
        for it in its:
            next(it)
    for at, explained in ((3, (3, 4, 5, 7)), (6, (6, 9))):
        for p, state in enumerate(states[at]):
            for step in explained:
                size = ds.batch_size_at(step)
                mine = list(range(p * size // 2, (p + 1) * size // 2))
                want = [whole[step][r] for r in mine]
                assert explain_step(ds, step, state=state, rows=mine) == want
    # One row needs only its lane: a state that holds that lane alone explains it.
    state = states[3][1]
    alone = {**state, "lanes": {"3": state["lanes"]["3"]}}
    assert explain_step(ds, 7, state=alone, rows=[7]) == [whole[7][7]]  # 8 rows: lane 3
    assert explain_step(ds, 4, state=alone, rows=[3]) == [whole[4][3]]  # 4 rows: lane 3
    with pytest.raises(zj.StateError, match="does not cover lane 2"):
        explain_step(ds, 7, state=alone, rows=[5])
