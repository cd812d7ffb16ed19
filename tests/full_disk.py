"""Runs ``zephon-jax prepare`` onto a real, small filesystem that fills up, then gives it room.

Started by ``tests/integration/test_prepare_runs.py`` as root, or inside a user and mount namespace
(``unshare --user --map-root-user --mount``) where the tests do not run as root:
either way it may mount. Steps, each recorded in ``RESULT/report.json``:

1. mount a tmpfs of ``--small`` bytes at ``MOUNT``;
2. run the prepare command (``-- ARGS``) with output ``MOUNT/out``: the disk fills up;
3. copy what it left to ``RESULT/partial``;
4. remount the tmpfs with ``--big`` bytes (the same path, now with room);
5. run the same command again, copy the output to ``RESULT/done``, unmount.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path


def prepare(args: list[str], out: Path, env_path: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "zephon_jax.tools.cli", "prepare", *args, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
    )
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mount", type=Path)
    p.add_argument("result", type=Path)
    p.add_argument("--small", required=True)
    p.add_argument("--big", required=True)
    p.add_argument("--pythonpath", default="")
    argv = sys.argv[1:]
    split = argv.index("--")
    a = p.parse_args(argv[:split])
    args = argv[split + 1 :]
    a.mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={a.small}", "tmpfs", str(a.mount)], check=True
    )
    report = {}
    try:
        out = a.mount / "out"
        report["full"] = prepare(args, out, a.pythonpath)
        shutil.copytree(out, a.result / "partial")
        subprocess.run(["mount", "-o", f"remount,size={a.big}", str(a.mount)], check=True)
        report["again"] = prepare(args, out, a.pythonpath)
        shutil.copytree(out, a.result / "done")
    finally:
        subprocess.run(["umount", str(a.mount)], check=False)
    (a.result / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
