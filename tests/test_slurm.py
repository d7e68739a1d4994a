"""SLURM through submitit, tested with submitit's local executor (the same job array as local processes): an
experiment's runs as array tasks give the serial run's results; the ``--slurm`` options are parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

from iclab.core.errors import ConfigError
from iclab.experiments.runner import run_experiment

submitit = pytest.importorskip("submitit")

from iclab.experiments.slurm import SlurmBackend, slurm_backend  # noqa: E402

EXP, OVERRIDES = "ahn2023.fig1", ["seeds=2"]


@pytest.mark.slow
def test_a_job_array_gives_the_serial_results(tmp_path: Path) -> None:
    from test_backends import _claims, _results, _same  # type: ignore[import-not-found]

    backend = SlurmBackend(cluster="local", folder=tmp_path / "submitit", poll_s=0.2)
    on_slurm = run_experiment(EXP, "smoke", out=tmp_path / "slurm", overrides=OVERRIDES, backend=backend)
    serial = run_experiment(EXP, "smoke", out=tmp_path / "serial", overrides=OVERRIDES)
    assert _claims(on_slurm) == _claims(serial)
    assert _same(_results(on_slurm), _results(serial))
    assert len(list((tmp_path / "submitit").rglob("*_submitted.pkl"))) == 2, "one array task per run"


def _fail(x: int) -> int:
    if x:
        raise ValueError("point 1 is broken")
    return 7


def test_a_failing_array_task_is_reported(tmp_path: Path) -> None:
    backend = SlurmBackend(cluster="debug", folder=tmp_path / "submitit", poll_s=0.05)
    out = backend.map(_fail, [0, 1], labels=["a", "b"])
    assert out[0].value == 7 and out[1].error is not None and "point 1 is broken" in out[1].error


def test_slurm_options() -> None:
    b = slurm_backend(["partition=gpu", "time=240", "account=proj", "--qos=high"], cpus_per_task=8, gpus_per_task=1)
    assert (b.partition, b.time_min, b.cpus_per_task, b.gpus_per_task) == ("gpu", 240, 8, 1)
    assert b.sbatch == {"account": "proj", "qos": "high"} and b.task_device == "cuda"
    assert Path(b.folder).is_absolute()
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        slurm_backend(["partition"])
    with pytest.raises(ConfigError, match="--slurm"):
        slurm_backend(["time=soon"])
