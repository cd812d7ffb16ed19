"""The ``zephon-jax`` command: help, inspect and verify in this process (their end-to-end
runs, with processes and the demo, are in tests/integration/test_cli_runs.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from zephon_jax.tools.cli import build_parser, main


def test_help_is_complete(capsys):
    out = subprocess.run(
        ["zephon-jax", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("demo", "prepare", "inspect", "verify", "explain"):
        assert command in out
    expected = {
        "demo": ["--steps", "--quick", "--devices", "--devices-per-host", "--resume-at"],
        "prepare": [
            "--to",
            "--text-field",
            "--lines",
            "--tokenizer",
            "--strict",
            "--workers",
            "--overwrite",
            "resume",
        ],
        "inspect": ["MODULE:FUNCTION", "--steps", "carry bounds"],
        "verify": ["--topologies", "--resume-at", "--steps", "Exit status"],
        "explain": ["--step", "--row", "--state", "--decode", "checkpoint directory"],
    }
    for command, words in expected.items():
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        for word in words:
            assert word in text, (command, word)
    assert main([]) == 2
    assert set(build_parser()._subparsers._group_actions[0].choices) == {
        "demo",
        "prepare",
        "inspect",
        "verify",
        "explain",
    }


def test_inspect_prints_the_plan_and_timing(pipelines, capsys):
    from zephon_jax.tools.inspect_plan import load_pipeline, short_fingerprint

    assert main(["inspect", f"{pipelines}:pure", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "weight 0.750" in out and "weight 0.250" in out and "list(len=200)" in out
    assert "then map(user_pipelines.double)" in out
    for i, (op, bound) in enumerate(
        [
            ("split(max_len=24, key='tokens')", "none (pieces are emitted at once)"),
            ("pack(seq_len=24, method='first_fit', num_bins=3)", "3 open rows of 24"),
            ("window_shuffle(window=4, seed=9)", "4 element pointers"),
        ],
        1,
    ):
        assert f"{i}. {op}" in out
        assert f"carry bound: {bound}" in out
    assert "8 rows per global batch, 4 lanes, 2 row(s) per lane" in out
    assert f"fingerprint: {short_fingerprint(load_pipeline(pipelines + ':pure'))}" in out
    assert "timing over 5 global batches" in out
    timing = out[out.index("timing over") :]
    for stage in (
        "read list(len=200)",
        "1. split",
        "2. pack",
        "3. window_shuffle",
        "batch assembly",
    ):
        assert stage in timing
    assert "real tokens/s" in timing
    state = out[out.index("lane state after 5 global batches") :]
    for part in ("1. split", "2. pack", "3. window_shuffle", "rows not yet batched"):
        assert part in state
    whole = re.search(r"whole lane state +([\d,]+) +([\d,]+)", state)
    assert whole and 0 < int(whole.group(2).replace(",", "")) < 4096, state
    assert main(["inspect", f"{pipelines}:unbatched"]) == 1
    assert "without a batch size" in capsys.readouterr().err


@pytest.mark.parametrize("pipeline", ["coin_flip", "counter"])
def test_verify_catches_a_non_deterministic_function(pipelines, capsys, pipeline):
    code = main(["verify", f"{pipelines}:{pipeline}", "--topologies", "1x0,2x0", "--steps", "10"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert re.search(r"DIFFERS at step \d+, row \d+, field 'tokens'", out)
    assert "not a pure function" in out


def test_verify_reports_the_first_differing_row():
    from zephon_jax.tools.verify import compare_batches

    a = {"x": np.zeros((4, 3), np.int32), "y": np.ones((4, 2), np.int32)}
    b = {"x": a["x"].copy(), "y": a["y"].copy()}
    assert compare_batches(5, a, b) is None
    b["y"][2, 1] = 7
    b["x"][3, 0] = 1
    diff = compare_batches(5, a, b)
    assert (diff.step, diff.row, diff.field) == (5, 2, "y")


def test_inspect_shows_whole_stage_names(pipelines, capsys):
    assert main(["inspect", f"{pipelines}:long_names", "--steps", "2"]) == 0
    timing = capsys.readouterr().out.split("timing over")[1]
    name = "1. then map(user_pipelines.a_map_function_with_a_name_much_longer_than_any_column_of_a_table)"
    line = next(line for line in timing.splitlines() if "a_map_function" in line)
    assert line.strip().startswith(name), line
    # the columns stay aligned under the longest name
    header = next(line for line in timing.splitlines() if "total s" in line)
    first_number = re.search(r"\d+\.\d+", line[line.index(name) + len(name) :])
    assert (
        header.index("total s") + len("total s")
        == line.index(name) + len(name) + first_number.end()
    )


@pytest.mark.parametrize("topologies", ["1x0,3x0", "2x0,5x1"])
def test_verify_rejects_a_topology_that_cannot_hold_the_batch(pipelines, capsys, topologies):
    """Checked before anything runs: exit 2 (bad arguments), no blame on user functions."""
    code = main(["verify", f"{pipelines}:pure", "--topologies", topologies])
    out, err = capsys.readouterr()
    assert code == 2
    bad = topologies.split(",")[1]
    assert f"topology {bad} cannot hold a global batch of 8 rows" in err
    assert "use 1, 2, 4, 8 processes" in err
    assert "pure function" not in out + err and out == ""


def test_verify_help_says_2_means_bad_arguments():
    text = build_parser()._subparsers._group_actions[0].choices["verify"].format_help()
    assert "2 bad arguments" in text and "cannot hold the batch" in text


def test_verify_rejects_a_malformed_topology(pipelines, capsys):
    assert main(["verify", f"{pipelines}:pure", "--topologies", "1x0,two"]) == 2
    assert "'two' is not PROCESSESxWORKERS" in capsys.readouterr().err


def test_builtin_only_options_need_the_builtin_pipeline(pipelines):
    with pytest.raises(SystemExit, match="apply to the built-in pipeline only"):
        main(["inspect", f"{pipelines}:pure", "--quick"])


def test_sources_is_loaded_lazily():
    code = (
        "import sys, zephon_jax as zj\n"
        "assert 'zephon_jax.sources' not in sys.modules and 'tensorstore' not in sys.modules\n"
        "assert zj.sources.TokenStore is sys.modules['zephon_jax.sources'].TokenStore\n"
        "assert {'sources', 'checkpoint'} <= set(dir(zj))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
