"""``TokenArray`` sources read column-wise and packed by compiled kernels: the same batches,
lane states and provenance as the general path, on every topology, worker count and resume."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from pipelines import (
    assert_batch_equal,
    assert_batches_equal,
    kernels_set,
    resume_across,
    run_topology,
    tag_compiled,
    take,
)

import zephon_jax as zj
from zephon_jax.core import kernels as kernels_module
from zephon_jax.core import permutation
from zephon_jax.core.lineage import code_position
from zephon_jax.engine import accounting, blocks, columns
from zephon_jax.engine.lane import LanePlan
from zephon_jax.operators import token_bins
from zephon_jax.sampler import scheduled_mixture
from zephon_jax.sources import TokenArray
from zephon_jax.sources.token_store import TokenStore, TokenStoreWriter
from zephon_jax.state.global_state import lane_bytes
from zephon_jax.state.lane_format import encode_lane_state


def _documents(seed: int, num: int = 300, sigma: float = 1.2, longest: int = 400) -> list:
    """Lognormal lengths, some several rows long, some empty."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(num):
        n = 0 if i % 31 == 0 else int(min(rng.lognormal(3.2, sigma), longest))
        docs.append(rng.integers(1, 30_000, n).astype(np.uint16))
    return docs


TOKENS = TokenArray.from_documents(_documents(0))
SHORT = TokenArray.from_documents(_documents(1, num=200, sigma=0.5), dtype=np.uint16)
FEW = TokenArray.from_documents(_documents(2, num=20), dtype=np.uint16)
# Tokens in uint32, which to_training's int32 fields do not always hold: packed as int64, the
# gather does not shift them (see ToTrainingTransform.fused_pad).
WIDE = TokenArray.from_documents(_documents(3), dtype=np.uint32)


def _mixture(epochs: int | None = None) -> zj.Dataset:
    """Three token arrays mixed by records; the smallest runs out after two epochs (its
    positions are then skipped), the others repeat."""
    parts = [zj.Dataset.source(TOKENS), zj.Dataset.source(SHORT), zj.Dataset.source(FEW).repeat(2)]
    if epochs is not None:
        parts = [p.repeat(epochs) for p in parts[:2]] + parts[2:]
    return zj.Dataset.mix(parts, [0.5, 0.3, 0.2])


def _pipeline(
    source=TOKENS,
    method="best_fit",
    cut: int | None = 48,
    seq_len: int = 48,
    num_bins: int | None = 5,
    max_segments=None,
    batch: int = 8,
    num_lanes: int | None = None,
    epochs: int | None = None,
    mix: bool = False,
    training: dict | None = None,
    dtypes: dict | None = None,
) -> zj.BatchedDataset:
    if mix:
        ds = _mixture(epochs).shuffle(seed=3)
    else:
        ds = zj.Dataset.source(source).shuffle(seed=3)
        if epochs is not None:
            ds = ds.repeat(epochs)
    if cut is not None:
        ds = ds.split(cut)
    ds = ds.pack(
        seq_len, method=method, num_bins=num_bins, max_segments=max_segments, dtypes=dtypes
    )
    if training is not None:
        ds = ds.to_training(**training)
    return ds.batch(batch, num_lanes=num_lanes)


@pytest.fixture
def general():
    """``general()``: no compiled kernels from then on (every lane takes the general
    path), ``general(False)``: the kernels again; the test's end restores the choice
    made before it."""

    def switch(off: bool = True):
        zj.set_compiled(not off)

    with kernels_set(None):
        yield switch


def _run(ds, steps: int, state=None) -> list:
    """Batches, each lane's state bytes and the provenance after each step."""
    it = iter(zj.Loader(ds))
    if state is not None:
        it.set_state(state)
    out = []
    for batch in it:
        state = it.get_state()
        lanes = [lane_bytes(state, lane) for lane in range(ds.num_lanes)]
        out.append((batch, lanes, it.provenance(), state))
        if len(out) == steps:
            break
    return out


def _assert_same_runs(got: list, want: list) -> None:
    assert len(got) == len(want)
    assert_batches_equal([g[0] for g in got], [w[0] for w in want])
    for step, (g, w) in enumerate(zip(got, want)):
        assert g[1] == w[1], f"step {step}: lane states differ"
        assert g[2] == w[2], f"step {step}: provenance differs"


def test_the_tests_have_the_compiled_kernels():
    """The ``test`` extra installs numba: the column-wise path is what these tests run."""
    assert kernels_module.compiled_setting() is None  # the default
    assert kernels_module.kernels() is not None
    assert LanePlan(_pipeline()).columnar is not None


