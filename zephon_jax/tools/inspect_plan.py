"""``zephon-jax inspect``: a pipeline's plan and where its time goes.

The plan lists the sources and mixture weights, the operators in order with
their carry bounds and the transforms after each, the lanes, the rows per lane
and the fingerprint a checkpoint must match. The timing runs the pipeline on
one process for a number of global batches with every stage timed on its own:
reading sources, each stage's per-record transforms, each operator (its
``step_block``/``flush`` only), and assembling batches; then the bytes each operator's
carry takes in a lane state.
"""

from __future__ import annotations

import collections
import hashlib
import json
import statistics
import sys
import time
from typing import Any

from zephon_jax.dataset import BatchedDataset, Dataset
from zephon_jax.errors import PipelineError
from zephon_jax.operators.base import step_block_of
from zephon_jax.sampler.mixture import MixtureNode
from zephon_jax.sampler.resolve import leaves
from zephon_jax.sampler.scheduled_mixture import ScheduledMixtureNode
from zephon_jax.sampler.source import describe_source
from zephon_jax.tools.demo import DemoConfig, build_pipeline, corpus_sources
from zephon_jax.tools.tokenizers import load_callable

BUILTIN_NAME = "the built-in corpus pipeline of `zephon-jax demo`"


def builtin_pipeline(
    *, quick: bool = False, cache_dir: str | None = None, stream=None
) -> BatchedDataset:
    """The demo's pipeline over the built-in corpus, for ``inspect``/``verify`` without code.

    A 0.7/0.3 mixture of the standard library's modules and its tests (byte-level
    tokens, prepared once into the cache), shuffled, split and packed first-fit
    into rows of 1024, in global batches of 16. ``quick``: the first 60 files of
    each part and rows of 256.
    """
    cfg = DemoConfig(cache_dir=cache_dir)
    if quick:
        cfg = DemoConfig(cache_dir=cache_dir, seq_len=256, max_files=60)
    return build_pipeline(cfg, corpus_sources(cfg, stream=stream))


def load_pipeline(spec: str) -> BatchedDataset:
    """Calls the ``module:function`` ``spec`` and checks it returned a batched pipeline."""
    obj = load_callable(spec)()
    if isinstance(obj, Dataset):
        raise PipelineError(
            f"{spec} returned a Dataset without a batch size; end the pipeline with "
            ".batch(global_batch_size) and return that"
        )
    if not isinstance(obj, BatchedDataset):
        raise PipelineError(
            f"{spec} returned {type(obj).__name__}; it must return a zephon_jax BatchedDataset "
            "(a pipeline ending in .batch(global_batch_size))"
        )
    return obj


