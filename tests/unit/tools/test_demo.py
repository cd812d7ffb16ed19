"""``zephon-jax demo``'s pieces on tiny in-memory sources: its pipeline, the batch
fingerprint, the options and their errors (the whole demo, with its processes:
tests/integration/test_cli_runs.py)."""

from __future__ import annotations

import argparse
import hashlib

import numpy as np
import pytest

import zephon_jax as zj
from zephon_jax.tools.demo import (
    DemoConfig,
    add_arguments,
    batch_fingerprint,
    build_pipeline,
    config_from_args,
    grain_per_host,
    real_tokens,
    run_demo,
    zephon_throughput,
)

CFG = DemoConfig(global_batch_size=4, seq_len=8, num_bins=2)


def docs(first, lengths):
    """Documents of consecutive ids from ``first``, one per length."""
    starts = first + np.concatenate([[0], np.cumsum(lengths)])
    return [{"tokens": np.arange(a, b, dtype=np.int32)} for a, b in zip(starts, starts[1:])]


LIBRARY = docs(2, [5, 12, 3, 13, 7])  # ids 2..41
TESTS = docs(100, [9, 1, 20])  # ids 100..129


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_the_pipeline_mixes_both_parts_into_packed_rows():
    ds = build_pipeline(CFG, (LIBRARY, TESTS))
    assert "split(max_len=8, key='tokens') -> pack(seq_len=8, method='first_fit', num_bins=2)" in (
        repr(ds)
    )
    assert ds.batch_sizes == (4,)
    it = iter(zj.Loader(ds))
    batches = [next(it) for _ in range(6)]
    for b in batches:
        assert b["tokens"].shape == (4, 8) and set(b) == {
            "tokens",
            "tokens_segment_ids",
            "tokens_positions",
        }
        real = b["tokens_segment_ids"] > 0
        assert (b["tokens"][~real] == 0).all()  # padding
        assert real_tokens(b) == int(real.sum())
    ids = np.concatenate([b["tokens"][b["tokens_segment_ids"] > 0] for b in batches])
    assert (ids < 100).any() and (ids >= 100).any()  # both parts are drawn
    assert set(ids.tolist()) <= set(range(2, 42)) | set(range(100, 130))


def test_the_pipeline_follows_the_seed_only():
    def first(cfg):
        return batch_fingerprint(next(iter(zj.Loader(build_pipeline(cfg, (LIBRARY, TESTS))))))

    assert first(CFG) == first(CFG)
    assert first(DemoConfig(global_batch_size=4, seq_len=8, num_bins=2, seed=1)) != first(CFG)


def test_the_fingerprint_by_hand():
    batch = {"x": np.array([1], np.uint8)}
    assert batch_fingerprint(batch) == hashlib.sha256(b"x:|u1:(1,);\x01").hexdigest()[:8]
    two = {"b": np.array([[5]], np.int16), "a": np.array([7], np.uint8)}
    want = hashlib.sha256(b"a:|u1:(1,);\x07b:<i2:(1, 1);\x05\x00").hexdigest()[:8]
    assert batch_fingerprint(two) == want  # fields sorted by name
    assert batch_fingerprint(dict(reversed(list(two.items())))) == want
    assert batch_fingerprint({"x": np.array([[1]], np.uint8)}) != batch_fingerprint(batch)
    assert batch_fingerprint({"x": np.array([1], np.int8)}) != batch_fingerprint(batch)


def test_real_tokens_counts_positive_segment_ids():
    assert real_tokens({"tokens_segment_ids": np.array([[1, 1, 2, 0], [0, 0, 0, 0]])}) == 3


def test_default_options():
    assert parse() == DemoConfig(
        steps=16,
        resume_at=6,
        global_batch_size=16,
        seq_len=1024,
        devices=(8, 4, 2),
        devices_per_host=2,
        max_files=None,
        cache_dir=None,
        throughput_steps=200,
    )


def test_quick_options_shrink_the_run():
    cfg = parse("--quick", "--steps", "20", "--devices", "4,2", "--cache-dir", "/c")
    assert (cfg.steps, cfg.resume_at, cfg.seq_len, cfg.max_files) == (8, 3, 256, 60)
    assert (cfg.devices, cfg.cache_dir, cfg.throughput_steps) == ((4, 2), "/c", 20)
    assert parse("--quick", "--steps", "2", "--seq-len", "64").seq_len == 64
    assert parse("--steps", "2").resume_at == 1  # 2 * 3 // 8 = 0, at least 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--devices", "8"], "--devices needs at least two positive counts"),
        (["--devices", "8,0"], "--devices needs at least two positive counts"),
        (["--steps", "4", "--resume-at", "4"], r"--resume-at must be below --steps \(4\)"),
        (["--quick", "--resume-at", "8"], r"--resume-at must be below --steps \(8\)"),
        (["--batch-size", "12"], "--batch-size 12 is not a multiple of 8 devices"),
        (
            ["--batch-size", "6", "--devices", "2,3,4"],
            "--batch-size 6 is not a multiple of 4 devices",
        ),
    ],
)
def test_options_that_cannot_work_together_are_refused(argv, message):
    with pytest.raises(SystemExit, match=f"zephon-jax demo: {message}"):
        parse(*argv)


def test_run_demo_checks_the_resume_step_before_any_work():
    for resume_at in (0, 16):
        with pytest.raises(ValueError, match=r"resume_at must be in \[1, steps\)"):
            run_demo(DemoConfig(resume_at=resume_at, cache_dir="/nonexistent"))


def test_grain_hosts_must_split_the_batch():
    with pytest.raises(ValueError, match="3 hosts cannot split a batch of 4"):
        grain_per_host(CFG, (LIBRARY, TESTS), 3, 1)


def test_throughput_is_tokens_per_second():
    assert zephon_throughput(CFG, (LIBRARY, TESTS), 2) > 0