CASES = {
    "best_fit": {},
    "first_fit": {"method": "first_fit"},
    "short pieces, 3 segments": {"cut": 20, "max_segments": 3, "num_lanes": 2},
    "cut 7, one lane": {"cut": 7, "method": "first_fit", "num_lanes": 1},
    "many rows per lane": {"num_bins": 70, "method": "first_fit", "num_lanes": 4},
    "many rows, best_fit": {"num_bins": 70, "num_lanes": 1},
    "one row": {"num_bins": 1, "max_segments": 2},
    "default rows": {"num_bins": None, "seq_len": 256, "cut": 256},
    "finite": {"epochs": 1, "num_lanes": 2, "batch": 4},
    "mixture": {"mix": True},
    "mixture, first fit, short pieces": {"mix": True, "method": "first_fit", "cut": 16},
    "finite mixture": {"mix": True, "epochs": 1, "num_lanes": 2, "batch": 4},
    "to_training": {"training": {}},
    "to_training, a pad id, no split": {"training": {"pad_id": 5}, "cut": None, "seq_len": 400},
    "to_training, tokens int32 may not hold": {
        "training": {"pad_id": 3},
        "source": WIDE,
        "dtypes": {"tokens": np.int64},
    },
    "to_training, MaxText's names": {"training": {"field_names": "maxtext"}, "cut": 20},
    "to_training, MaxText's convention": {
        "training": {"pad_id": 7, "convention": "maxtext"},
        "method": "first_fit",
        "num_lanes": 2,
    },
    "to_training, MaxText's names and convention, mixture": {
        "training": {"field_names": "maxtext", "convention": "maxtext"},
        "mix": True,
        "epochs": 1,
        "batch": 4,
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_batches_states_and_provenance_equal_the_general_path(general, case):
    ds = _pipeline(**CASES[case])
    compiled = _run(ds, 40)
    saved = compiled[11][3]
    general()
    assert LanePlan(ds).columnar is None
    want = _run(ds, 40)
    _assert_same_runs(compiled, want)
    assert len(want) > 12
    # A state from the general path restores on the column-wise path and back.
    from_general = want[17][3]
    general(False)
    assert LanePlan(ds).columnar is not None
    _assert_same_runs(_run(ds, len(want) - 18, from_general), want[18:])
    general()
    _assert_same_runs(_run(ds, len(want) - 12, saved), want[12:])


def _sparse_run(ds, steps: int, looked: set, skipped: int) -> tuple[list, list]:
    """The batches of ``steps`` steps, and the state and provenance only after the
    steps ``looked`` (skipping ``skipped`` batches after the first look)."""
    it = iter(zj.Loader(ds))
    batches, looks = [], []
    for step in range(steps):
        batches.append(next(it))
        if step in looked:
            looks.append((it.get_state(), it.provenance()))
            if len(looks) == 1:
                it.skip(skipped)
    return batches, looks


@pytest.mark.parametrize("mix", [False, True])
def test_rows_taken_for_the_lanes_over_many_steps_settle_exactly(general, monkeypatch, mix):
    """The producer takes the column-wise lanes' rows for them, all together, step after
    step (see zephon_jax.engine.front_rows); what the lanes owe then settles when a state
    or a skip reads them. Batches, sparse states and provenance equal the general path's,
    through a batch-size ramp."""
    from zephon_jax.engine import front_rows

    together = []
    take = front_rows.FrontRows.take
    monkeypatch.setattr(
        front_rows.FrontRows,
        "take",
        lambda self, n, picks: together.append(n) or take(self, n, picks),
    )
    ds = _pipeline(mix=mix, batch={0: 4, 6: 8, 20: 16}, num_lanes=4)
    looked = {11, 30, 44}
    got = _sparse_run(ds, 45, looked, skipped=3)
    assert len(together) == 45 and set(together) == {1, 2, 4}  # (skips take lane by lane)
    general()
    want = _sparse_run(ds, 45, looked, skipped=3)
    assert_batches_equal(got[0], want[0])
    for (state, provenance), (want_state, want_provenance) in zip(got[1], want[1], strict=True):
        assert [lane_bytes(state, lane) for lane in range(4)] == [
            lane_bytes(want_state, lane) for lane in range(4)
        ]
        assert provenance == want_provenance


def test_whole_documents_without_split(general):
    docs = [d[:48] for d in _documents(1)]
    ds = _pipeline(TokenArray.from_documents(docs), cut=None, num_bins=3, epochs=2, num_lanes=2)
    assert LanePlan(ds).columnar is not None
    compiled = _run(ds, 500)
    general()
    assert LanePlan(ds).columnar is None
    want = _run(ds, 500)
    _assert_same_runs(compiled, want)
    assert 10 < len(want) < 500  # the input ended, and the open rows were flushed


def test_rows_of_many_pieces_and_calls_emitting_many_rows(general):
    """Documents of one token fill rows of 64 pieces (the piece arrays grow); documents of
    hundreds of pieces emit dozens of rows in one kernel call (the output grows)."""
    docs = [np.arange(1, 2, dtype=np.int32)] * 200 + [np.arange(1, 900, dtype=np.int32)] * 5
    source = TokenArray.from_documents(docs)
    for cut, seq_len in ((64, 64), (4, 64)):
        ds = _pipeline(source, cut=cut, seq_len=seq_len, num_bins=4, num_lanes=1, batch=4)
        general(False)
        compiled = _run(ds, 60)
        general()
        want = _run(ds, 60)
        _assert_same_runs(compiled, want)
    assert max(compiled[0][0]["tokens_segment_ids"].max(axis=1)) > 8


@pytest.mark.parametrize("process_count", [2, 4])
def test_processes_and_resumes_on_other_topologies(general, process_count):
    ds = _pipeline(batch=16)
    single = take(iter(zj.Loader(ds)), 14)
    assert_batches_equal(run_topology(ds, process_count, 14), single)
    assert_batches_equal(resume_across(ds, 14, 6, process_count, 1), single[6:])
    general()
    assert_batches_equal(take(iter(zj.Loader(ds)), 14), single)


def test_workers_give_the_same_batches_and_states(general):
    ds = _pipeline(batch=8)
    it = iter(zj.Loader(ds, num_workers=2))
    try:
        got = [(next(it), it.get_state()) for _ in range(12)]
    finally:
        it.close()
    general()
    want = _run(ds, 12)
    assert_batches_equal([b for b, _ in got], [w[0] for w in want])
    for (_, state), w in zip(got, want):
        assert [lane_bytes(state, lane) for lane in range(ds.num_lanes)] == w[1]


def test_loader_workers_follow_set_compiled():
    """A loader worker, a fresh process, runs the kernels as the loader that started it
    chose: interpreted after ``set_compiled(False)``, compiled by default."""
    ds = zj.Dataset.source([{"x": np.zeros(1)}] * 8).map(tag_compiled).batch(4)
    for enabled, want in ((False, 0), (None, 1)):
        with kernels_set(enabled):
            it = iter(zj.Loader(ds, num_workers=1))
        try:
            batch = next(it)
        finally:
            it.close()
        assert np.asarray(batch["compiled"]).tolist() == [[want]] * 4, enabled


def test_device_arrays_with_prefetch(sharding):
    ds = _pipeline(batch=8)
    want = take(iter(zj.Loader(ds)), 10)
    it = iter(zj.Loader(ds, sharding=sharding, device_prefetch=2))
    for step in range(10):
        assert_batch_equal(next(it), want[step])


def test_pipelines_it_does_not_take_run_the_general_path():
    floats = TokenArray(TOKENS.tokens.astype(np.float32), TOKENS.offsets)
    assert LanePlan(_pipeline(floats)).columnar is None  # the general path checks each value
    mapped = zj.Dataset.source(TOKENS).map(lambda r: r).split(48).pack(48).batch(8)
    assert LanePlan(mapped).columnar is None
    parts = [zj.Dataset.source(TOKENS), zj.Dataset.source(SHORT)]
    by_tokens = zj.Dataset.mix(parts, [1, 1], unit="tokens")  # drawn lane by lane
    assert LanePlan(by_tokens.split(48).pack(48).batch(8)).columnar is not None
    mapped_mix = zj.Dataset.mix([p.map(lambda r: r) for p in parts], [1, 1], unit="tokens")
    assert LanePlan(mapped_mix.split(48).pack(48).batch(8)).columnar is None
    staged = zj.Dataset.mix(parts, {0: [1, 1], 5: [1, 2]})
    assert LanePlan(staged.split(48).pack(48).batch(8)).columnar is not None
    assert LanePlan(zj.Dataset.mix(parts, [1, 1]).split(48).pack(48).batch(8)).columnar
    wide = TokenArray(SHORT.tokens.astype(np.int32), SHORT.offsets)  # another dtype
    mixed = zj.Dataset.mix([zj.Dataset.source(TOKENS), zj.Dataset.source(wide)], [1, 1])
    assert LanePlan(mixed.split(48).pack(48).batch(8)).columnar is None
    assert LanePlan(_pipeline(cut=None)).columnar is None  # documents longer than rows
    with pytest.raises(zj.PipelineError, match="add .split"):
        next(iter(zj.Loader(_pipeline(cut=None))))
    windowed = zj.Dataset.source(TOKENS).split(48).pack(48).window_shuffle(2, seed=0).batch(8)
    assert LanePlan(windowed).columnar is None
    shifted = zj.Dataset.source(TOKENS).split(48).pack(48).to_training()
    assert LanePlan(shifted.batch(8)).columnar is not None
    assert LanePlan(shifted.map(lambda r: r).batch(8)).columnar is None  # a map after it
    narrow = zj.Dataset.source(wide).split(48).pack(48, dtypes={"tokens": np.int16})
    assert LanePlan(narrow.to_training().batch(8)).columnar is None  # values checked first


def test_packed_row_read_alone_equals_its_batch_row():
    it = iter(zj.Loader(_pipeline()))
    next(it)
    lane = it._producer.lanes[0]
    row = next(iter(lane.pending)).data if lane.pending else lane.take(1)[0].data
    assert isinstance(row, token_bins.TokenRow)
    alone = dict(row)
    general = token_bins.PackedRow(row.spec, row.fields, row.pieces, row.lengths).to_dict()
    assert list(alone) == list(general)
    for key in general:
        assert alone[key].dtype == general[key].dtype
        assert alone[key].tobytes() == general[key].tobytes()


def test_compiled_permutation_equals_numpy():
    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 17, 1000, 123_457, 2**40 + 7):
        for key in (0, 1, 2**63 + 5, 987_654_321):
            x = rng.integers(0, min(n, 2**40), 2000)
            with kernels_set(True):
                compiled = permutation.permute(x, n, key)
            with kernels_set(False):
                want = permutation.permute(x, n, key)
            assert compiled.dtype == want.dtype == np.int64
            assert np.array_equal(compiled, want), (n, key)
    grid = np.arange(12).reshape(3, 4) % 10
    assert permutation.permute(grid, 10, 3).shape == (3, 4)
    assert sorted(permutation.permute(np.arange(1000), 1000, 9)) == list(range(1000))


def test_environment_turns_the_kernels_off():
    code = "from zephon_jax.core.kernels import kernels; print(kernels() is None)"
    env = dict(os.environ, ZEPHON_JAX_COMPILED="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr


def test_token_array_records_and_checks():
    docs = [np.arange(n, dtype=np.int32) for n in (3, 0, 5)]
    source = TokenArray.from_documents(docs)
    assert len(source) == 3 and source.longest == 5
    assert [len(r["tokens"]) for r in source.__getitems__([2, 1, 0])] == [5, 0, 3]
    record = source[2]["tokens"]
    assert np.shares_memory(record, source.tokens) and not record.flags.writeable
    assert np.array_equal(record, np.arange(5))
    with pytest.raises(IndexError):
        source[3]
    copy = pickle.loads(pickle.dumps(source))
    assert copy.fingerprint() == source.fingerprint() and np.array_equal(copy.tokens, source.tokens)
    assert TokenArray(source.tokens, [0, 8, 8]).fingerprint() != source.fingerprint()
    tokens = np.arange(8, dtype=np.int32)
    for offsets, match in (
        ([1, 3, 8], "start at 0"),
        ([0, 3, 7], "end at len"),
        ([0, 5, 3, 8], "must not decrease"),
        ([[0, 8]], "1-D integer"),
    ):
        with pytest.raises(zj.PipelineError, match=match):
            TokenArray(tokens, offsets)
    with pytest.raises(zj.PipelineError, match="1-D array of numbers"):
        TokenArray(tokens.reshape(2, 4), [0, 1])


def test_mapped_tokens_travel_as_their_file_to_workers(tmp_path, general):
    path = tmp_path / "tokens.npy"
    np.save(path, TOKENS.tokens)
    mapped = TokenArray(np.load(path, mmap_mode="r")[:], TOKENS.offsets)
    for tokens in (mapped.tokens, mapped.tokens[7:]):
        source = TokenArray(tokens, [0, 3, len(tokens)])
        payload = pickle.dumps(source)
        assert len(payload) < 1000  # the file's name, not its tokens
        copy = pickle.loads(payload)
        assert isinstance(copy.tokens, np.memmap) and np.array_equal(copy.tokens, tokens)
    ds = _pipeline(mapped, batch=8)
    assert LanePlan(ds).columnar is not None
    it = iter(zj.Loader(ds, num_workers=2))
    try:
        got = take(it, 8)
    finally:
        it.close()
    general()
    assert_batches_equal(got, take(iter(zj.Loader(_pipeline(batch=8))), 8))


def test_token_store_read_into_a_token_array(tmp_path):
    docs = _documents(2, num=60)
    store = zj.sources.write_token_store(tmp_path / "store", docs, dtype="uint16")
    tokens = store.to_token_array()
    assert len(tokens) == len(store) == 60
    assert tokens.tokens.dtype == np.uint16
    for i in (0, 1, 31, 59):
        assert np.array_equal(tokens[i]["tokens"], store[i]["tokens"])
    ds = _pipeline(tokens, batch=4)
    assert LanePlan(ds).columnar is not None
    assert_batches_equal(
        take(iter(zj.Loader(ds)), 6), take(iter(zj.Loader(_pipeline(store, batch=4))), 6)
    )


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_tokens_the_output_dtype_may_not_hold_are_checked(general, dtype):
    """uint32 or int64 tokens into int32 rows: the same batches; a token above 2**31 - 1
    raises the general path's error, naming the field and the fix."""
    wide = TokenArray(TOKENS.tokens.astype(dtype), TOKENS.offsets)
    assert LanePlan(_pipeline(wide)).columnar is not None
    want = take(iter(zj.Loader(_pipeline())), 6)
    assert_batches_equal(take(iter(zj.Loader(_pipeline(wide))), 6), want)
    tokens = wide.tokens.copy()
    tokens[:] = 2**31  # every document holds a token int32 cannot hold
    errors = []
    for off in (False, True):
        general(off)
        with pytest.raises(zj.PipelineError, match="cannot hold exactly") as raised:
            next(iter(zj.Loader(_pipeline(TokenArray(tokens, wide.offsets)))))
        errors.append(str(raised.value))
    assert errors[0] == errors[1]


def test_a_mixture_of_mapped_and_in_memory_arrays(tmp_path, general):
    path = tmp_path / "short.npy"
    np.save(path, SHORT.tokens)
    mapped = TokenArray(np.load(path, mmap_mode="r"), SHORT.offsets)
    ds = (
        zj.Dataset.mix([zj.Dataset.source(mapped), zj.Dataset.source(SHORT)], [1, 2])
        .shuffle(seed=1)
        .split(48)
        .pack(48)
        .batch(8)
    )
    assert LanePlan(ds).columnar is not None
    compiled = _run(ds, 15)
    general()
    _assert_same_runs(compiled, _run(ds, 15))


def _write_stores(directory, compression=None) -> list:
    """Two token stores: TOKENS' and SHORT's documents."""
    return [
        zj.sources.write_token_store(
            directory / name, list(source), dtype="uint16", compression=compression
        )
        for name, source in (
            ("a", [TOKENS[i]["tokens"] for i in range(len(TOKENS))]),
            ("b", [SHORT[i]["tokens"] for i in range(len(SHORT))]),
        )
    ]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two plain token stores (read where their shard files are mapped)."""
    return _write_stores(tmp_path_factory.mktemp("stores"))


@pytest.fixture(scope="module")
def zstd_stores(tmp_path_factory):
    """The same two stores compressed (read through TensorStore into arrays)."""
    return _write_stores(tmp_path_factory.mktemp("zstd_stores"), "zstd")


@pytest.mark.parametrize("training", [None, {"field_names": "maxtext"}])
@pytest.mark.parametrize("mix", [False, True])
@pytest.mark.parametrize("kind", ["stores", "zstd stores", "lists"])
def test_stores_and_lists_read_column_wise_equal_the_general_path(
    general, stores, zstd_stores, kind, mix, training
):
    """Token stores (placed from their offsets, read when a batch is gathered: a plain
    store's pieces where its files are mapped, a compressed store's into arrays) and
    Python lists of ``{"tokens": array}`` records (placed from their lengths, read where
    they lie when a batch is gathered), alone or mixed by records: the same batches,
    states and provenance as the general path, and states restore on either path."""
    sources = {"stores": stores, "zstd stores": zstd_stores}.get(kind) or [
        _as_list(TOKENS),
        _as_list(SHORT),
    ]
    if mix:
        source = zj.Dataset.mix([zj.Dataset.source(s) for s in sources], [0.6, 0.4])
    else:
        source = zj.Dataset.source(sources[0])
    ds = source.shuffle(seed=3).split(48).pack(48, num_bins=5)
    if training is not None:
        ds = ds.to_training(**training)
    ds = ds.batch(8, num_lanes=4)
    assert LanePlan(ds).columnar is not None
    compiled = _run(ds, 30)
    general()
    assert LanePlan(ds).columnar is None
    want = _run(ds, 30)
    _assert_same_runs(compiled, want)
    general(False)
    _assert_same_runs(_run(ds, 30 - 13, want[12][3]), want[13:])


def _as_list(tokens: TokenArray) -> list:
    """The documents of ``tokens`` as a Python list of one-field records."""
    return [{"tokens": tokens[i]["tokens"].copy()} for i in range(len(tokens))]


@pytest.mark.parametrize("kind", ["stores", "lists"])
def test_stores_and_lists_on_processes_and_workers(general, stores, kind):
    """The column path over stores or lists gives the single-process batches on 2 jax
    processes, resumed from 4 processes onto 2 and 1, with 2 workers, and on the general
    path."""
    sources = stores if kind == "stores" else [_as_list(TOKENS), _as_list(SHORT)]
    ds = (
        zj.Dataset.mix([zj.Dataset.source(s) for s in sources], [0.6, 0.4])
        .shuffle(seed=3)
        .split(48)
        .pack(48)
        .to_training()
        .batch(8)
    )
    assert LanePlan(ds).columnar is not None
    single = take(iter(zj.Loader(ds)), 10)
    assert_batches_equal(run_topology(ds, 2, 10), single)
    assert_batches_equal(resume_across(ds, 10, 4, 2, 1), single[4:])
    it = iter(zj.Loader(ds, num_workers=2))
    try:
        assert_batches_equal(take(it, 10), single)
    finally:
        it.close()
    general()
    assert_batches_equal(take(iter(zj.Loader(ds)), 10), single)


def _drawn_mixture(sources, unit: str = "tokens", cut=48, training=True, lanes=None, ramp=False):
    """Sources mixed by tokens (or records) with weights changing at steps 5 and 11;
    ``ramp``: batches of 4, then 8 from step 8, then 16 from step 15."""
    parts = [zj.Dataset.source(s) for s in sources]
    parts[-1] = parts[-1].repeat(2)  # runs out; the others repeat
    stages = {0: [0.7, 0.3], 5: [0.2, 0.8], 11: [0.5, 0.5]}
    ds = zj.Dataset.mix(parts, stages, unit=unit).shuffle(seed=5)
    if cut:
        ds = ds.split(cut)
    ds = ds.pack(48, num_bins=4)
    size = {0: 4, 8: 8, 15: 16} if ramp else 8
    return (ds.to_training() if training else ds).batch(size, num_lanes=lanes)


@pytest.mark.parametrize(
    "case",
    [
        {},
        {"unit": "records", "training": False},
        {"cut": None, "training": False, "lanes": 2},
        {"stores": True},
        {"stores": True, "cut": 20, "lanes": 8},
        {"ramp": True, "lanes": 2},
    ],
)
def test_mixtures_by_tokens_with_stages_equal_the_general_path(general, stores, monkeypatch, case):
    """A mixture drawn lane by lane (by tokens or with weight stages) over token arrays or
    stores: the same batches, states and provenance, across the stage changes, and
    states restore on either path."""
    case = dict(case)
    if case.pop("stores", False):
        sources = stores
    elif case.get("cut", 48) is None:
        sources = [TokenArray.from_documents([d[:48] for d in _documents(k)]) for k in (1, 2)]
    else:
        sources = [TOKENS, SHORT]
    ds = _drawn_mixture(sources, **case)
    assert LanePlan(ds).columnar is not None
    compiled = _run(ds, 30)
    general()
    assert LanePlan(ds).columnar is None
    want = _run(ds, 30)
    _assert_same_runs(compiled, want)
    general(False)
    _assert_same_runs(_run(ds, 30 - 10, want[9][3]), want[10:])
    general()
    _assert_same_runs(_run(ds, 30 - 7, compiled[6][3]), want[7:])


@pytest.mark.parametrize("path", ["columns", "general"])
def test_drawing_the_next_steps_rows_ahead_changes_no_row(general, monkeypatch, path):
    """A take of a mixture lane draws the rows of the next steps in its stage too (up to
    ``draw_ahead`` rows, whole steps): the batches are those of drawing one step at a
    time, across the stage changes (steps 5 and 11) and the ramp (2, 4, then 8 rows a
    lane), and a run resumed in between has them too."""
    ds = _drawn_mixture([TOKENS, SHORT], ramp=True, lanes=2)
    if path == "general":
        general()
    assert (LanePlan(ds).columnar is None) == (path == "general")

    def run():
        it = iter(zj.Loader(ds))
        batches, held = [], 0
        for _ in range(24):
            batches.append(next(it))
            held = max([held] + [len(lane.pending) for lane in it._producer.lanes.values()])
        return batches, held

    ahead, held_ahead = run()
    resumed = resume_across(ds, 24, 9, 1, 2)
    monkeypatch.setattr(blocks, "DRAW_AHEAD", 1)
    monkeypatch.setattr(blocks, "DRAW_AHEAD_MAX", 1)
    one_step, held_one_step = run()
    assert held_ahead >= 6 > held_one_step  # (rows made ahead: of 3 steps or more)
    assert_batches_equal(ahead, one_step)
    assert_batches_equal(resumed, one_step[9:])


@pytest.mark.parametrize("unit", ["tokens", "records"])
def test_a_mixture_that_never_makes_a_row_fails_alike_on_both_paths(general, unit):
    """By tokens, a component of empty documents is named once it gave no tokens too many
    times; by records, the lane's bound on draws without a row; the same words from the
    drawing kernel as from the per-record path."""
    empty = TokenArray.from_documents([np.zeros(0, np.uint16)] * 5, dtype=np.uint16)
    other = SHORT if unit == "tokens" else empty
    parts = [zj.Dataset.source(empty), zj.Dataset.source(other)]
    ds = zj.Dataset.mix(parts, [0.5, 0.5], unit=unit).split(48).pack(48).batch(4)
    assert LanePlan(ds).columnar is not None
    match = "mixture component 0 .* gave no tokens" if unit == "tokens" else "produced no row"
    messages = []
    for _ in range(2):
        with pytest.raises(zj.RecordError, match=match) as raised:
            take(iter(zj.Loader(ds)), 1)
        messages.append(str(raised.value))
        general()
    assert LanePlan(ds).columnar is None and messages[0] == messages[1]


@pytest.mark.parametrize("margin", [64, 0])
def test_drawn_roots_are_dropped_once_no_open_or_uncounted_row_holds_them(monkeypatch, margin):
    """A lane keeps only the drawn roots its open rows and the rows its accounting has
    not counted point to (memory stays bounded); the batches and the accounting do
    not depend on when it drops them. Without a margin, the kernel stops for room for
    draws just as a pass is due: the pass makes the room, and nothing else grows."""
    monkeypatch.setattr(columns, "_ROOTS_KEPT", 16)
    monkeypatch.setattr(columns, "_ROOTS_ALL_LANES", 16)
    monkeypatch.setattr(columns, "_ROOTS_MARGIN", margin)
    monkeypatch.setattr(accounting, "FOLD_ROWS", 4)
    ds = _drawn_mixture([TOKENS, SHORT], lanes=1)
    it = iter(zj.Loader(ds))
    got = take(it, 40)
    lane = it._producer.lanes[0]
    columns._prune_roots(lane, 16)  # (between takes: no draw is being placed)
    carry = lane.carries[lane.plan.columnar.stage]
    held = np.concatenate((carry.held_codes()[0], lane.tally.logged_codes()))
    assert lane.drawn.base > 100 and len(lane.drawn) == len(np.unique(code_position(held)))
    got += take(it, 10)
    monkeypatch.setattr(columns, "_ROOTS_KEPT", 1 << 30)
    monkeypatch.setattr(accounting, "FOLD_ROWS", 1024)
    kept = iter(zj.Loader(ds))
    assert_batches_equal(take(kept, 50), got)
    assert kept.accounting() == it.accounting()
    stage = lane.plan.columnar.stage
    kept_carry = kept._producer.lanes[0].carries[stage]
    assert lane.carries[stage].piece_array.shape == kept_carry.piece_array.shape


def test_rows_made_ahead_come_back_as_pointers_from_a_state():
    """A restored column-wise lane holds the state's rows made ahead as token-row
    pointers (located, not read), with the state's lineages: the batches after are the
    uninterrupted run's, gathered by the kernel; a row whose pieces do not fit its
    documents is refused."""
    ds = _drawn_mixture([TOKENS, SHORT], lanes=2)
    whole = take(iter(zj.Loader(ds)), 14)
    it = iter(zj.Loader(ds))
    lanes = it._producer.lanes
    step = next(t for t in range(1, 8) if next(it) and len(lanes[1].pending) > 1)
    state = it.get_state()
    snapshot = lanes[1].snapshot()
    resumed = iter(zj.Loader(ds))
    resumed.set_state(state)
    restored = resumed._producer.lanes[1]
    assert len(restored.pending) == len(lanes[1].pending)
    assert all(type(row.data) is token_bins.TokenRow for row in restored.pending)
    assert [row.lineage for row in restored.pending] == list(snapshot.pending)
    assert_batches_equal(take(resumed, 14 - step), whole[step:])
    parents, lengths = snapshot.pending[0]
    bad = snapshot._replace(pending=((parents, (lengths[0] + 1, *lengths[1:])),))
    state["lanes"]["1"] = np.frombuffer(encode_lane_state(bad, 1), np.uint8)
    with pytest.raises(zj.StateError, match="lane 1: the state's row .* made ahead holds"):
        iter(zj.Loader(ds)).set_state(state)
    bad = snapshot._replace(pending=((parents, (*lengths, 5)),))  # a length too many
    state["lanes"]["1"] = np.frombuffer(encode_lane_state(bad, 1), np.uint8)
    with pytest.raises(zj.StateError, match="lane 1: the state's row .* made ahead holds"):
        iter(zj.Loader(ds)).set_state(state)


def test_fewer_draws_read_ahead_change_no_batch(monkeypatch):
    """Many lanes read fewer draws ahead (see scheduled_mixture.max_chunk): only what is
    read ahead changes, not a batch."""
    ds = _drawn_mixture([TOKENS, SHORT], lanes=2)
    whole = take(iter(zj.Loader(ds)), 28)
    monkeypatch.setattr(scheduled_mixture, "_CHUNKS_ALL_LANES", 1)  # 64 a lane
    it = iter(zj.Loader(ds))
    assert it._producer.lanes[0].drawer.max_chunk == 64
    assert_batches_equal(take(it, 28), whole)


def test_a_lane_holds_more_drawn_roots_before_a_pass_with_fewer_lanes():
    assert [columns.roots_kept(n) for n in (1, 64, 256, 1024, 4096)] == [
        8192, 8192, 2048, 512, 512
    ]  # fmt: skip


def test_renumbering_kept_roots_leaves_states_and_resumes_exact(monkeypatch):
    """Keeping only the roots still pointed to renumbers the pieces of the open rows and
    of the uncounted rows: a lane snapshot taken before encodes the same after, and a
    state taken between passes resumes to the uninterrupted batches."""
    monkeypatch.setattr(columns, "_ROOTS_KEPT", 16)
    monkeypatch.setattr(columns, "_ROOTS_ALL_LANES", 16)
    monkeypatch.setattr(accounting, "FOLD_ROWS", 4)
    ds = _drawn_mixture([TOKENS, SHORT], lanes=2)
    it = iter(zj.Loader(ds))
    take(it, 12)
    lane = it._producer.lanes[1]
    snapshot, encoded = lane.snapshot(), lane.get_state()
    base = lane.drawn.base
    rest = take(it, 10)
    assert lane.drawn.base > base  # passes ran in between
    assert encode_lane_state(snapshot, 1) == encoded
    state = it.get_state()
    after = take(it, 6)
    resumed = iter(zj.Loader(ds))
    resumed.set_state(state)
    assert_batches_equal(take(resumed, 6), after)
    monkeypatch.setattr(columns, "_ROOTS_KEPT", 1 << 30)
    whole = take(iter(zj.Loader(ds)), 28)
    assert_batches_equal(rest + after, whole[12:])


def test_the_llm_pipeline_on_processes_workers_and_resumes(general, stores):
    """The documented LLM pipeline's shape: two stores mixed by tokens with two weight
    stages, split, pack, to_training: one process, two processes, a resume from a
    mid-run state on another topology, two workers, all the per-record path's batches."""
    parts = [zj.Dataset.source(s) for s in stores]
    ds = (
        zj.Dataset.mix(parts, {0: [0.7, 0.3], 4: [0.3, 0.7]}, unit="tokens")
        .shuffle(seed=0)
        .split(48)
        .pack(48)
        .to_training(pad_id=0)
        .batch(8)
    )
    assert LanePlan(ds).columnar is not None
    single = take(iter(zj.Loader(ds)), 10)
    explained = zj.explain_step(ds, 6)
    assert_batches_equal(run_topology(ds, 2, 10), single)
    assert_batches_equal(resume_across(ds, 10, 5, 1, 2), single[5:])
    it = iter(zj.Loader(ds, num_workers=2))
    try:
        assert_batches_equal(take(it, 10), single)
    finally:
        it.close()
    general()
    assert_batches_equal(take(iter(zj.Loader(ds)), 10), single)
    assert_batches_equal(resume_across(ds, 10, 5, 2, 1), single[5:])
    assert zj.explain_step(ds, 6) == explained


def _store_mixture(tmp_path) -> zj.BatchedDataset:
    """The documented LLM pipeline over two small TokenStores, one lane per row."""
    comps = []
    for seed in (3, 4):
        path = str(tmp_path / f"store{seed}")
        with TokenStoreWriter(path, dtype="int32") as writer:
            writer.extend(d.astype(np.int32) for d in _documents(seed, num=200))
        comps.append(zj.Dataset.source(TokenStore(path)))
    return (
        zj.Dataset.mix(comps, [0.7, 0.3], unit="tokens")
        .shuffle(0)
        .split(64)
        .pack(64)
        .to_training(pad_id=0)
        .batch(16)
    )


def test_restoring_store_lanes_reads_each_store_together_not_lane_by_lane(tmp_path, monkeypatch):
    """A restore of 16 column-wise lanes drawing from a mixture of TokenStores reads each
    store a few times for all the lanes (the records the state points to, the open rows'
    documents, the next draws), not once per lane; the batch is the uninterrupted run's."""
    ds = _store_mixture(tmp_path)
    it = iter(zj.Loader(ds))
    for _ in range(5):
        next(it)
    state = it.get_state()
    expected = next(it)
    reads = []
    for name in ("read_flat", "read_spans", "span_addresses", "__getitems__"):
        original = getattr(TokenStore, name)

        def counted(self, *args, _original=original, _name=name):
            reads.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(TokenStore, name, counted)
    it2 = iter(zj.Loader(ds))
    it2.set_state(state)
    got = next(it2)
    assert got.keys() == expected.keys()
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])
    assert 0 < len(reads) <= 4 * 2, reads  # at most 4 reads per store, 16 lanes


