"""zephon_jax against Grain, a lean Python reference and a contiguous copy, in one process.

    python benchmarks/bench.py --json bench.json            # one run, every case
    python benchmarks/bench.py --quick                      # tiny corpus and windows
    python benchmarks/run_set.py --runs 5 --out DIR         # N runs, each a fresh process

Cases (every rate is real, non-padding tokens/s unless said otherwise):

* ``llm``: the documented LLM pipeline, two ``TokenStore`` corpora mixed by tokens,
  ``mix -> shuffle -> split(2048) -> pack(2048) -> to_training -> batch(64)``,
  against Grain as MaxText configures it (``documented_pipelines.py``); ``llm256``
  the same at ``batch(256)`` (Grain with 256 packing bins).
* ``readme``: the README example (a mixture, ``filter``, ``split``, best-fit
  ``pack``, ``window_shuffle``) at ``S=2048``, ``B=64``, against Grain doing the same.
* ``packing``: a log-normal corpus (mean about 600 tokens, about 4 % of the
  documents longer than ``seq_len``), ``shuffle -> split(S) -> pack(S) ->
  batch(B)`` at ``S=2048``, ``B=64`` and ``B=256``. zephon_jax with its defaults
  (best fit, 32 open rows per lane, one lane per row: ``32 x B`` open rows in all)
  against Grain's first fit and best fit with ``num_packing_bins=B`` and
  ``read_threads=0``, against the lean Python reference (``lean_reference.py``:
  the same packing with little Python per record, no lineage, state or checks; 32
  open rows in all) and against a contiguous copy: fresh arrays of the batch's
  shapes filled by ``np.copyto`` from contiguous memory.
* ``uniform``: lengths uniform in 1..2048 (nothing to split), first fit, ``B=32``:
  zephon_jax 32 open rows per lane x 32 lanes, Grain and the reference 32 bins.

  In both, zephon_jax runs over the documents as a Python list (what Grain reads)
  and, where the compiled kernels run (numba importable, as the install gives,
  and ``ZEPHON_JAX_COMPILED`` not ``0``), also over the same documents as one
  ``TokenArray``, which lanes read column-wise and pack with those kernels.
* ``map_batch``: records/s of ``shuffle -> map(identity) -> batch(128)``.
* ``lanes`` / ``lanes_token_array``: ``B=1024`` rows made by 8, 64, 256 or 1024
  lanes: tokens/s, resident memory per lane, ``get_state`` time, state bytes per
  lane, and the restore after ``--steps`` batches in a fresh process
  (``restore_probe.py``: building the pipeline, ``load_state``, ``set_state`` and
  the first batch, checked equal to the uninterrupted run's), over the documents
  as a list and as a ``TokenArray``.
* ``workers``: a Python-heavy map, alone and before packing, with 0, 1 and 2
  loader worker processes (records/s, tokens/s; the batches are the same for
  every worker count), with the CPU time per batch of every process, the
  same lanes run by Grain's worker pool (``grain_workers.py``, at the same
  prefetch depth), and the machine's own scaling: the map alone in one process
  and in two (``process_floor.py``), interleaved with them.
* ``tokenize``: texts of log-normal lengths (mean about 300 words, a tenth of
  them rare words) through ``shuffle -> tokenize -> pack(concat) -> batch(8)``
  at ``S=2048``, with a byte-level BPE (``tokenizers``) and a ``tiktoken``
  encoding, both trained here: zephon_jax's ``tokenize`` (one encode call per
  block of records) against the same tokenizer called once per record in a
  ``map``, against Grain's ``map`` of that per-record call with 0 and with its
  default 16 read threads, and against Grain encoding batches
  (``batch -> map(encode the batch) -> unbatch``; see ``tokenize_bench.py``).

The sides of a case run interleaved (see ``measure.py``): ratios are between
medians of windows taken in turns (``tokenize``: between overall rates, see
``TOKENIZE_TIMING``). ``--json`` writes every figure with the environment;
``run_set.py`` repeats runs in fresh processes and ``report.py`` gives each
figure's median and range over them.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import corpus as corpus_mod  # noqa: E402
import documented_pipelines as documented  # noqa: E402
import grain_baselines as grain_side  # noqa: E402
import grain_workers  # noqa: E402
import heavy  # noqa: E402
import lean_reference  # noqa: E402
import measure  # noqa: E402
import numpy as np  # noqa: E402
import process_floor  # noqa: E402
import restore_probe  # noqa: E402
import run_set  # noqa: E402
import tokenize_bench  # noqa: E402
import zephon_side  # noqa: E402

import zephon_jax as zj  # noqa: E402
from zephon_jax.sources import TokenArray  # noqa: E402

SEQ_LEN = 2048
# The same pipeline over the documents as one TokenArray: read column-wise, packed by the
# compiled kernels when numba is installed (see zephon_jax.engine.columns).
TOKEN_ARRAY_SIDE = "zephon_jax %s, TokenArray"


COPY = "contiguous copy"
LEAN = "lean Python reference"


def compiled_kernels() -> bool:
    """Whether this process packs token arrays with the compiled kernels."""
    from zephon_jax.core.kernels import kernels

    return kernels() is not None


def _token_array_settings(ds: zj.BatchedDataset) -> str:
    from zephon_jax.engine.lane import LanePlan

    path = "compiled kernels" if LanePlan(ds).columnar is not None else "general path"
    return f"the same pipeline over a TokenArray of the documents, {ds.num_lanes} lanes, {path}"


def _bins(batch_size: int, per_lane: int = 32) -> str:
    return f"{per_lane} open rows per lane x {batch_size} lanes = {per_lane * batch_size} open rows"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----- cases ---------------------------------------------------------------------------


def _copy_side(sample: dict[str, np.ndarray], source: np.ndarray) -> measure.Side:
    copy = measure.ContiguousCopy(measure.batch_layout(sample), source)
    return measure.Side(COPY, copy, measure.count_batches)


LEAN_REFERENCE = (
    "lean_reference.LeanPythonReference: shuffled reads, pieces as views, placement over plain "
    "ints, batch assembled as zephon_jax's; no lineage, state or checks"
)


def _shares(result: dict[str, Any], key: str, reference: float) -> dict[str, float]:
    """Each side's ``key`` over ``reference`` (sides without ``key`` left out)."""
    return {name: r[key] / reference for name, r in result.items() if key in r}


