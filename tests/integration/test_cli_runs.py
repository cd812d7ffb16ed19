"""The ``zephon-jax`` command end to end: prepare with its worker pool, verify across
processes, the demo and its child processes."""

from __future__ import annotations

import json
import re

import pytest

from zephon_jax.tools.cli import build_parser, main


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
    # What the help says of directories is what prepare does (tests/unit/tools/test_prepare.py).
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
