"""Orbax integration: ``zephon_jax.checkpoint.Save`` / ``Restore`` in a ``CheckpointManager``."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import mp_worker as worker
import numpy as np
import orbax.checkpoint as ocp
import pytest
from pipelines import assert_batch_equal

import zephon_jax as zj
import zephon_jax.checkpoint as zc

HERE = Path(__file__).resolve().parents[1]  # tests/, where fault_trainer.py is
ROOT = HERE.parent

STEPS = 10


@pytest.fixture(scope="module")
def reference(dataset):
    it = iter(zj.Loader(dataset))
    return [next(it) for _ in range(STEPS)]


def manager(path, async_save: bool) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=async_save)
    return ocp.CheckpointManager(path, options=options)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_save_and_restore_with_model_state(tmp_path, dataset, reference, sharding, async_save):
    params = {"w": jnp.arange(6.0), "b": jnp.ones((2, 3))}
    it = iter(zj.Loader(dataset, sharding=sharding, device_prefetch=2))
    with manager(tmp_path / "ckpt", async_save) as mngr:
        for _ in range(4):
            next(it)
        mngr.save(4, args=ocp.args.Composite(state=ocp.args.StandardSave(params), data=zc.Save(it)))
        for _ in range(3):  # training goes on while an async save writes
            next(it)
        mngr.wait_until_finished()
        item = tmp_path / "ckpt" / "4" / "data"
        lanes = sorted(p.name for p in item.glob("lane_*.bin"))
        assert lanes == [zc.lane_file(lane) for lane in range(worker.GLOBAL_BATCH)]
        meta = json.loads((item / "meta.json").read_text())
        assert meta["step"] == 4 and meta["fingerprint"] == dataset.fingerprint()

        restored_it = iter(zj.Loader(dataset, sharding=sharding))
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, params)
        restored = mngr.restore(
            4,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), data=zc.Restore(restored_it)
            ),
        )
    assert restored["data"] is restored_it and restored_it.step == 4
    assert all(np.array_equal(restored["state"][k], params[k]) for k in params)
    for want in reference[4:]:
        assert_batch_equal(next(restored_it), want)


def save_from_two_processes(tmp_path, dataset, steps: int):
    """Two simulated processes each run ``steps`` batches and save their lanes into one item."""
    directory = tmp_path / "item"
    directory.mkdir()
    handler = zc.LoaderCheckpointHandler()
    for process in range(2):
        it = iter(zj.Loader(dataset, process_index=process, process_count=2))
        for _ in range(steps):
            next(it)
        half = dataset.num_lanes // 2
        assert it.loader.lanes_to_save() == list(range(half * process, half * (process + 1)))
        handler.save(directory, args=zc.Save(it))
    return directory, handler


def test_each_process_writes_its_own_lanes_and_any_count_restores(tmp_path, dataset, reference):
    """Two processes write their lanes into one item; one and four processes restore it."""
    directory, handler = save_from_two_processes(tmp_path, dataset, steps=3)
    assert len(list(directory.glob("lane_*.bin"))) == worker.GLOBAL_BATCH

    whole = handler.restore(directory, args=zc.Restore(iter(zj.Loader(dataset))))
    assert_batch_equal(next(whole), reference[3])
    parts = []
    for process in range(4):
        it = iter(zj.Loader(dataset, process_index=process, process_count=4))
        parts.append(next(handler.restore(directory, args=zc.Restore(it))))
    joined = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    assert_batch_equal(joined, reference[3])


def test_finite_pipeline_checkpoint_restores_on_more_processes(tmp_path):
    """A finite input: every process runs every lane; the item restores on any count."""
    dataset = worker.make_pipeline(num_epochs=1)
    expected = list(zj.Loader(dataset))
    directory, handler = save_from_two_processes(tmp_path, dataset, steps=3)
    rest = []
    its = [iter(zj.Loader(dataset, process_index=p, process_count=4)) for p in range(4)]
    its = [handler.restore(directory, args=zc.Restore(it)) for it in its]
    while True:
        parts = [next(it, None) for it in its]
        if any(part is None for part in parts):
            assert all(part is None for part in parts)
            break
        rest.append({k: np.concatenate([part[k] for part in parts]) for k in parts[0]})
    assert len(rest) == len(expected) - 3
    for got, want in zip(rest, expected[3:]):
        assert_batch_equal(got, want)


def test_restore_checks_the_pipeline_and_completeness(tmp_path, dataset):
    directory = tmp_path / "item"
    directory.mkdir()
    handler = zc.LoaderCheckpointHandler()
    it = iter(zj.Loader(dataset))
    next(it)
    handler.save(directory, args=zc.Save(it))

    reseeded = worker.make_pipeline().dataset.window_shuffle(5, seed=4).batch(worker.GLOBAL_BATCH)
    with pytest.raises(zj.StateMismatchError) as e:
        handler.restore(directory, args=zc.Restore(iter(zj.Loader(reseeded))))
    assert e.value.field == "operators"
    rebatched = worker.make_pipeline().dataset.batch(worker.GLOBAL_BATCH, num_lanes=8)
    with pytest.raises(zj.StateMismatchError) as e:
        handler.restore(directory, args=zc.Restore(iter(zj.Loader(rebatched))))
    assert e.value.field == "num_lanes"

    (directory / zc.lane_file(5)).unlink()
    target = iter(zj.Loader(dataset))
    with pytest.raises(zj.StateError, match=r"no file for lanes \[5\]"):
        handler.restore(directory, args=zc.Restore(target))
    assert target.step == 0
    (directory / "meta.json").unlink()
    with pytest.raises(zj.StateError, match="meta.json"):
        handler.restore(directory, args=zc.Restore(target))
    with pytest.raises(TypeError, match="iterator of a zephon_jax.Loader"):
        handler.save(directory, args=zc.Save([1, 2]))


@pytest.mark.parametrize("damage", ["truncated", "empty", "flipped"])
def test_restore_refuses_a_partially_written_lane_file(tmp_path, dataset, damage):
    """A lane file cut short (as by a full disk or a kill mid-write) is refused with a
    StateError naming the file, never loaded; the iterator is unchanged."""
    directory = tmp_path / "item"
    directory.mkdir()
    handler = zc.LoaderCheckpointHandler()
    it = iter(zj.Loader(dataset))
    for _ in range(3):
        next(it)
    handler.save(directory, args=zc.Save(it))
    path = directory / zc.lane_file(2)
    data = path.read_bytes()
    damaged = {
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "flipped": data[:-5] + bytes([data[-5] ^ 1]) + data[-4:],
    }[damage]
    path.write_bytes(damaged)
    target = iter(zj.Loader(dataset))
    next(target)
    message = rf"lane_00002.bin is truncated or corrupt \({len(damaged)} bytes"
    with pytest.raises(zj.StateError, match=message):
        handler.restore(directory, args=zc.Restore(target))
    with pytest.raises(zj.StateError, match=message):
        zj.load_state(directory)
    assert target.step == 1
    path.write_bytes(data)
    handler.restore(directory, args=zc.Restore(target))
    assert target.step == 3


def test_manager_restore_reports_mismatch(tmp_path, dataset, sharding):
    it = iter(zj.Loader(dataset, sharding=sharding))
    next(it)
    with manager(tmp_path / "ckpt", async_save=True) as mngr:
        mngr.save(1, args=ocp.args.Composite(data=zc.Save(it)))
        mngr.wait_until_finished()
        other = zj.Dataset.source([{"tokens": np.arange(5, dtype=np.int32)}] * 3).pack(24).batch(16)
        with pytest.raises(zj.StateMismatchError, match="sources"):
            mngr.restore(1, args=ocp.args.Composite(data=zc.Restore(iter(zj.Loader(other)))))


def run_example(workdir: Path, steps: int, devices: int, says: str) -> list[dict]:
    """Runs examples/train_loop.py; its first line must match the regular expression ``says``."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])  # this checkout
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_loop.py"),
            f"--workdir={workdir}",
            f"--steps={steps}",
            "--save-every=3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    first_line = proc.stdout.splitlines()[0]
    assert re.fullmatch(says, first_line), first_line
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_example_train_loop_resumes_on_another_device_count(tmp_path):
    """Six steps on 4 devices, then on to step 8 on 2 devices: the uninterrupted batches."""
    spec = importlib.util.spec_from_file_location("train_loop", ROOT / "examples" / "train_loop.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    params = example.init_params(jax.random.key(0), 32)
    expected = []
    for batch in zj.Loader(example.make_dataset(8, 64)):
        params, loss = example.train_step(params, batch)
        expected.append({"batch": example.batch_digest(batch), "loss": float(loss)})
        if len(expected) == 8:
            break

    first = run_example(
        tmp_path, steps=6, devices=4, says=r"no checkpoint in .*: training from step 1 on 4 .*"
    )
    assert [r["step"] for r in first] == list(range(1, 7))
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [3, 6]
    resumed = run_example(
        tmp_path,
        steps=8,
        devices=2,
        says=r"resumed from the checkpoint of step 6 in .* on 2 device\(s\), 1 process\(es\): "
        r"continuing with step 7, .*",
    )
    assert [r["step"] for r in resumed] == [7, 8]
    runs = first + resumed
    assert [r["batch"] for r in runs] == [e["batch"] for e in expected]
    np.testing.assert_allclose([r["loss"] for r in runs], [e["loss"] for e in expected], rtol=1e-4)


def test_distributed_page_examples_run():
    """The runnable examples of docs/distributed.md run as written, in order."""
    text = (ROOT / "docs" / "distributed.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 2
    namespace: dict = {"__name__": "docs_example"}
    for block in blocks:
        exec(compile(block, "distributed.md", "exec"), namespace)
    assert namespace["it"].step == namespace["step"] == 3


# ----- a training process killed or preempted while a save is in flight -----------------


@pytest.fixture(scope="module")
def trainer_reference():
    """The uninterrupted run of fault_trainer.py's loop: digest and model after each step."""
    import fault_trainer

    it = iter(zj.Loader(fault_trainer.make_pipeline()))
    batches = [next(it) for _ in range(fault_trainer.STEPS)]
    digests = [fault_trainer.digest(b) for b in batches]
    models = [fault_trainer.model_after(batches[: t + 1]) for t in range(len(batches))]
    return digests, models


def start_trainer(directory: Path, mode: str, *extra: str) -> subprocess.Popen:
    # This checkout's zephon_jax, whichever is installed.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path)
    return subprocess.Popen(
        [sys.executable, str(HERE / "fault_trainer.py"), str(directory), f"--mode={mode}", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def read_until_mid_save(proc: subprocess.Popen) -> list[dict]:
    """The step lines the trainer printed until its save was in flight."""
    steps = []
    for line in proc.stdout:
        if line.startswith("MID-SAVE"):
            return steps
        steps.append(json.loads(line))
    proc.wait(timeout=60)
    raise AssertionError(f"the trainer ended before its save: {proc.stderr.read()[-3000:]}")


def restore_and_continue(directory: Path, step: int, reference) -> None:
    """A new process (this one) restores ``step`` from the manager and continues exactly."""
    import fault_trainer

    digests, models = reference
    it = iter(zj.Loader(fault_trainer.make_pipeline()))
    with ocp.CheckpointManager(directory) as mngr:
        restored = mngr.restore(
            step,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore({"sum": jnp.zeros((), jnp.int32)}),
                data=zc.Restore(it),
            ),
        )
    assert int(restored["model"]["sum"]) == models[step - 1]
    assert it.step == step
    rest = [fault_trainer.digest(next(it)) for _ in range(len(digests) - step)]
    assert rest == digests[step:]


@pytest.mark.parametrize("stall_in", ["lanes", "finalize"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trainer_killed_while_a_save_is_in_flight_resumes_from_the_last_complete_step(
    tmp_path, trainer_reference, mode, stall_in
):
    """SIGKILL while the save of step 6 is in flight: with half of the loader's lane files
    written, or with the item written and Orbax's finalize (the rename of the step's
    temporary directory) still to come. The manager lists only complete steps; step 6's
    partial item is refused by zephon_jax; restoring the latest step continues with the
    uninterrupted run's batches and model."""
    directory = tmp_path / "ckpt"
    proc = start_trainer(directory, mode, "--stall-at=6", f"--stall-in={stall_in}")
    try:
        printed = read_until_mid_save(proc)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert [s["digest"] for s in printed] == trainer_reference[0][: len(printed)]

    partial = [p for p in directory.iterdir() if p.name.startswith("6.")]
    assert len(partial) == 1 and "tmp" in partial[0].name, sorted(directory.iterdir())
    (item,) = partial[0].glob("data*")  # data.orbax-checkpoint-tmp while in flight
    lanes = sorted(item.glob("lane_*.bin"))
    if stall_in == "lanes":
        assert 0 < len(lanes) < 8 and not (item / "meta.json").exists()
        with pytest.raises(zj.StateError, match=r"incomplete .* no meta.json.*did not finish"):
            zj.load_state(item)
    else:
        assert len(lanes) == 8 and (item / "meta.json").exists()
    with ocp.CheckpointManager(directory) as mngr:
        assert mngr.all_steps() == [1, 3] and mngr.latest_step() == 3
    restore_and_continue(directory, 3, trainer_reference)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trainer_preempted_with_sigterm_saves_its_step_and_resumes_exactly(
    tmp_path, trainer_reference, mode
):
    """SIGTERM while the save of step 6 is in flight: the recommended handler (a flag the
    loop reads between steps) lets that save finish, saves the step the loop is in and
    exits 0; restoring that step continues with the uninterrupted run's batches."""
    directory = tmp_path / "ckpt"
    proc = start_trainer(directory, mode, "--stall-at=6", "--stall-s=1.5")
    try:
        read_until_mid_save(proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    lines = out.splitlines()
    assert lines[-1] == "PREEMPTED"
    last = json.loads(lines[-2])["step"]
    assert 6 <= last < 12
    with ocp.CheckpointManager(directory) as mngr:
        steps = mngr.all_steps()
        assert 6 in steps and mngr.latest_step() == last, steps
    restore_and_continue(directory, last, trainer_reference)