def _with_batches_per_s(result: dict[str, Any], batch_size: int, seq_len: int) -> None:
    """Adds batches/s (median) to token sides: tokens/s / real tokens per batch."""
    for name, r in result.items():
        if name != COPY and r.get("fill"):
            r["batches_per_s"] = r["rate_median"] / (r["fill"] * batch_size * seq_len)


def _ratios(result: dict[str, Any], sides: dict[str, str], grains: tuple[str, ...]) -> dict:
    """``{prefix}ratio_to_{grain side}`` for each zephon_jax side (key: result name)."""
    out = {}
    for prefix, name in sides.items():
        if name in result:
            for g in grains:
                out[f"{prefix}ratio_to_{g.replace(' ', '_')}"] = measure.ratio(
                    result[name], result[g]
                )
    return out


def packing_case(
    docs: list, tokens: Any, source: np.ndarray, batch_size: int, timing: measure.Timing
) -> dict[str, Any]:
    """zephon_jax defaults (documents as a list, and as a TokenArray where the kernels run)
    vs Grain first/best fit (one bin per row) vs the lean Python reference and the copy."""
    zds = zephon_side.packing(docs, SEQ_LEN, batch_size)
    z_it = iter(zj.Loader(zds))
    sample = next(z_it)
    sides = [measure.Side("zephon_jax best_fit", z_it, measure.count_packed)]
    settings = {
        "seq_len": SEQ_LEN,
        "batch_size": batch_size,
        "zephon_jax": repr(zds) + f", best_fit, {_bins(batch_size)}",
        "grain": f"read_threads=0, num_packing_bins={batch_size}, split by FlatMapTransform",
        "copy": "np.empty + np.copyto of the batch's three int32 fields from contiguous memory",
        "lean_reference": LEAN_REFERENCE + ", best_fit over 32 open rows in all",
    }
    if compiled_kernels():
        t_ds = zephon_side.packing(tokens, SEQ_LEN, batch_size)
        t_it = iter(zj.Loader(t_ds))
        next(t_it)
        sides.append(measure.Side(TOKEN_ARRAY_SIDE % "best_fit", t_it, measure.count_packed))
        settings["zephon_jax_token_array"] = _token_array_settings(t_ds)
    sides += [
        measure.Side(
            "grain first_fit",
            iter(grain_side.packing(docs, SEQ_LEN, batch_size, "first_fit")),
            measure.count_packed,
        ),
        measure.Side(
            "grain best_fit",
            iter(grain_side.packing(docs, SEQ_LEN, batch_size, "best_fit")),
            measure.count_packed,
        ),
        measure.Side(
            LEAN,
            lean_reference.LeanPythonReference(docs, SEQ_LEN, batch_size),
            measure.count_packed,
        ),
        _copy_side(sample, source),
    ]
    result = measure.interleave(sides, timing)
    _with_batches_per_s(result, batch_size, SEQ_LEN)
    out = {
        "settings": settings,
        "sides": result,
        **_ratios(
            result,
            {"": "zephon_jax best_fit", "token_array_": TOKEN_ARRAY_SIDE % "best_fit"},
            ("grain first_fit", "grain best_fit"),
        ),
        "share_of_copy": _shares(result, "batches_per_s", result[COPY]["rate_median"]),
        "share_of_lean_reference": _shares(result, "rate_median", result[LEAN]["rate_median"]),
    }
    for it in (s.iterator for s in sides):
        measure.close(it)
    return out