def short_fingerprint(batched: BatchedDataset) -> str:
    """16 hex digits summarizing the pipeline fingerprint."""
    text = json.dumps(batched.fingerprint(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sampler_lines(node, weight: float | None, indent: str, out: list[str]) -> None:
    share = "" if weight is None else f"weight {weight:.3f}  "
    transforms = [t.describe() for t in node.transforms]
    if isinstance(node, MixtureNode):
        seed = "" if node.order_seed is None else f"  order seed {node.order_seed}"
        out.append(f"{indent}{share}mixture of {len(node.children)}{seed}")
        for child, w in zip(node.children, node.weights):
            _sampler_lines(child, w, indent + "  ", out)
    elif isinstance(node, ScheduledMixtureNode):
        seed = "" if node.order_seed is None else f"  order seed {node.order_seed}"
        out.append(f"{indent}{share}mixture of {len(node.children)} by {node.unit}{seed}")
        for start, ws in zip(node.stages.starts, node.stages.values):
            if not node.stages.is_constant:
                weights = ", ".join(f"{w:.3f}" for w in ws)
                out.append(f"{indent}  from step {start}: weights {weights}")
        first = node.stages.values[0] if node.stages.is_constant else (None,) * len(ws)
        for child, w in zip(node.children, first):
            _sampler_lines(child, w, indent + "  ", out)
    else:
        epochs = "forever" if node.num_epochs is None else f"{node.num_epochs} epoch(s)"
        shuffle = "not shuffled" if node.shuffle_seed is None else f"shuffled ({node.shuffle_seed})"
        out.append(
            f"{indent}{share}{describe_source(node.source)}: {len(node.source):,} records, "
            f"{shuffle}, {epochs}"
        )
    for t in transforms:
        out.append(f"{indent}  then {t}")


def describe_plan(batched: BatchedDataset) -> str:
    """The plan of a batched pipeline as text."""
    out = ["sources"]
    _sampler_lines(batched.sampler, None, "  ", out)
    out.append("operators (in order; carry is per lane)")
    if not batched.stages:
        out.append("  none")
    for i, stage in enumerate(batched.stages, 1):
        op = stage.operator
        out.append(f"  {i}. {op.describe()}")
        out.append(f"     carry bound: {op.carry_bound()}")
        for t in stage.transforms:
            out.append(f"     then {t.describe()}")
    for start, size in zip(batched.batch_schedule.starts, batched.batch_schedule.values):
        since = f" from step {start}" if batched.is_ramp else ""
        out.append(
            f"batch{since}: {size} rows per global batch, {batched.num_lanes} lanes, "
            f"{size // batched.num_lanes} row(s) per lane"
        )
    out.append(f"lanes run: {lane_path(batched)}")
    out.append(f"fingerprint: {short_fingerprint(batched)}")
    return "\n".join(out)


def lane_path(batched: BatchedDataset) -> str:
    """How the lanes run: column-wise with compiled kernels, or the general path."""
    from zephon_jax.core.kernels import kernels
    from zephon_jax.engine.lane import LanePlan

    if LanePlan(batched).columnar is not None:
        return "column-wise over token arrays, stores or lists of token records, packed by compiled kernels"
    token_array = sys.modules.get("zephon_jax.sources.token_array")
    sources = [leaf.source for leaf in leaves(batched.sampler)]
    if token_array and all(isinstance(s, token_array.TokenArray) for s in sources):
        if kernels() is None:
            return (
                "the general path (TokenArray sources pack with compiled kernels where numba "
                "imports, pip install numba, unless ZEPHON_JAX_COMPILED=0 or "
                "zephon_jax.set_compiled(False))"
            )
    return "the general path"


# ----- timing ------------------------------------------------------------------------


class _Clock:
    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.order: list[str] = []

    def add(self, name: str, seconds: float) -> None:
        if name not in self.seconds:
            self.order.append(name)
        self.seconds[name] += seconds
        self.calls[name] += 1

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - t0)

        return timed


class _TimedSource:
    """Delegates to a source, timing its reads."""

    def __init__(self, source, clock: _Clock, name: str):
        self._source = source
        self._get = clock.wrap(name, source.__getitem__)
        getitems = getattr(source, "__getitems__", None)
        if getitems is not None:
            self.__getitems__ = clock.wrap(name, getitems)

    def __len__(self):
        return len(self._source)

    def __getitem__(self, i):
        return self._get(i)


class _TimedTransform:
    def __init__(self, transform, clock: _Clock, name: str):
        self._t = transform
        self.apply = clock.wrap(name, transform.apply)

    def __getattr__(self, attr):
        return getattr(self._t, attr)


class _TimedOperator:
    def __init__(self, op, clock: _Clock, name: str):
        self._op = op
        self.step = clock.wrap(name, op.step)
        self.step_block = clock.wrap(name, step_block_of(op))
        self.flush = clock.wrap(name, op.flush)

    def __getattr__(self, attr):
        return getattr(self._op, attr)


class _Leaf:
    """A sampler leaf whose source is timed; everything else is the leaf's."""

    def __init__(self, leaf, source):
        self._leaf = leaf
        self.source = source

    def __getattr__(self, attr):
        return getattr(self._leaf, attr)


def _instrument(plan, batched: BatchedDataset, clock: _Clock) -> None:
    plan.leaves = [
        _Leaf(leaf, _TimedSource(leaf.source, clock, f"read {describe_source(leaf.source)}"))
        for leaf in plan.leaves
    ]
    plan.leaf_transforms = [
        tuple(_TimedTransform(t, clock, f"source {t.describe()}") for t in ts)
        for ts in plan.leaf_transforms
    ]
    plan.operators = [
        _TimedOperator(op, clock, f"{i}. {op.describe()}") for i, op in enumerate(plan.operators, 1)
    ]
    plan.step_blocks = [op.step_block for op in plan.operators]
    plan.post_transforms = [
        tuple(_TimedTransform(t, clock, f"{i}. then {t.describe()}") for t in ts)
        for i, ts in enumerate(plan.post_transforms, 1)
    ]


def time_stages(batched: BatchedDataset, steps: int) -> dict[str, Any]:
    """Runs ``steps`` global batches on one process; seconds per stage and throughput."""
    from zephon_jax.engine.rows import RowProducer, stack_rows

    producer = RowProducer(batched, lambda size: range(size))
    clock = _Clock()
    _instrument(producer.plan, batched, clock)
    done, rows_tokens, stack, rows_done = 0, 0, 0.0, 0
    t0 = time.perf_counter()
    for _ in range(steps):
        rows = producer.next_rows()
        if rows is None:
            break
        t1 = time.perf_counter()
        batch = stack_rows(rows)
        stack += time.perf_counter() - t1
        done += 1
        rows_done += len(rows)
        if isinstance(batch, dict) and "tokens_segment_ids" in batch:
            rows_tokens += int((batch["tokens_segment_ids"] > 0).sum())
    total = time.perf_counter() - t0
    state = state_bytes(producer, batched)
    stages = [(name, clock.seconds[name]) for name in clock.order]
    stages.append(("batch assembly", stack))
    other = max(total - sum(s for _, s in stages), 0.0)
    if producer.plan.columnar is not None:  # the operators' work runs in the kernels
        stages.append(("sampler, cutting and placing (column-wise, compiled)", other))
    else:
        stages.append(("sampler and lane bookkeeping", other))
    return {
        "steps": done,
        "rows": rows_done,
        "seconds": total,
        "stages": stages,
        "tokens": rows_tokens,
        "state": state,
    }


def state_bytes(producer, batched: BatchedDataset) -> list[tuple[str, int, int]]:
    """Encoded bytes of each part of the lanes' states: ``(part, median, max)`` over lanes.

    One part per operator (its saved carry), then the finished rows not yet
    batched, then the whole lane state (with its header and checksum).
    """
    from zephon_jax.state import codec
    from zephon_jax.state.lane_format import LaneSnapshot, encode_lane_state, plain_snapshot

    snapshots = [LaneSnapshot(*plain_snapshot(lane.snapshot())) for lane in producer.lanes.values()]
    lane_ids = list(producer.lanes)
    names = [f"{i}. {s.operator.describe()}" for i, s in enumerate(batched.stages, 1)]
    parts = [[len(codec.encode(snap.carries[i])) for snap in snapshots] for i in range(len(names))]
    parts.append([len(codec.encode(snap.pending)) for snap in snapshots])
    parts.append([len(encode_lane_state(snap, l)) for snap, l in zip(snapshots, lane_ids)])
    names += ["rows not yet batched", "whole lane state"]
    return [(name, int(statistics.median(v)), max(v)) for name, v in zip(names, parts)]


def format_timing(result: dict[str, Any], global_batch_size: Any = None) -> str:
    """Timing as text (``global_batch_size`` is unused: rows are counted)."""
    steps, total = result["steps"], max(result["seconds"], 1e-12)
    out = [f"timing over {steps} global batches (one process, every lane)"]
    width = max([len("stage")] + [len(name) for name, _ in result["stages"]])
    out.append(f"  {'stage':<{width}} {'total s':>8} {'ms/batch':>9} {'share':>6}")
    for name, seconds in result["stages"]:
        per = seconds / max(steps, 1) * 1e3
        out.append(f"  {name:<{width}} {seconds:8.3f} {per:9.2f} {seconds / total:6.1%}")
    out.append(f"  {'total':<{width}} {total:8.3f} {total / max(steps, 1) * 1e3:9.2f}")
    line = f"  {steps / total:.1f} batches/s, {result['rows'] / total:,.0f} rows/s"
    if result["tokens"]:
        line += f", {result['tokens'] / total:,.0f} real tokens/s"
    out.append(line)
    if result.get("state"):
        out.append(f"lane state after {steps} global batches (bytes per lane)")
        out.append(f"  {'part':<56} {'median':>8} {'max':>9}")
        for name, median, most in result["state"]:
            out.append(f"  {name[:56]:<56} {median:8,d} {most:9,d}")
    return "\n".join(out)
