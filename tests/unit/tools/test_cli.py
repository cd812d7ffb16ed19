"""The ``zephon-jax`` command: help, prepare, inspect, verify and the demo."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from zephon_jax.tools.cli import build_parser, main

PIPELINES = '''
import itertools
import random

import numpy as np

import zephon_jax as zj


def docs():
    rng = np.random.default_rng(0)
    return [
        {"tokens": rng.integers(2, 250, int(rng.integers(1, 70))).astype(np.int32)}
        for _ in range(300)
    ]


def double(record):
    return {"tokens": record["tokens"] * 2}


def pure():
    d = docs()
    a = zj.Dataset.source(d[:200]).map(double)
    b = zj.Dataset.source(d[200:])
    return (
        zj.Dataset.mix([a, b], [0.75, 0.25]).shuffle(7).split(24)
        .pack(24, method="first_fit", num_bins=3).window_shuffle(4, 9).batch(8, num_lanes=4)
    )


class CoinFlip(zj.Operator):
    """Not deterministic: draws from the global random module."""

    def init(self):
        return 0

    def step(self, carry, record):
        tokens = record["tokens"].copy()
        if random.random() < 0.2:
            tokens[0] += 1
        return carry, [{"tokens": tokens}]


def coin_flip():
    return zj.Dataset.source(docs()).shuffle(1).apply(CoinFlip()).split(24).pack(24).batch(8)


_counter = itertools.count()


def stamp(record):
    return {"tokens": record["tokens"] + next(_counter)}  # never the same twice


def counter():
    return zj.Dataset.source(docs()).map(stamp).split(24).pack(24).batch(4)


def unbatched():
    return zj.Dataset.source(docs())


def a_map_function_with_a_name_much_longer_than_any_column_of_a_table(record):
    return record


def long_names():
    return (
        zj.Dataset.source(docs())
        .split(24)
        .map(a_map_function_with_a_name_much_longer_than_any_column_of_a_table)
        .pack(24)
        .batch(4)
    )
'''


@pytest.fixture
def pipelines(tmp_path, monkeypatch):
    (tmp_path / "user_pipelines.py").write_text(PIPELINES)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_pipelines", None)
    yield "user_pipelines"
    sys.modules.pop("user_pipelines", None)


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


def test_prepare_command(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "hello"}\n{"text": 3}\n{"text": "world!"}\n')
    out = tmp_path / "out"
    assert main(["prepare", str(src), "-o", str(out), "--workers", "0", "--to", "both"]) == 0
    captured = capsys.readouterr()
    assert f"{src}:2: field 'text' is int, not a string" in captured.err
    assert re.search(r"documents\s+2\b", captured.out)
    assert re.search(r"tokens\s+11\b", captured.out)
    assert "1 bad" in captured.out and "p50 5" in captured.out and "max 6" in captured.out
    assert main(["prepare", str(src), "-o", str(out), "--strict", "--overwrite"]) == 1
    assert "docs.jsonl:2" in capsys.readouterr().err


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
    assert whole and 0 < int(whole.group(2).replace(",", "")) < 2048, state
    assert main(["inspect", f"{pipelines}:unbatched"]) == 1
    assert "without a batch size" in capsys.readouterr().err


def test_verify_passes_a_pure_pipeline(pipelines, capsys):
    code = main(
        [
            "verify",
            f"{pipelines}:pure",
            "--topologies",
            "1x0,2x0,4x1",
            "--steps",
            "8",
            "--resume-at",
            "3",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("identical") >= 6
    assert "2x0 @3 -> 4x1" in out and "4x1 @3 -> 1x0" in out


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


def test_demo_quick(tmp_path, capsys):
    code = main(
        [
            "demo",
            "--quick",
            "--steps",
            "5",
            "--resume-at",
            "2",
            "--batch-size",
            "8",
            "--devices",
            "4,2",
            "--cache-dir",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line for line in out.splitlines() if re.match(r"\s+\d+\s+[0-9a-f]{8}\s", line)]
    assert len(rows) == 5
    for line in rows:
        step, ref, resumed, *_ = line.split()
        if int(step) >= 2:
            assert resumed == ref, line
        else:
            assert resumed == "-"
    assert "identical, bit for bit" in out
    assert "per-host Grain: batches change with the host count" in out
    assert "throughput" in out
    assert json.loads((next(tmp_path.rglob("prepare.json"))).read_text())["complete"]


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


def test_verify_and_inspect_default_to_the_builtin_pipeline(tmp_path, capsys):
    """No MODULE:FUNCTION needed: a fresh install can run both on the built-in corpus."""
    cache = ["--quick", "--cache-dir", str(tmp_path)]
    code = main(["verify", *cache, "--topologies", "1x0,2x0,4x1", "--steps", "6"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("verify the built-in corpus pipeline of `zephon-jax demo` (--quick)")
    assert "all 6 runs are identical to the reference, bit for bit" in out
    assert main(["inspect", *cache, "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "weight 0.700  TokenStore(" in out and "weight 0.300  TokenStore(" in out
    assert "pack(seq_len=256, method='first_fit', num_bins=8)" in out
    assert "16 rows per global batch, 16 lanes" in out and "timing over 3 global batches" in out


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


def test_demo_child_ignores_a_zephon_jax_folder_in_the_cwd(tmp_path, monkeypatch):
    """Run from the folder that holds a clone named ``zephon_jax``, the demo's child
    processes still import the package the parent uses (not the folder)."""
    from zephon_jax.tools import demo

    clone = tmp_path / "zephon_jax"
    clone.mkdir()
    (clone / "__init__.py").write_text("")  # a folder named like the package, not it
    monkeypatch.chdir(tmp_path)
    cfg = demo.DemoConfig(
        steps=2,
        resume_at=1,
        global_batch_size=2,
        seq_len=64,
        devices=(2, 1),
        max_files=4,
        cache_dir=str(tmp_path / "cache"),
    )
    proc = demo._start_child(cfg, 1, "save", str(tmp_path / "ckpt"))
    result = demo._finish_child(proc, "child")
    assert result["devices"] == 1
    assert len(result["fingerprints"]) == 2


def test_prepare_num_workers_is_a_hidden_deprecated_alias_of_workers(tmp_path, capsys):
    parser = build_parser()
    prep = parser._subparsers._group_actions[0].choices["prepare"]
    text = prep.format_help()
    assert "--workers" in text and "--num-workers" not in text
    assert "--eos-id" in text
    # What the help says of directories is what prepare does (tests/test_prepare.py).
    assert "its other files are skipped, and listed in a note" in " ".join(text.split())
    data = tmp_path / "a.jsonl"
    data.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)))
    assert main(["prepare", str(data), "-o", str(tmp_path / "old"), "--num-workers", "1"]) == 0
    assert "--num-workers is deprecated; use --workers" in capsys.readouterr().err
    assert main(["prepare", str(data), "-o", str(tmp_path / "new"), "--workers", "1"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert (tmp_path / "old" / "prepare.json").is_file()
    with pytest.raises(SystemExit, match="disagree"):
        main(
            [
                "prepare",
                str(data),
                "-o",
                str(tmp_path / "x"),
                "--workers",
                "2",
                "--num-workers",
                "1",
            ]
        )