def uniform_case(
    docs: list, source: np.ndarray, batch_size: int, bins: int, timing: measure.Timing
) -> dict[str, Any]:
    """first_fit, ``bins`` open rows per zephon_jax lane and ``bins`` Grain bins, uniform
    lengths (no split needed)."""
    zds = zephon_side.packing(docs, SEQ_LEN, batch_size, "first_fit", num_bins=bins, split=False)
    z_it = iter(zj.Loader(zds))
    sample = next(z_it)
    sides = [measure.Side("zephon_jax first_fit", z_it, measure.count_packed)]
    settings = {
        "seq_len": SEQ_LEN,
        "batch_size": batch_size,
        "bins": bins,
        "zephon_jax": f"first_fit, {_bins(zds.num_lanes, bins)}",
        "grain": f"first_fit, num_packing_bins={bins}, read_threads=0",
        "lean_reference": LEAN_REFERENCE + f", first_fit over {bins} open rows in all",
    }
    if compiled_kernels():
        tokens = TokenArray.from_documents(docs)
        t_ds = zephon_side.packing(tokens, SEQ_LEN, batch_size, "first_fit", bins, split=False)
        t_it = iter(zj.Loader(t_ds))
        next(t_it)
        sides.append(measure.Side(TOKEN_ARRAY_SIDE % "first_fit", t_it, measure.count_packed))
        settings["zephon_jax_token_array"] = _token_array_settings(t_ds)
    g_ds = grain_side.packing(docs, SEQ_LEN, batch_size, "first_fit", bins, split=False)
    sides += [
        measure.Side("grain first_fit", iter(g_ds), measure.count_packed),
        measure.Side(
            LEAN,
            lean_reference.LeanPythonReference(
                docs, SEQ_LEN, batch_size, "first_fit", bins, split=False
            ),
            measure.count_packed,
        ),
        _copy_side(sample, source),
    ]
    result = measure.interleave(sides, timing)
    _with_batches_per_s(result, batch_size, SEQ_LEN)
    out = {
        "settings": settings,
        "sides": result,
        **_ratios(
            result,
            {"": "zephon_jax first_fit", "token_array_": TOKEN_ARRAY_SIDE % "first_fit"},
            ("grain first_fit",),
        ),
        "share_of_copy": _shares(result, "batches_per_s", result[COPY]["rate_median"]),
        "share_of_lean_reference": _shares(result, "rate_median", result[LEAN]["rate_median"]),
    }
    for it in (s.iterator for s in sides):
        measure.close(it)
    return out


README_NO_WINDOW = "grain without window_shuffle (not the same pipeline)"


