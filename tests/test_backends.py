"""Backends: an experiment's training runs as tasks of a local process pool or of Ray give the same
numbers as in this process; a task's failure is reported, a killed worker is retried."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from iclab.core.errors import ConfigError
from iclab.core.io import safe_torch_load
from iclab.experiments import registry
from iclab.experiments.backends import LocalBackend, RayBackend, TaskError, local_ray, make_backend
from iclab.experiments.runner import results_types, run_experiment

# ahn2023.fig1 at smoke with two seeds: two sampled training runs of 20 steps, fanned out
EXP, OVERRIDES = "ahn2023.fig1", ["seeds=2"]


def _claims(res: object) -> list[tuple[str, object, bool]]:
    return [(c.name, c.measured, c.passed) for c in res.claims]  # type: ignore[attr-defined]


def _same(a: object, b: object) -> bool:
    """Deep equality of results (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b or (a != a and b != b)  # NaN equals NaN here


def _results(res: object) -> object:
    return safe_torch_load(res.out_dir / "results.pt", allowed=results_types())  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return run_experiment(EXP, "smoke", out=tmp_path_factory.mktemp("serial"), overrides=OVERRIDES)


@pytest.fixture(scope="module")
def pool():  # type: ignore[no-untyped-def]
    """Two worker processes shared by this module's tests (each imports torch once)."""
    backend = LocalBackend(workers=2)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def ray_session():  # type: ignore[no-untyped-def]
    ray = pytest.importorskip("ray")
    # Ray's workers do not see tests/ on their path: this module's task functions travel by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(num_cpus=2):
        yield


def _count_fan_outs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    original = registry.RunContext._fan_out

    def spy(self, runs):  # type: ignore[no-untyped-def]
        sizes.append(len(runs))
        return original(self, runs)

    monkeypatch.setattr(registry.RunContext, "_fan_out", spy)
    return sizes


def test_local_pool_gives_identical_results(serial, pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _count_fan_outs(monkeypatch)
    pooled = run_experiment(EXP, "smoke", out=tmp_path, overrides=OVERRIDES, backend=pool)
    assert sizes == [2], "the two training runs went to the pool"
    assert _claims(pooled) == _claims(serial)
    assert _same(_results(pooled), _results(serial))
    assert pooled.out_dir.name == serial.out_dir.name  # same config, same run directory name
    assert sorted(p.name for p in pooled.out_dir.iterdir() if p.is_dir()) == sorted(
        p.name for p in serial.out_dir.iterdir() if p.is_dir()
    ), "each run checkpointed in its own sub-directory, as in this process"


def test_local_pool_runs_a_parametrised_model(pool, tmp_path: Path) -> None:
    """sun2025.fig2 trains a ``sparse_strict`` bilinear model (a row-mask parametrisation, which torch does not pickle):
    its workers send it back rebuilt (BilinearTransformer.__reduce__), with the serial run's claims (its
    reduced paper run with ``--workers 2`` needs this)."""
    pooled = run_experiment("sun2025.fig2", "smoke", out=tmp_path / "pool", backend=pool)
    serial = run_experiment("sun2025.fig2", "smoke", out=tmp_path / "serial")
    assert _claims(pooled) == _claims(serial)


def test_ray_gives_identical_results(serial, ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _count_fan_outs(monkeypatch)
    on_ray = run_experiment(EXP, "smoke", out=tmp_path, overrides=OVERRIDES, backend=RayBackend())
    assert sizes == [2]
    assert _claims(on_ray) == _claims(serial)
    assert _same(_results(on_ray), _results(serial))


def _die_once(marker: str) -> str:
    """A task whose first attempt kills its own worker process (as the OOM killer would)."""
    path = Path(marker)
    if not path.exists():
        path.write_text("killed once")
        os._exit(1)
    return f"{os.getpid()}"


def _fail(x: int) -> int:
    if x == 1:
        raise ValueError("point 1 is broken")
    return x * 10


def test_local_pool_retries_a_killed_worker(pool, tmp_path: Path) -> None:
    out = pool.map(_die_once, [str(tmp_path / "m")], labels=["die"])
    assert out[0].ok and out[0].attempts == 2


def test_ray_retries_a_killed_worker(ray_session, tmp_path: Path) -> None:
    out = RayBackend().map(_die_once, [str(tmp_path / "m")], labels=["die"])
    assert out[0].ok, out[0].error


@pytest.mark.parametrize("which", ["serial", "local", "ray"])
def test_a_failing_task_does_not_stop_the_others(which: str, request: pytest.FixtureRequest) -> None:
    backend = {
        "serial": lambda: LocalBackend(),
        "local": lambda: request.getfixturevalue("pool"),
        "ray": lambda: (request.getfixturevalue("ray_session"), RayBackend())[1],
    }[which]()
    out = backend.map(_fail, [0, 1, 2], labels=["a", "b", "c"])
    assert [o.value for o in out] == [0, None, 20]
    assert out[1].error is not None and "point 1 is broken" in out[1].error and "Traceback" in out[1].error
    with pytest.raises(TaskError, match="b failed"):
        out[1].unwrap()


def test_a_failing_training_run_names_itself(pool, tmp_path: Path) -> None:
    """A run that diverges on a worker fails the experiment with the run's name and the worker's traceback."""
    with pytest.raises(TaskError, match=r"(?s)ahn2023\.fig1/seed\d.*DivergenceError"):
        run_experiment(
            EXP,
            "smoke",
            out=tmp_path,
            overrides=[*OVERRIDES, "train.lr=1e12", "train.clip=null"],
            backend=LocalBackend(workers=2),
        )


def test_backend_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="--workers must be an int >= 1"):
        make_backend("local", workers=0)
    with pytest.raises(ConfigError, match="--backend must be one of"):
        make_backend("nope")
    with pytest.raises(ConfigError, match="Ray options"):
        make_backend("local", address="auto")
    with pytest.raises(ConfigError, match="--gpus-per-task must be >= 0"):
        make_backend("ray", gpus_per_task=-1)


def _cwd(_: object) -> str:
    return os.getcwd()


def test_paths_are_absolute_before_they_reach_a_worker(
    serial, pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's workers run in the folder pytest started in, the driver in another with a relative --out: the
    checkpoints go under the driver's --out, none into the workers' folder."""
    workers_dir = Path(pool.map(_cwd, [0], labels=["cwd"])[0].unwrap())
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    monkeypatch.chdir(driver_dir)
    assert workers_dir != driver_dir
    res = run_experiment(EXP, "smoke", out="runs", overrides=OVERRIDES, backend=pool)
    assert res.out_dir.is_absolute() and res.out_dir.is_relative_to(driver_dir / "runs")
    assert len(list((driver_dir / "runs").rglob("checkpoint.pt"))) == 2
    assert not (workers_dir / "runs" / EXP / res.out_dir.name).exists(), "nothing in the workers' working directory"
    assert _same(_results(res), _results(serial))


_ORPHANS = """
import os, sys, time
from pathlib import Path
from iclab.experiments.backends import LocalBackend

def nap(x):
    Path(f"started-{os.getpid()}").touch()
    time.sleep(60)

if __name__ == "__main__":
    pool = LocalBackend(workers=2)
    pool._executor().submit(nap, 0); pool._executor().submit(nap, 1)
    while len(list(Path().glob("started-*"))) < 2:  # both workers started and busy
        time.sleep(0.05)
    print(" ".join(p.name.split("-")[1] for p in Path().glob("started-*")), flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow  # a driver and two spawned workers importing torch: 5-20 s
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_exit_when_their_driver_is_killed(tmp_path: Path) -> None:
    """SIGKILL the driver of a 2-worker pool: its workers, busy with a task, exit within a few seconds."""
    import signal
    import subprocess
    import time

    script = tmp_path / "driver.py"
    script.write_text(_ORPHANS)
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert driver.stdout is not None
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "the orphaned workers exited"
    finally:
        driver.kill()


def test_an_unreachable_address_fails_fast() -> None:
    """Nothing listens on 127.0.0.1:6999: the command fails within seconds, naming the address."""
    import time

    ray = pytest.importorskip("ray")
    ray.shutdown()  # a local Ray of another test (a later RayBackend() starts a new one)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"cannot reach a Ray cluster at --address 127\.0\.0\.1:6999 within 15 s"):
        _ = RayBackend(address="127.0.0.1:6999").parallelism
    assert time.monotonic() - t0 < 15


def test_a_failed_tasks_output_reaches_the_driver(pool) -> None:  # type: ignore[no-untyped-def]
    out = pool.map(_loud_fail, [0], labels=["loud"])
    assert out[0].error is not None and "ValueError: no" in out[0].error
    assert "worker says: step 3 loss 1e+30" in out[0].error


def _loud_fail(_: int) -> None:
    print("worker says: step 3 loss 1e+30")
    raise ValueError("no")
