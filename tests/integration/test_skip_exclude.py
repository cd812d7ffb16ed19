"""Skipping global batches: ``it.skip(n)`` continues with the uninterrupted run's batches,
on any topology, recorded in the state (and accepted by ``zephon-jax explain``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from pipelines import assert_batches_equal, concat_parts

import zephon_jax as zj
from integration.test_accounting import mixed, run_global
from zephon_jax.engine.lane import Lane, LanePlan
from zephon_jax.state.global_state import lane_bytes
from zephon_jax.state.lane_format import decode_lane_state


@pytest.mark.parametrize("kind", ["pack", "stages", "ramp"])
def test_skip_continues_with_the_uninterrupted_batches(kind):
    ds = mixed(kind)
    _, whole, _, reports = run_global(ds, 8)
    it = iter(zj.Loader(ds))
    first = [next(it), next(it)]
    it.skip(3)
    rest = [next(it) for _ in range(3)]
    assert_batches_equal(first + rest, whole[:2] + whole[5:8])
    report = it.accounting()
    assert report["step"] == 8 and report["steps"] == 5 and report["skipped"] == 3
    skipped_tokens = sum(f["tokens"] for f in reports[4]["sources"].values()) - sum(
        f["tokens"] for f in reports[1]["sources"].values()
    )
    assert sum(f["tokens"] for f in report["sources"].values()) == (
        sum(f["tokens"] for f in reports[7]["sources"].values()) - skipped_tokens
    )


def test_a_skipped_run_resumes_elsewhere_the_same_way():
    ds = mixed("pack")
    _, whole, _, _ = run_global(ds, 9)
    its = [iter(zj.Loader(ds, process_index=i, process_count=2)) for i in range(2)]
    for it in its:
        next(it)
        it.skip(4)
    state = zj.merge_states([it.get_state() for it in its])
    assert zj.accounting(state, ds)["skipped"] == 4
    _, resumed, _, reports = run_global(ds, 4, process_count=4, state=state)
    assert_batches_equal(resumed, whole[5:9])
    assert reports[-1]["steps"] == 5 and reports[-1]["skipped"] == 4
    with_workers = iter(zj.Loader(ds, num_workers=2))
    try:
        with_workers.set_state(state)
        with_workers.skip(1)
        assert_batches_equal([next(with_workers)], [whole[6]])
    finally:
        with_workers.close()


def test_skip_rejects_bad_counts():
    it = iter(zj.Loader(mixed("pack")))
    for bad in (-1, 1.5, True):
        with pytest.raises(zj.PipelineError, match="skip"):
            it.skip(bad)


def test_explain_command_accepts_a_skipped_state(tmp_path, monkeypatch, capsys):
    import sys

    from zephon_jax.tools.cli import main

    (tmp_path / "skip_pipeline.py").write_text(
        "import numpy as np\nimport zephon_jax as zj\n\n"
        "def pipeline():\n"
        "    docs = [{'tokens': np.arange(i % 9 + 3, dtype=np.int32)} for i in range(50)]\n"
        "    return zj.Dataset.source(docs, name='d').shuffle(2).split(8).pack(8).batch(4)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("skip_pipeline", None)
    import skip_pipeline

    ds = skip_pipeline.pipeline()
    it = iter(zj.Loader(ds))
    next(it)
    it.skip(3)
    zj.save_state(it.get_state(), tmp_path / "state.zjs")
    common = ["explain", "skip_pipeline:pipeline", "--step", "5", "--row", "1"]
    assert main(common) == 0
    plain = capsys.readouterr().out.split("\n", 1)
    assert main(common + ["--state", str(tmp_path / "state.zjs")]) == 0
    resumed = capsys.readouterr().out.split("\n", 1)
    assert "from the state at step 4, a run that skipped 3 batches" in resumed[0]
    assert "the state's accounting: 1 batches delivered, 3 skipped, to step 4" in resumed[1]
    assert resumed[1].split("the state's accounting")[0] == plain[1]
    report = zj.accounting(zj.load_state(tmp_path / "state.zjs"), ds)
    figures = report["sources"]["d"]
    assert (
        f"source 0 (d): {figures['tokens']} tokens, {figures['segments']} segments" in (resumed[1])
    )


# ----- excluding ----------------------------------------------------------------------------


def _runs_without(ds, steps: int, state, excluded) -> list:
    """The batches of ``steps`` global steps from ``state`` on 1 process, 4 processes and
    1 process with 2 workers, none of whose rows holds an ``excluded`` record."""
    runs = []
    for processes, kw in ((1, {}), (4, {}), (1, {"num_workers": 2})):
        its, batches, provenance, _ = run_global(ds, steps, processes, state=state, **kw)
        for it in its:
            getattr(it, "close", lambda: None)()
        for step in provenance:
            assert not _records(step) & set(excluded)
        runs.append(batches)
    return runs


def _records(provenance) -> set:
    return {(s["label"], s["record"]) for row in provenance for s in row}


def _later_documents(ds, state, steps):
    """The (label, record) pairs of the batches right after ``state``, uninterrupted."""
    _, _, provenance, _ = run_global(ds, steps, state=state)
    return [_records(p) for p in provenance]


@pytest.mark.parametrize("kind", ["pack", "stages", "window", "columns", "records", "concat"])
def test_excluded_records_never_appear_again_on_any_topology(kind):
    ds = mixed(kind)
    t, after = 3, 6
    _, whole, _, _ = run_global(ds, t + after)
    its = run_global(ds, t)[0]
    state = its[0].get_state()
    # Records of the next batch are in flight (held by pack, window_shuffle or pending
    # rows) or read next; one of a later batch is read from the sampler later.
    soon = _later_documents(ds, state, after)
    excluded = sorted(soon[0])[:3] + sorted(soon[3] - soon[0])[:1]
    cut = zj.exclude(state, excluded)
    runs = _runs_without(ds, after, cut, excluded)
    assert_batches_equal(runs[1], runs[0])
    assert_batches_equal(runs[2], runs[0])
    # The exclusion changed what follows (the records were due), not what came before.
    assert any(
        not np.array_equal(np.asarray(a["tokens"]), np.asarray(b["tokens"]))
        for a, b in zip(runs[0], whole[t:])
    )
    assert_batches_equal(run_global(ds, t)[1], whole[:t])


def test_exclusions_accumulate_and_survive_resumes_and_files(tmp_path):
    ds = mixed("pack")
    state = run_global(ds, 2)[0][0].get_state()
    first = sorted(_later_documents(ds, state, 1)[0])[:2]
    state = zj.exclude(state, first)
    its, _, _, _ = run_global(ds, 3, process_count=2, state=state)
    later = zj.merge_states([it.get_state() for it in its])
    assert sorted(map(tuple, later["exclude"])) == sorted(first)  # kept in later states
    second = sorted(_later_documents(ds, later, 1)[0])[:2]
    both = zj.exclude(later, second)
    assert sorted(map(tuple, both["exclude"])) == sorted(set(first) | set(second))
    zj.save_state(both, tmp_path / "cut.zjs")
    loaded = zj.load_state(tmp_path / "cut.zjs")
    _, batches, provenance, _ = run_global(ds, 5, process_count=4, state=loaded)
    for step in provenance:
        assert not _records(step) & (set(first) | set(second))
    again = run_global(ds, 5, state=both)[1]
    assert_batches_equal(batches, again)


def test_an_excluded_state_restores_only_into_its_pipeline():
    ds = mixed("pack")
    state = zj.exclude(run_global(ds, 2)[0][0].get_state(), [("a", 3), (1, 4)])
    iter(zj.Loader(ds)).set_state(state)  # the same pipeline: no mismatch
    with pytest.raises(zj.StateMismatchError):
        iter(zj.Loader(mixed("split"))).set_state(state)
    with pytest.raises(zj.StateError, match="names none"):
        iter(zj.Loader(ds)).set_state(zj.exclude(state, [("nope", 1)]))


def test_exclude_rejects_bad_documents():
    state = run_global(mixed("pack"), 1)[0][0].get_state()
    for bad in ([("a",)], [("a", -1)], [(1.5, 2)], "a"):
        with pytest.raises(zj.PipelineError, match="exclude"):
            zj.exclude(state, bad)
    altered = dict(state, exclude=[["a", "x"]])
    with pytest.raises(zj.StateError, match="exclude"):
        iter(zj.Loader(mixed("pack"))).set_state(altered)


def test_an_orbax_checkpoint_keeps_the_exclusion(tmp_path):
    import orbax.checkpoint as ocp

    import zephon_jax.checkpoint as zc

    ds = mixed("pack")
    state = run_global(ds, 2)[0][0].get_state()
    excluded = sorted(_later_documents(ds, state, 1)[0])[:2]
    it = iter(zj.Loader(ds))
    it.set_state(zj.exclude(state, excluded))
    next(it)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(3, args=ocp.args.Composite(data=zc.Save(it)))
        mngr.wait_until_finished()
    want = [next(it) for _ in range(3)]
    assert sorted(map(tuple, zj.load_state(tmp_path / "ckpt" / "3")["exclude"])) == excluded
    restored = iter(zj.Loader(ds, process_index=1, process_count=2))
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.restore(3, args=ocp.args.Composite(data=zc.Restore(restored)))
    other = iter(zj.Loader(ds, process_index=0, process_count=2))
    other.set_state(zj.load_state(tmp_path / "ckpt" / "3"))
    got = [concat_parts([next(other), next(restored)]) for _ in range(3)]
    assert_batches_equal(got, want)
    assert sorted(map(tuple, restored.get_state()["exclude"])) == excluded


def test_skip_and_exclude_under_jax_on_two_processes(tmp_path, monkeypatch):
    """A state with an exclusion, restored under jax.distributed on 2 processes x 2 devices
    (device prefetch), skipped, run on: the same rows and merged accounting as one
    numpy process."""
    import mp_worker as worker

    from integration.test_multiprocess import launch

    # The processes import this checkout's zephon_jax, whatever is installed.
    root = str(Path(zj.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))

    ds = worker.make_pipeline()
    it = iter(zj.Loader(ds))
    for _ in range(4):
        next(it)
    state = it.get_state()
    soon = [_records(p) for p in run_global(ds, 4, state=state)[2]]
    cut = zj.exclude(state, sorted(soon[0])[:2] + sorted(soon[3])[:1])
    zj.save_state(cut, tmp_path / "cut.zjs")
    steps = 12
    one = iter(zj.Loader(ds))
    one.set_state(cut)
    one.skip(2)
    reference = [worker.batch_digests(next(one)) for _ in range(7, steps + 1)]
    flags = [f"--from-state={tmp_path / 'cut.zjs'}", "--skip=2", f"--steps={steps}"]
    reports = launch(tmp_path, "cut", 2, 2, "data=4", "data", *flags)
    for step, want in zip(range(7, steps + 1), reference):
        seen: dict[int, set] = {}
        for report in reports:
            for row, digests in report["runs"]["from_state"][str(step)].items():
                seen.setdefault(int(row), set()).update(digests)
        assert seen == {r: {d} for r, d in enumerate(want)}, f"step {step}"
    merged = zj.merge_accounting([r["accounting"] for r in reports])
    assert merged == one.accounting()
    assert merged["skipped"] == 2 and merged["step"] == steps


def test_explain_step_follows_an_excluded_skipped_state():
    ds = mixed("pack")
    state = run_global(ds, 2)[0][0].get_state()
    cut = zj.exclude(state, sorted(_later_documents(ds, state, 1)[0])[:2])
    it = iter(zj.Loader(ds))
    it.set_state(cut)
    it.skip(1)
    later = it.get_state()
    for _ in range(2):
        next(it)
    assert zj.explain_step(ds, 4, state=later) == it.provenance()
    assert zj.explain_step(ds, 4, state=cut) == it.provenance()


# ----- excluding under pack(method="concat") ------------------------------------------------


def _concat_pipeline(split: bool) -> zj.BatchedDataset:
    """One lane of concat-packed rows of 4 tokens; record ``i``'s tokens are ``1000 * i + k``."""
    lengths = [5, 7, 3, 9, 4, 6, 8, 5, 7, 3, 6, 5, 9, 4, 6, 7, 5, 8, 3, 6, 2] * 5
    docs = [
        {"tokens": np.arange(1000 * i, 1000 * i + n, dtype=np.int32)} for i, n in enumerate(lengths)
    ]
    ds = zj.Dataset.source(docs, name="d")
    if split:
        ds = ds.split(3)
    return ds.pack(4, method="concat").batch(4, num_lanes=1)