def documented_case(
    which: str, docs: list, uniform: list, timing: measure.Timing, batch_size: int = 64
) -> dict[str, Any]:
    """A documented pipeline (``llm`` or ``readme``, see ``documented_pipelines.py``) on both
    sides, interleaved: real tokens/s, fill, and the ratio to Grain."""
    with tempfile.TemporaryDirectory() as tmp:
        if which == "llm":
            stores = documented.write_stores([docs, uniform], tmp)
            zds = documented.llm_zephon(stores, SEQ_LEN, batch_size)
            g_ds = documented.llm_grain(stores, SEQ_LEN, batch_size)
            count: measure.Counter = documented.count_training
            settings = {
                "pipeline": "mix([TokenStore, TokenStore], token shares "
                f"{documented.LLM_TOKEN_SHARES}, unit='tokens') -> shuffle -> split(2048) -> "
                f"pack(2048) -> to_training -> batch({batch_size})",
                "zephon_jax": f"best_fit (the default), {_bins(batch_size)}",
                "grain": "MapDataset.mix by records (weights "
                f"{[round(w, 4) for w in documented.record_weights(stores, documented.LLM_TOKEN_SHARES)]}"
                ": the same token shares in expectation) -> shuffle -> repeat, read_threads=0, "
                f"split by FlatMapTransform, FirstFitPackIterDataset(num_packing_bins={batch_size}), "
                "map(the to_training shift), batch",
            }
        else:
            zds = documented.readme_zephon([docs, uniform], SEQ_LEN, batch_size)
            g_ds = documented.readme_grain([docs, uniform], SEQ_LEN, batch_size)
            count = measure.count_packed
            settings = {
                "pipeline": f"mix(weights {documented.README_WEIGHTS}) -> shuffle -> filter -> "
                "split(2048) -> pack(2048, best_fit) -> window_shuffle(16) -> batch(64)",
                "zephon_jax": f"best_fit, {_bins(batch_size)}",
                "grain": "MapDataset.mix -> shuffle -> repeat -> filter, read_threads=0, split by "
                f"FlatMapTransform, BestFitPackIterDataset(num_packing_bins={batch_size}), "
                "WindowShuffleIterDataset(16), batch",
                "grain_without_window_shuffle": "the same Grain pipeline without "
                "WindowShuffleIterDataset, whose index_shuffle per element is slow for small "
                "windows; shown beside, not compared",
            }
        z_it = iter(zj.Loader(zds))
        next(z_it)
        sides = [
            measure.Side("zephon_jax", z_it, count),
            measure.Side("grain", iter(g_ds), count),
        ]
        if which == "readme":
            g_plain = documented.readme_grain([docs, uniform], SEQ_LEN, batch_size, window=False)
            sides.append(measure.Side(README_NO_WINDOW, iter(g_plain), count))
        result = measure.interleave(sides, timing)
        for side in sides:
            measure.close(side.iterator)
    settings.update(seq_len=SEQ_LEN, batch_size=batch_size)
    return {
        "settings": settings,
        "sides": result,
        "ratio_to_grain": measure.ratio(result["zephon_jax"], result["grain"]),
    }


def map_batch_case(timing: measure.Timing, batch_size: int = 128) -> dict[str, Any]:
    records = [{"x": np.int64(i)} for i in range(100_000)]
    sides = [
        measure.Side(
            "zephon_jax",
            iter(zj.Loader(zephon_side.map_batch(records, batch_size))),
            measure.count_records,
        ),
        measure.Side(
            "grain", iter(grain_side.map_batch(records, batch_size)), measure.count_records
        ),
    ]
    result = measure.interleave(sides, timing)
    return {
        "settings": {"batch_size": batch_size, "records": "{'x': np.int64}", "read_threads": 0},
        "sides": result,
        "ratio_to_grain": measure.ratio(result["zephon_jax"], result["grain"]),
    }


TOKENIZE_SIDES = {
    "zephon_jax tokenize": "blocks",
    "zephon_jax map, one by one": "one by one",
    "grain map, read_threads=0": 0,
    "grain map, 16 read threads": None,
    "grain batch -> map(encode batch) -> unbatch": "grain batched",
}
# A lane reads (and encodes) a block of up to 256 records every few dozen rows: one
# lane makes the 8 rows, so that a timed window holds several blocks (with one lane
# per row, every lane's block falls in the same batch, a burst of 2,048 records),
# with no untimed preroll, which could leave a block out. Rates are overall: all
# timed tokens over all timed seconds.
TOKENIZE_TIMING = measure.Timing(warmup_s=0.8, window_s=1.0, repeats=3, preroll=0)
TOKENIZE_QUICK = measure.Timing(warmup_s=0.3, window_s=0.3, repeats=2, preroll=0)


