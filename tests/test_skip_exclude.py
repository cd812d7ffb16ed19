"""Skipping global batches: ``it.skip(n)`` continues with the uninterrupted run's batches,
on any topology, recorded in the state (and accepted by ``zephon-jax explain``)."""

from __future__ import annotations

import pytest
from pipelines import assert_batches_equal
from test_accounting import mixed, run_global

import zephon_jax as zj


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
