"""numba's on-disk cache serves the compiled kernels to every new process after the first.

Kernels made as closures were compiled again in every process (about 5 s before
the first batch) and each run added cache files. The kernels are module-level
functions now: a second and a third process load every kernel from the cache,
compile none, and write no new cache file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import numpy as np
import zephon_jax as zj
from zephon_jax.sources import TokenArray

rng = np.random.default_rng(0)
docs = [rng.integers(1, 100, int(n)).astype(np.int32) for n in rng.integers(1, 90, 60)]
ds = zj.Dataset.source(TokenArray.from_documents(docs)).shuffle(seed=0).split(32).pack(32)
batch = next(iter(zj.Loader(ds.batch(4))))
print("rows", batch["tokens"].shape)
"""


def run_once(cache: Path) -> str:
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(cache),
        "NUMBA_DEBUG_CACHE": "1",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("ZEPHON_JAX_COMPILED", None)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows (4, 32)" in done.stdout
    return done.stdout + done.stderr


def cache_files(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob("*") if p.suffix in (".nbi", ".nbc"))


def test_new_processes_load_the_kernels_from_the_cache_and_it_does_not_grow(tmp_path):
    first = run_once(tmp_path)
    saved = set(re.findall(r"data saved to '.*?compiled_kernels\.(\w+)-", first))
    assert {"place", "gather", "permute"} <= saved, first[-2000:]
    files = cache_files(tmp_path)
    for _ in range(2):
        again = run_once(tmp_path)
        loaded = set(re.findall(r"data loaded from '.*?compiled_kernels\.(\w+)-", again))
        assert {"place", "gather", "permute"} <= loaded, again[-2000:]
        assert "data saved" not in again, again[-2000:]  # nothing compiled again
        assert cache_files(tmp_path) == files