def tokenize_case(
    texts: list[str], tokenizers: dict[str, Any], timing: measure.Timing, batch_size: int = 8
) -> dict[str, Any]:
    """Per tokenizer: zephon_jax's batched ``tokenize`` vs one call per record vs Grain's map."""
    records = [{"text": t} for t in texts]
    words = np.array([t.count(" ") + 1 for t in texts])
    out: dict[str, Any] = {
        "settings": {
            "seq_len": SEQ_LEN,
            "batch_size": batch_size,
            "texts": len(texts),
            "mean_words": float(words.mean()),
            "median_words": float(np.median(words)),
            "max_words": int(words.max()),
            "pipeline": "shuffle -> tokenize(eos) -> pack(concat) -> batch, 1 lane",
            "grain": "MapDataset.map(per-record encode) -> ConcatThenSplitIterDataset -> batch",
            "grain_batched": "MapDataset.batch(256) -> map(apply_batch, the call tokenize makes "
            "per block) -> unbatch (FlatMapTransform), read_threads=0 -> "
            "ConcatThenSplitIterDataset -> batch",
            "cpu_count": os.cpu_count(),
            "rates": "overall: timed tokens / timed seconds over interleaved windows",
        }
    }
    for kind, tokenizer in tokenizers.items():
        log(f"  tokenize: {kind}")
        tallies, sides = {}, []
        for name, how in TOKENIZE_SIDES.items():
            if how == "grain batched":
                it = tokenize_bench.grain_batched_pipeline(records, tokenizer, SEQ_LEN, batch_size)
            elif isinstance(how, str):
                ds = tokenize_bench.zephon_pipeline(
                    records, tokenizer, SEQ_LEN, batch_size, how == "blocks", num_lanes=1
                )
                it = iter(zj.Loader(ds))
            else:
                it = tokenize_bench.grain_pipeline(records, tokenizer, SEQ_LEN, batch_size, how)
            tallies[name] = tokenize_bench.PackedTally()
            sides.append(measure.Side(name, it, tallies[name]))
        load_before = os.getloadavg()[0]
        result = measure.interleave(sides, timing)
        for side in sides:
            r = result[side.name]
            r["tokens_per_record"] = side.units / tallies[side.name].records
            r["records_per_s"] = r["rate_overall"] / r["tokens_per_record"]
            measure.close(side.iterator)
        z = result["zephon_jax tokenize"]["rate_overall"]
        out[kind] = {
            "tokenizer": tokenize_bench.describe_tokenizer(tokenizer),
            "sides": result,
            "ratio_to_one_by_one": z / result["zephon_jax map, one by one"]["rate_overall"],
            "ratio_to_grain": z / result["grain map, read_threads=0"]["rate_overall"],
            "ratio_to_grain_threads": z / result["grain map, 16 read threads"]["rate_overall"],
            "ratio_to_grain_batched": z
            / result["grain batch -> map(encode batch) -> unbatch"]["rate_overall"],
            "load_average_1min": [load_before, os.getloadavg()[0]],
        }
    return out


def _batches_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _snapshot_time(it: Any, repeats: int = 5) -> float | None:
    """Median time of one snapshot of every lane right after a batch: what device
    prefetch and each worker take per batch (the iterator moves on ``repeats`` batches).
    The young-generation collection the batch left pending runs before the timing."""
    producer = getattr(it, "_producer", None)
    snap = getattr(producer, "lane_snapshots", None)
    if snap is None:
        return None
    times = []
    for _ in range(repeats):
        next(it)
        gc.collect(0)
        t0 = time.perf_counter()
        snap()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _pooled_bytes(it: Any) -> int:
    """Bytes of the batch arrays an iterator keeps for reuse (part of its RSS)."""
    pool = getattr(getattr(it, "_producer", None), "pool", None)
    arrays = getattr(pool, "_arrays", {})
    return sum(a.nbytes for kept in arrays.values() for a in kept)