def test_a_store_read_failing_when_a_batch_is_gathered_skips_nothing(stores, monkeypatch):
    """Lanes over a TokenStore read a batch's tokens when it is gathered: if that read
    fails, the error names it, the iterator refuses to go on (its lanes passed the batch),
    and a state taken before gives the uninterrupted run's batches."""
    ds = zj.Dataset.source(stores[0]).shuffle(seed=3).split(48).pack(48).batch(8, num_lanes=4)
    assert LanePlan(ds).columnar is not None
    want = take(iter(zj.Loader(ds)), 6)
    it = iter(zj.Loader(ds))
    got = take(it, 2)
    state = it.get_state()
    reads = {name: getattr(TokenStore, name) for name in ("read_spans", "span_addresses")}

    def failing(self, starts, lengths):
        raise zj.sources.StorageError("injected: the store could not be read")

    for name in reads:  # a plain local store's spans are located in place, others read
        monkeypatch.setattr(TokenStore, name, failing)
    with pytest.raises(zj.sources.StorageError, match="injected: the store could not be read"):
        next(it)
    with pytest.raises(zj.RecordError, match="Restore a state taken before the failure"):
        next(it)
    for name, read in reads.items():
        monkeypatch.setattr(TokenStore, name, read)
    it.set_state(state)
    assert_batches_equal(got + take(it, 4), want)