def _token_stream(batches) -> np.ndarray:
    return np.concatenate([np.asarray(b["tokens"]).ravel() for b in batches])


def _open_row_neighbour(state, num_operators: int, rows: list) -> int:
    """The record that ends in the lane's last finished row, next to the start of the
    record the state's open row continues (``rows``: the uninterrupted rows after it)."""
    snapshot = decode_lane_state(0, lane_bytes(state, 0), num_operators)
    assert snapshot.carries[-1][0], "the open row holds the rest of a record"
    last, carried = rows[len(snapshot.pending) - 1], rows[len(snapshot.pending)]
    assert last[-1]["record"] == carried[0]["record"] != last[0]["record"]
    return last[0]["record"]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("which", ["continued", "inside", "several", "before_open_row"])
def test_excluding_under_concat_keeps_the_stream_in_order(split, which):
    """After an exclusion, concat's rows are the uninterrupted token stream without the
    excluded records' tokens, cut again: the pieces of a dropped row come back before
    what the open row and the later rows hold, on any topology and worker count."""
    ds = _concat_pipeline(split)
    t, after = 2, 8
    state = run_global(ds, t)[0][0].get_state()
    _, whole, provenance, _ = run_global(ds, after, state=state)
    rows = [row for step in provenance for row in step]
    # Records whose end shares a row with the start of the next one (the first one
    # started before the state: the state's first row continues it).
    shared = [row[0]["record"] for row in rows if row[0]["record"] != row[-1]["record"]]
    records = {
        "continued": [shared[0]],
        "inside": [shared[1]],
        "several": [shared[0], shared[3], shared[4]],
        "before_open_row": [_open_row_neighbour(state, 1 + split, rows)],
    }[which]
    excluded = [("d", record) for record in records]
    cut = zj.exclude(state, excluded)
    stream = _token_stream(whole)
    want = stream[~np.isin(stream // 1000, records)]
    runs = _runs_without(ds, after, cut, excluded)
    got = _token_stream(runs[0])
    np.testing.assert_array_equal(got[: len(want)], want)
    assert_batches_equal(runs[1], runs[0])
    assert_batches_equal(runs[2], runs[0])


# ----- excluding after a finite input ended -------------------------------------------------


def _finite_pipeline(method: str, seed: int) -> zj.BatchedDataset:
    """Two lanes of one row each over 16 short records read once; record ``i``'s tokens
    are ``1000 * i + k``. Concat's operators before it hold pieces (window_shuffle), so
    its end, too, leaves finished rows to deliver."""
    lengths = np.random.default_rng(seed).integers(2, 10, 16).tolist()
    docs = [
        {"tokens": np.arange(1000 * i, 1000 * i + n, dtype=np.int32)} for i, n in enumerate(lengths)
    ]
    ds = zj.Dataset.source(docs, name="d").repeat(1).split(6)
    if method == "concat":
        return ds.window_shuffle(6, seed=1).pack(8, method="concat").batch(2)
    return ds.pack(8, num_bins=2, method=method).batch(2)


def _run_to_end(ds, state=None, **kw) -> tuple[list, list, list, dict]:
    """Every global batch to the end of the input, its provenance, the state after
    each and the accounting of the last state, from ``state`` (on 1 or ``process_count``
    processes)."""
    count = kw.pop("process_count", 1)
    its = [iter(zj.Loader(ds, process_index=i, process_count=count, **kw)) for i in range(count)]
    try:
        if state is not None:
            for it in its:
                it.set_state(state)
        batches, provenance, states = [], [], []
        while True:
            try:
                parts = [next(it) for it in its]
            except StopIteration:
                return batches, provenance, states, zj.accounting(states[-1], ds)
            batches.append(concat_parts(parts))
            provenance.append([row for it in its for row in it.provenance()])
            states.append(zj.merge_states([it.get_state() for it in its]))
    finally:
        for it in its:
            getattr(it, "close", lambda: None)()


def _ended_with_a_shared_row(method: str):
    """``(ds, t, state, record)``: a state after step ``t`` of a lane whose input ended
    (its operators flushed) with a finished row not yet delivered that holds ``record``
    and another record."""
    for seed in range(40):
        ds = _finite_pipeline(method, seed)
        _, provenance, states, _ = _run_to_end(ds)
        plan = LanePlan(ds)
        for t, state in enumerate(states[:-1]):
            for lane in range(ds.num_lanes):
                snapshot = Lane(plan, lane).check_state(lane_bytes(state, lane))
                if not (snapshot.input_done and snapshot.pending):
                    continue
                row = provenance[t + 1][lane]  # its next row: its first unbatched one
                records = sorted({s["record"] for s in row})
                if len(records) > 1:
                    return ds, t + 1, state, records[0]
    raise AssertionError("no pipeline ended with a shared unbatched row")


def _pieces(provenance, without: int) -> list:
    return sorted(
        (s["record"], k)
        for step in provenance
        for row in step
        for s in row
        if s["record"] != without
        for k in range(s["start"], s["stop"])
    )


@pytest.mark.parametrize("method", ["first_fit", "best_fit", "concat"])
def test_excluding_after_the_input_ended_delivers_the_other_pieces(method):
    """A state taken after a lane's finite input ended (its operators flushed), restored
    without a record of an unbatched row: the row's other pieces are flushed again and
    delivered, the same on any topology and worker count."""
    ds, t, state, record = _ended_with_a_shared_row(method)
    whole, provenance, _, _ = _run_to_end(ds)
    excluded = [("d", record)]
    cut = zj.exclude(state, excluded)
    runs = []
    for kw in ({}, {"process_count": 2}, {"num_workers": 2}):
        batches, got, _, report = _run_to_end(ds, cut, **kw)
        assert not any(_records(step) & set(excluded) for step in got)
        runs.append((batches, got, report))
    batches, got, report = runs[0]
    if method == "concat":  # each lane's stream (row l of a batch) less the record, in order
        for lane in range(ds.num_lanes):
            stream = np.concatenate([np.asarray(b["tokens"])[lane] for b in whole[t:]])
            want = stream[(stream // 1000 != record) & (stream != 0)]  # 0: padding too
            tokens = np.concatenate([np.asarray(b["tokens"])[lane] for b in batches])
            np.testing.assert_array_equal(tokens[tokens != 0], want)
    else:
        assert _pieces(got, record) == _pieces(provenance[t:], record)
    for other, _, other_report in runs[1:]:
        assert_batches_equal(other, batches)
        assert other_report == report