def fresh_restore(
    state: dict, source: str, num_docs: int, lanes: int, batch_size: int
) -> dict[str, Any]:
    """Runs ``restore_probe.py`` on ``state`` in a new interpreter: its seconds and digest."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.bin")
        zj.save_state(state, path)
        cmd = [sys.executable, os.path.join(_HERE, "restore_probe.py"), "--state", path]
        cmd += ["--source", source, "--num-docs", str(num_docs), "--lanes", str(lanes)]
        cmd += ["--batch-size", str(batch_size)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"restore_probe.py failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def lane_sweep(
    docs: Any,
    lane_counts: list[int],
    batch_size: int,
    steps: int,
    timing: measure.Timing,
    num_docs: int,
) -> dict[str, Any]:
    """The same batches made by different lane counts: speed, memory, state, restore
    (``docs``: the ``num_docs`` documents of the log-normal corpus as a list or as a
    TokenArray; the restore rebuilds them in a fresh process)."""
    source = "token_array" if isinstance(docs, TokenArray) else "list"
    rows: dict[int, dict[str, Any]] = {}
    sides = []
    for lanes in lane_counts:
        log(f"  lanes={lanes}: {steps} steps")
        ds = zephon_side.packing(docs, SEQ_LEN, batch_size, num_lanes=lanes)
        loader = zj.Loader(ds)
        rss0 = measure.current_rss()
        it = iter(loader)
        t0 = time.perf_counter()
        first = next(it)
        first_batch_s = time.perf_counter() - t0
        del first
        for _ in range(steps - 1):
            next(it)
        rss1 = measure.current_rss()
        get_state_s, _, state = measure.median_time(it.get_state, 5)
        lane_sizes = [len(v) for v in state["lanes"].values()]
        expected = next(it)

        def restore(loader=loader, state=state):
            it2 = iter(loader)
            it2.set_state(state)
            batch = next(it2)
            measure.close(it2)
            return batch

        warm_s, _, got = measure.median_time(restore, 3)
        fresh = fresh_restore(state, source, num_docs, lanes, batch_size)
        rows[lanes] = {
            "num_lanes": lanes,
            "rows_per_lane": batch_size // lanes,
            "first_batch_s": first_batch_s,
            "rss_bytes_per_lane": (rss1 - rss0) / lanes,
            "pooled_bytes_per_lane": _pooled_bytes(it) / lanes,
            "get_state_s": get_state_s,
            "snapshot_s": _snapshot_time(it),
            "state_bytes_per_lane": sum(lane_sizes) / len(lane_sizes),
            "state_bytes_per_lane_max": max(lane_sizes),
            "restore_fresh_process_s": fresh["restore_s"],
            "restore_warm_s": warm_s,
            "restore_exact": _batches_equal(expected, got)
            and fresh["digest"] == restore_probe.batch_digest(expected),
        }
        del expected, got
        sides.append(measure.Side(f"{lanes} lanes", it, measure.count_packed))
    log("  lane sweep: timed windows")
    result = measure.interleave(sides, timing)
    for lanes, side in zip(lane_counts, sides, strict=True):
        rows[lanes].update(
            tokens_per_s=result[side.name]["rate_median"],
            tokens_per_s_best=result[side.name]["rate_best"],
            fill=result[side.name]["fill"],
        )
        measure.close(side.iterator)
    base = rows[lane_counts[0]]["tokens_per_s"]
    for r in rows.values():
        r["speed_vs_fewest_lanes"] = r["tokens_per_s"] / base
    return {
        "settings": {
            "seq_len": SEQ_LEN,
            "batch_size": batch_size,
            "steps_before_restore": steps,
            "pipeline": "shuffle -> split(2048) -> pack(2048, best_fit, 32 bins) -> batch",
            "source": type(docs).__name__,
            "restore": "restore_fresh_process_s: a fresh interpreter, modules imported and corpus "
            "made untimed; build the pipeline + load_state + set_state + first batch (kernel "
            "compile or cache load included); restore_warm_s: median of 3 in this process",
        },
        "rows": [rows[n] for n in lane_counts],
    }


# zephon_jax's default depth; Grain's pool gets the same (per_worker_buffer_size).
WORKER_PREFETCH = inspect.signature(zj.Loader).parameters["worker_prefetch"].default


def _cpu_per_batch(it: Any, seconds: float) -> dict[str, float]:
    """CPU seconds per batch of the loader process and of each worker (busy-machine proof).

    On a machine shared with other work, wall-clock speed-ups understate what
    idle cores give; the CPU time per batch of the busiest process bounds it.
    """
    import psutil

    producer = getattr(it, "_producer", it)
    pids = producer.worker_pids() if hasattr(producer, "worker_pids") else []
    procs = [psutil.Process()] + [psutil.Process(p) for p in pids]

    def cpu():
        return [sum(p.cpu_times()[:2]) for p in procs]

    for _ in range(2):
        next(it)
    before, t0, batches = cpu(), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:  # CPU times tick in 10 ms
        next(it)
        batches += 1
    used = [(b - a) / batches for a, b in zip(before, cpu(), strict=True)]
    return {
        "cpu_s_per_batch_loader": used[0],
        "cpu_s_per_batch_workers": used[1:],
        "cpu_s_per_batch_total": sum(used),
        "cpu_s_per_batch_busiest": max(used),
    }


GRAIN_POOL = "zephon_jax lanes in grain's mp_prefetch, 2 workers"


def _label(side: str) -> str:
    return side.split("=")[1] if side.startswith("workers=") else "grain_pool_2"


def workers_case(
    docs: list, timing: measure.Timing, counts: tuple[int, ...], batch_size: int = 64
) -> dict[str, Any]:
    """A heavy map alone and before packing, with 0, 1 and 2 worker processes, interleaved."""
    records = [{"x": np.int64(i)} for i in range(100_000)]
    pipelines = {
        "heavy map": (
            zj.Dataset.source(records).shuffle(0).map(heavy.heavy_record_map).batch(batch_size),
            measure.count_records,
        ),
        "heavy map + pack": (
            zephon_side.heavy_map_pack(docs, SEQ_LEN, batch_size),
            measure.count_packed,
        ),
    }
    out: dict[str, Any] = {
        "settings": {
            "batch_size": batch_size,
            "cpu_count": os.cpu_count(),
            "worker_prefetch": WORKER_PREFETCH,
            "grain_pool": "the same lanes run by Grain's mp_prefetch worker pool, "
            f"per_worker_buffer_size={WORKER_PREFETCH} (grain_workers.py)",
        }
    }
    for name, (ds, count) in pipelines.items():
        log(f"  workers: {name}")
        its = []
        for w in counts:
            t0 = time.perf_counter()
            it = iter(zj.Loader(ds, num_workers=w))
            next(it)
            its.append((w, it, time.perf_counter() - t0))
        sides = [measure.Side(f"workers={w}", it, count) for w, it, _ in its]
        if name == "heavy map + pack" and 2 in counts:
            # The same lanes in Grain's own worker processes (see grain_workers.py).
            t0 = time.perf_counter()
            it = grain_workers.GrainWorkerBatches(ds, 2, prefetch=WORKER_PREFETCH)
            next(it)
            its.append((2, it, time.perf_counter() - t0))
            sides.append(measure.Side(GRAIN_POOL, it, count))
        # The map alone in one process and in two, in the same rounds.
        floors = [process_floor.ProcessFloor(p) for p in (1, 2)]
        floor_sides = [
            measure.Side(f"map alone, {p} process{'es' if p > 1 else ''}", it, process_floor.count)
            for p, it in zip((1, 2), floors)
        ]
        load_before = os.getloadavg()[0]
        result = measure.interleave(sides + floor_sides, timing)
        for it in floors:
            it.close()
        floor = {side.name: result.pop(side.name) for side in floor_sides}
        one, two = (floor[side.name]["rate_median"] for side in floor_sides)
        for (_, it, startup), side in zip(its, sides, strict=True):
            result[side.name]["startup_s"] = startup
            result[side.name].update(_cpu_per_batch(it, 4 * timing.window_s))
            measure.close(it)
        base = result["workers=0"]["rate_median"]
        busiest0 = result["workers=0"]["cpu_s_per_batch_busiest"]
        out[name] = {
            **{
                f"cpu_bound_speedup_{_label(key)}": busiest0 / r["cpu_s_per_batch_busiest"]
                for key, r in result.items()
                if key != "workers=0"
            },
            "sides": result,
            "process_floor": {"sides": floor, "speedup_2": two / one},
            "load_average_1min": [load_before, os.getloadavg()[0]],
            **{
                f"speedup_{_label(key)}": r["rate_median"] / base
                for key, r in result.items()
                if key != "workers=0"
            },
        }
    return out


# ----- driver --------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """The environment a run's figures hold for: versions, CPU, cores, load, kernels."""
    env = run_set.environment()
    return {
        **env,
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "zephon_jax_compiled_env": os.environ.get("ZEPHON_JAX_COMPILED"),
        "compiled_kernels": compiled_kernels(),
        "load_average_at_start": env.pop("load_average"),
    }


