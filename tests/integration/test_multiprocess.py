"""Real multi-process runs: identical global batches on any topology, and resharding restores.

Every topology (processes x CPU devices per process) runs the packing pipeline
of ``mp_worker.make_pipeline`` under ``jax.distributed`` with gloo collectives
and a 127.0.0.1 coordinator. Each process reports a digest of every row its
devices hold; together they must equal, row for row, the single-process numpy
run. One process launch per topology runs all of its steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mp_worker as worker
import portpicker
import pytest

WORKER_PATH = Path(__file__).resolve().parents[1] / "mp_worker.py"

STEPS = 30
SAVE_AT = 12
LAUNCH_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def reference() -> list[list[str]]:
    """Row digests of global batches 1..STEPS from the single-process numpy loader."""
    import zephon_jax as zj

    it = iter(zj.Loader(worker.make_pipeline()))
    return [worker.batch_digests(next(it)) for _ in range(STEPS)]


def launch(
    tmp_path: Path,
    name: str,
    processes: int,
    devices: int,
    mesh: str,
    batch_axes: str,
    *flags: str,
    hold: bool = False,
) -> list[dict]:
    """Starts ``processes`` workers and returns their reports.

    With ``hold`` the workers wait after saving; they are killed once all reported.
    """
    port = portpicker.pick_unused_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    outs = [tmp_path / f"{name}-{i}.json" for i in range(processes)]
    logs = [open(tmp_path / f"{name}-{i}.log", "w") for i in range(processes)]
    common = [
        f"--devices={devices}",
        f"--num-processes={processes}",
        f"--port={port}",
        f"--mesh={mesh}",
        f"--batch-axes={batch_axes}",
        f"--steps={STEPS}",
        *flags,
    ] + (["--hold"] if hold else [])
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER_PATH), f"--process-id={i}", f"--out={outs[i]}", *common],
            stdout=logs[i],
            stderr=subprocess.STDOUT,
            env=env,
        )
        for i in range(processes)
    ]
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if hold and all(out.exists() for out in outs):
                assert all(p.poll() is None for p in procs), "a holding worker exited by itself"
                break
            if not hold and all(p.poll() is not None for p in procs):
                break
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for log in logs:
            log.close()
    failed = [
        i for i, p in enumerate(procs) if (p.returncode != 0 and not hold) or not outs[i].exists()
    ]
    if failed:
        log = (tmp_path / f"{name}-{failed[0]}.log").read_text()[-4000:]
        pytest.fail(
            f"{name}: workers {failed} failed (codes {[p.returncode for p in procs]}):\n{log}"
        )
    return [json.loads(out.read_text()) for out in outs]


def assert_batches_equal(reports: list[dict], reference, run: str, steps: range) -> None:
    """Every row of every global batch in ``steps`` equals the reference, on every replica."""
    for step in steps:
        batch = len(reference[step - 1])
        seen: dict[int, list[str]] = {}
        for report in reports:
            for row, digests in report["runs"][run][str(step)].items():
                seen.setdefault(int(row), []).extend(digests)
        assert sorted(seen) == list(range(batch)), f"{run} step {step}: rows {sorted(seen)}"
        for row in range(batch):
            assert set(seen[row]) == {reference[step - 1][row]}, f"{run} step {step}, row {row}"


def assert_rows_loaded_once(reports: list[dict], num_lanes: int) -> None:
    """Each process loads exactly the rows its devices hold; each lane is saved by one process."""
    for report in reports:
        held = sorted({r for rows in report["device_rows"].values() for r in rows})
        assert report["rows"] == held
        assert len(set(report["rows"])) == len(report["rows"])
    if "lanes_to_save" in reports[0]:
        saved = [lane for report in reports for lane in report["lanes_to_save"]]
        assert sorted(saved) == list(range(num_lanes))


TOPOLOGIES = [
    # processes, devices per process, mesh, batch axes, device prefetch
    (1, 8, "data=4,fsdp=2", "data,fsdp", 2),
    (2, 4, "data=2,fsdp=2,tensor=2", "data,fsdp", 3),
    (4, 2, "data=8", "data", 2),
    (8, 1, "data=4,tensor=2", "data", 0),
]


@pytest.mark.parametrize(
    "processes,devices,mesh,batch_axes,prefetch",
    TOPOLOGIES,
    ids=[f"{p}x{d}" for p, d, *_ in TOPOLOGIES],
)
def test_topology_matches_single_device(
    tmp_path, reference, processes, devices, mesh, batch_axes, prefetch
):
    reports = launch(
        tmp_path,
        "run",
        processes,
        devices,
        mesh,
        batch_axes,
        "--fresh",
        f"--prefetch={prefetch}",
    )
    assert_batches_equal(reports, reference, "fresh", range(1, STEPS + 1))
    assert_rows_loaded_once(reports, worker.GLOBAL_BATCH)


def test_checkpoint_on_4x2_resumes_on_2x2_and_1x8(tmp_path, reference):
    ckpt = str(tmp_path / "ckpt")
    saved = launch(
        tmp_path,
        "save",
        4,
        2,
        "data=8",
        "data",
        "--fresh",
        f"--ckpt={ckpt}",
        f"--save-at={SAVE_AT}",
        "--async-save",
        hold=True,
    )
    assert_batches_equal(saved, reference, "fresh", range(1, SAVE_AT + 1))
    item = Path(ckpt) / str(SAVE_AT) / "data"
    assert sorted(p.name for p in item.glob("lane_*.bin")) == [
        f"lane_{lane:05d}.bin" for lane in range(worker.GLOBAL_BATCH)
    ]
    assert not list(item.glob("*process*"))
    meta = json.loads((item / "meta.json").read_text())
    assert meta["step"] == SAVE_AT and meta["num_lanes"] == worker.GLOBAL_BATCH

    for name, processes, devices, mesh in (
        ("resume2x2", 2, 2, "data=2,tensor=2"),
        ("resume1x8", 1, 8, "data=2,tensor=4"),
    ):
        reports = launch(
            tmp_path, name, processes, devices, mesh, "data", "--resume", f"--ckpt={ckpt}"
        )
        assert all(r["restored_step"] == SAVE_AT and r["params_restored"] for r in reports)
        assert_batches_equal(reports, reference, "resumed", range(SAVE_AT + 1, STEPS + 1))
        assert_rows_loaded_once(reports, worker.GLOBAL_BATCH)


def test_finite_input_ends_at_the_same_step_on_every_process(tmp_path):
    """Lanes run dry at different steps; every process stops at the single-process end."""
    import zephon_jax as zj

    expected = [worker.batch_digests(b) for b in zj.Loader(worker.make_pipeline(num_epochs=1))]
    assert 1 < len(expected) < STEPS
    reports = launch(tmp_path, "finite", 2, 2, "data=4", "data", "--fresh", "--epochs=1")
    for report in reports:
        assert sorted(map(int, report["runs"]["fresh"])) == list(range(1, len(expected) + 1))
    assert_batches_equal(reports, expected, "fresh", range(1, len(expected) + 1))


def _batches_of_rows(ds, rows: list[int]) -> int:
    """How many batches the lanes behind ``rows`` alone complete before the input ends."""
    from zephon_jax.engine.rows import RowProducer

    producer = RowProducer(ds, rows, agree_on_end=False)
    count = 0
    while producer.next_rows() is not None:
        count += 1
    return count


def _summed_provenance(it, batches: int) -> dict:
    """Per source label: ``tokens``, ``segments``, ``documents`` and the highest ``epoch``
    of the first ``batches`` batches of iterator ``it``, summed from their provenance."""
    out: dict = {}
    for _ in range(batches):
        next(it)
        for row in it.provenance():
            for s in row:
                figures = out.setdefault(
                    s["label"],
                    {"source": s["source"], "tokens": 0, "segments": 0, "documents": 0},
                )
                figures["tokens"] += s["stop"] - (s["start"] or 0)
                figures["segments"] += 1
                figures["documents"] += s["start"] in (0, None)
                figures["epoch"] = max(figures.get("epoch", s["epoch"]), s["epoch"])
    return out


@pytest.mark.parametrize(
    "workers,prefetch",
    [(0, 0), (2, 0), (2, 2)],
    ids=["in-process", "2-workers", "2-workers-device-prefetch"],
)
def test_end_reports_the_last_delivered_batch(tmp_path, monkeypatch, workers, prefetch):
    """One process's lanes end a batch before the other's (with and without device prefetch
    and loader worker processes): after the StopIteration, each process's state and
    accounting are those of the last delivered batch, and their merged accounting is the
    single-process one at that step, which is its summed provenance; provenance() still
    describes the last delivered batch."""
    import zephon_jax as zj

    # The processes import this checkout's zephon_jax, whatever is installed.
    root = str(Path(zj.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    ds = worker.make_pipeline(num_epochs=1)
    flags = ["--to-end", "--epochs=1", f"--prefetch={prefetch}", f"--workers={workers}"]
    reports = launch(tmp_path, "end", 2, 2, "data=4", "data", *flags)
    made = [_batches_of_rows(ds, report["rows"]) for report in reports]
    end = min(made)
    assert made[0] != made[1], f"the lanes of both processes end together: {made}"
    one = iter(zj.Loader(ds))
    for _ in range(end):
        next(one)
    last = one.provenance()
    assert next(one, None) is None
    for i, report in enumerate(reports):
        assert report["last"]["step"] == report["after"]["step"] == end
        assert report["after"]["accounting"] == report["last"]["accounting"], f"process {i}"
        out = tmp_path / f"end-{i}.json"
        after = Path(f"{out}.after.zjs").read_bytes()
        assert after == Path(f"{out}.last.zjs").read_bytes(), f"process {i}: state"
        assert report["after"]["provenance"] == [last[r] for r in report["rows"]], f"process {i}"
    merged = zj.merge_accounting([r["after"]["accounting"] for r in reports])
    assert merged == one.accounting()
    assert merged["steps"] == end
    assert merged["sources"] == _summed_provenance(iter(zj.Loader(ds)), end)


def test_staged_token_mixture_with_ramp_on_2x2_resumes_on_1x2(tmp_path):
    """The schedule pipeline under jax.distributed, saved after 5 batches (past the first size
    change) and resumed on one process, across the first stage change and the second ramp."""
    from pipelines import schedule_pipeline

    import zephon_jax as zj

    dataset = schedule_pipeline(sizes=worker.SCHEDULE_SIZES)
    reference = [worker.batch_digests(b) for _, b in zip(range(STEPS), zj.Loader(dataset))]
    ckpt = str(tmp_path / "ckpt")
    saved = launch(
        tmp_path,
        "sched",
        2,
        2,
        "data=4",
        "data",
        "--schedule",
        "--fresh",
        f"--ckpt={ckpt}",
        "--save-at=5",
    )
    assert_batches_equal(saved, reference, "fresh", range(1, STEPS + 1))
    assert_rows_loaded_once(saved, dataset.num_lanes)
    resumed = launch(
        tmp_path,
        "sched-resume",
        1,
        2,
        "data=2",
        "data",
        "--schedule",
        "--resume",
        f"--ckpt={ckpt}",
    )
    assert all(r["restored_step"] == 5 for r in resumed)
    assert_batches_equal(resumed, reference, "resumed", range(6, STEPS + 1))
