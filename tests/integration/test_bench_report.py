"""The benchmark's set report: medians and min-max over runs, and the generated doc blocks."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import report  # noqa: E402


def _run(ratio, rate, windows):
    return {
        "default": {
            "machine": {"load_average_at_start": [1.0, 1.0, 1.0]},
            "llm": {
                "sides": {
                    "zephon_jax": {"rate_median": rate, "rates": windows, "fill": 0.99},
                    "grain": {"rate_median": rate / ratio, "rates": windows, "fill": 0.98},
                },
                "ratio_to_grain": ratio,
            },
        }
    }


def _write_set(tmp_path, runs):
    meta = {
        "started": "2026-01-01T00:00:00+00:00",
        "mode": "full",
        "environment": {
            "python": "3.11.7",
            "versions": dict.fromkeys(
                ("zephon_jax", "grain", "numpy", "jax", "jaxlib", "numba"), "1.0"
            ),
            "cpu_model": "Test CPU",
            "cpu_count": 2,
            "platform": "Linux",
        },
        "runs": [],
    }
    for i, run in enumerate(runs, 1):
        (tmp_path / f"run-{i}").mkdir()
        (tmp_path / f"run-{i}" / "default.json").write_text(json.dumps(run["default"]))
        meta["runs"].append({"index": i, "default": f"run-{i}/default.json"})
    (tmp_path / "set.json").write_text(json.dumps(meta))
    return tmp_path


def test_every_figure_is_the_median_with_the_range_of_the_runs(tmp_path):
    runs = [_run(2.0, 6e6, [1.0, 99e6]), _run(9.0, 4e6, [1.0]), _run(3.0, 5e6, [2.0])]
    fig = report.figures(str(_write_set(tmp_path, runs)))
    stat = fig("default", "llm", "ratio_to_grain")
    assert (stat.median, stat.lo, stat.hi, stat.n) == (3.0, 2.0, 9.0, 3)
    assert fig("default", "llm", "sides", "zephon_jax", "rate_median").median == 5e6
    # per-window lists are a run's own spread, not figures of the set
    assert not any("rates" in key.split(report.SEP) for key in fig.agg)
    table = report.documented_table(fig)
    assert "3.0x (2.0-9.0)" in table and "5.0 M (4.0-6.0)" in table
    assert "9.0x |" not in table  # never the best run alone


def test_update_text_rewrites_only_the_marked_blocks(tmp_path):
    fig = report.figures(str(_write_set(tmp_path, [_run(2.0, 6e6, [1.0]), _run(4.0, 8e6, [1.0])])))
    text = (
        "Intro 20x.\n<!-- report:documented -->\nplaceholder\n<!-- /report:documented -->\n"
        "Middle.\n<!-- report:environment -->old<!-- /report:environment -->\nEnd.\n"
    )
    new = report.update_text(text, fig, "benchmarks/results")
    assert new.startswith("Intro 20x.\n<!-- report:documented -->\n")
    assert "placeholder" not in new and "old" not in new
    assert "3.0x (2.0-4.0)" in new and "Test CPU, 2 cores" in new
    assert "from benchmarks/results -->" in new
    assert "-->\nMiddle.\n" in new and new.endswith("-->\nEnd.\n")
    assert report.update_text(new, fig, "benchmarks/results") == new  # idempotent
    with pytest.raises(SystemExit, match="unknown report block 'nosuch'"):
        report.update_text("<!-- report:nosuch -->x<!-- /report:nosuch -->", fig, "s")


def test_a_directory_without_a_set_says_how_to_make_one(tmp_path):
    with pytest.raises(SystemExit, match="run_set.py --runs 5"):
        report.figures(str(tmp_path))


def test_a_figure_block_names_its_plot_only_once_it_is_drawn(tmp_path):
    pending = report.figure_block("figure_packing", str(tmp_path))
    assert "plot pending" in pending and "{figure}" not in pending
    (tmp_path / "bench_vs_grain.png").write_bytes(b"png")
    drawn = report.figure_block("figure_packing", str(tmp_path))
    assert drawn.startswith("```{figure} _static/bench_vs_grain.png\n:alt: ")