def _source_buffer(docs: list) -> np.ndarray:
    """The corpus's contiguous token buffer (every document is a view into it)."""
    base = docs[0]["tokens"]
    while base.base is not None:
        base = base.base
    return np.asarray(base)


def summary_lines(results: dict[str, Any]) -> list[str]:
    """One line per case: each side's median rate and the case's ratios (``report.py`` gives
    the tables, and medians with ranges over a set of runs)."""
    lines = []
    names = ("llm", LLM_256, "readme", "uniform", "map_batch")
    cases = [(k, results[k]) for k in names if k in results]
    cases += [(f"packing {b}", c) for b, c in results.get("packing", {}).items()]
    for name, case in cases:
        rates = ", ".join(
            f"{side} {r['rate_median'] / 1e6:.2f} M"
            + (f" (fill {r['fill']:.3f})" if r["fill"] else "")
            for side, r in case["sides"].items()
        )
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in case.items() if "ratio" in k)
        lines.append(f"{name}: {rates}; {ratios}")
    for which in ("lanes", "lanes_token_array"):
        for r in results.get(which, {}).get("rows", []):
            lines.append(
                f"{which} {r['num_lanes']:>4}: {r['tokens_per_s'] / 1e6:6.1f} M tok/s, state "
                f"{r['state_bytes_per_lane']:.0f} B/lane, restore in a fresh process "
                f"{r['restore_fresh_process_s']:.2f} s (exact: {r['restore_exact']})"
            )
    for name in ("heavy map", "heavy map + pack"):
        w = results.get("workers", {}).get(name)
        if w:
            speedups = ", ".join(f"{k} {v:.2f}x" for k, v in w.items() if k.startswith("speedup"))
            lines.append(
                f"workers {name}: {speedups}; the map alone, 2 processes over 1: "
                f"{w['process_floor']['speedup_2']:.2f}x"
            )
    for kind, case in results.get("tokenize", {}).items():
        if kind != "settings":
            ratios = ", ".join(f"{k} {v:.2f}x" for k, v in case.items() if "ratio" in k)
            lines.append(f"tokenize {kind}: {ratios}")
    return lines


LLM_256 = "llm256"  # the documented LLM pipeline at batch(256)
ALL_CASES = (
    f"llm,{LLM_256},readme,packing,uniform,map_batch,lanes,lanes_token_array,workers,tokenize"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small corpus, short windows")
    parser.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    parser.add_argument(
        "--only",
        metavar="CASES",
        default=ALL_CASES,
        help=f"comma-separated cases to run (default {ALL_CASES})",
    )
    parser.add_argument("--num-docs", type=int, default=None, help="corpus size (documents)")
    parser.add_argument("--steps", type=int, default=None, help="steps before the restore")
    parser.add_argument(
        "--lane-counts",
        metavar="N,N,...",
        default=None,
        help="lane counts of the lane sweep (e.g. 1024 alone); default 8,64,256,1024",
    )
    parser.add_argument(
        "--worker-counts",
        metavar="N,N,...",
        default=None,
        help="worker processes of the workers case (0 first); default 0,1,2 (quick: 0,2)",
    )
    args = parser.parse_args(argv)
    cases = set(args.only.split(","))
    unknown = cases - set(ALL_CASES.split(","))
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {ALL_CASES}")
    timing = measure.QUICK if args.quick else measure.FULL
    num_docs = args.num_docs or (5000 if args.quick else 20_000)
    steps = args.steps or (10 if args.quick else 200)
    lane_counts, lane_batch = ([8, 64, 256], 256) if args.quick else ([8, 64, 256, 1024], 1024)
    if args.lane_counts:
        lane_counts = [int(n) for n in args.lane_counts.split(",")]
        lane_batch = max(lane_batch, *lane_counts)

    info = machine_info()
    log(f"machine: {info}")
    docs = corpus_mod.make_lognormal_corpus(num_docs, seed=0)
    uniform = corpus_mod.make_corpus(num_docs, max_len=SEQ_LEN, seed=1)
    results: dict[str, Any] = {
        "machine": info,
        "mode": "quick" if args.quick else "full",
        "timing": timing.__dict__,
        "corpus": corpus_mod.describe(docs, SEQ_LEN),
        "uniform_corpus": corpus_mod.describe(uniform, SEQ_LEN),
    }
    source = _source_buffer(docs)
    tokens = TokenArray.from_documents(docs)
    t_start = time.perf_counter()
    for which in ("llm", "readme"):
        if which in cases:
            log(f"{which} (documented pipeline)")
            results[which] = documented_case(which, docs, uniform, timing)
    if LLM_256 in cases:
        log("llm at batch(256) (documented pipeline)")
        results[LLM_256] = documented_case("llm", docs, uniform, timing, batch_size=256)
    if "packing" in cases:
        results["packing"] = {}
        for b in (64, 256):
            log(f"packing B={b}")
            results["packing"][f"B={b}"] = packing_case(docs, tokens, source, b, timing)
    if "uniform" in cases:
        log("uniform first_fit 32 bins")
        results["uniform"] = uniform_case(uniform, source, 32, 32, timing)
    if "map_batch" in cases:
        log("map+batch")
        results["map_batch"] = map_batch_case(timing)
    if "lanes" in cases:
        log("lane sweep")
        results["lanes"] = lane_sweep(docs, lane_counts, lane_batch, steps, timing, num_docs)
    if "lanes_token_array" in cases:
        log("lane sweep, TokenArray")
        results["lanes_token_array"] = lane_sweep(
            tokens, lane_counts, lane_batch, steps, timing, num_docs
        )
    if "workers" in cases:
        log("workers")
        counts = (0, 2) if args.quick else (0, 1, 2)
        if args.worker_counts:
            counts = tuple(int(n) for n in args.worker_counts.split(","))
        if counts[0] != 0:
            parser.error("--worker-counts must start with 0 (the baseline)")
        results["workers"] = workers_case(docs, timing, counts)
    if "tokenize" in cases:  # last: its tokenizer threads stay alive
        log("tokenize: training the tokenizers")
        texts = tokenize_bench.make_lognormal_texts(2000 if args.quick else 10_000, seed=2)
        tokenizers = tokenize_bench.train_tokenizers(
            texts[:2000],
            ("tokenizers", "tiktoken"),
            vocab_size=2000,
            tiktoken_texts=50 if args.quick else 100,
            tiktoken_merges=300,
        )
        tok_timing = TOKENIZE_QUICK if args.quick else TOKENIZE_TIMING
        results["tokenize"] = tokenize_case(texts, tokenizers, tok_timing)
    results["total_s"] = time.perf_counter() - t_start
    results["machine"]["load_average_at_end"] = os.getloadavg()

    print("\n".join(summary_lines(results)))
    print(f"total {results['total_s']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=float)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
