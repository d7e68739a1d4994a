"""Ray on several nodes, simulated on one machine (``ray.cluster_utils.Cluster``: a head and worker nodes, each its own
raylet and workers, one CPU each): the shared-storage check names a node that does not see ``--out``, GPU tasks land
on the node that declares the GPU and are told their device, a node with other code is refused, and (slow) an
experiment whose node is removed mid-run gives the serial run's results bit for bit, all checkpoints under --out."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from iclab.core.errors import ConfigError, OutputError
from iclab.experiments.backends import RayBackend, check_same_code
from iclab.experiments.runner import run_experiment

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a cluster of several nodes starts in 10-30 s on a busy 2-core machine
cluster_utils = pytest.importorskip("ray.cluster_utils")

# ahn2023.fig1 at smoke, three seeds of 600 steps (a checkpoint every 60): three independent runs long enough to lose
# a node in the middle of them
EXP, OVERRIDES = "ahn2023.fig1", ["seeds=3", "train.steps=600", "train.batch_size=64"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A head and two worker nodes of one CPU each; ``gpu`` declares a (fake) GPU, ``blind`` does not mount the
    folder ``unmounted`` (its tasks do not see files there, as a node without the shared storage)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    unmounted = tmp_path_factory.mktemp("unmounted")
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    gpu = c.add_node(num_cpus=1, num_gpus=1, resources={"gpu_node": 1})
    blind = c.add_node(num_cpus=1, env_vars={"ICLAB_UNMOUNTED": str(unmounted)})
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # this module's task functions travel by value
    yield {"cluster": c, "gpu": gpu, "blind": blind, "unmounted": unmounted}
    ray.shutdown()
    c.shutdown()


@pytest.fixture(autouse=True)
def _connected(request: pytest.FixtureRequest) -> None:
    """The module's cluster is the one Ray is connected to (a test with a cluster of its own leaves it)."""
    if "cluster" in request.fixturenames and "three_nodes" not in request.fixturenames:
        c = request.getfixturevalue("cluster")["cluster"]
        if not ray.is_initialized():
            ray.init(address=c.address, log_to_driver=False)


def _where(_: Any, device: str | None) -> tuple[str, str, str | None]:
    """A task that says where it ran: its node, the GPUs Ray gave it, the device it was told to train on."""
    return ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES", ""), device


def test_a_node_that_does_not_see_out_is_named(cluster: dict[str, Any], tmp_path: Path) -> None:
    backend = RayBackend(address=cluster["cluster"].address)
    backend.check_shared_storage(tmp_path / "shared")  # every node sees it
    hidden = cluster["unmounted"] / "runs"
    blind_id = cluster["blind"].node_id[:8]
    with pytest.raises(OutputError, match=rf"not shared storage: nodes \['[^']*\({blind_id}\)'\] do not see it"):
        run_experiment(EXP, "smoke", out=hidden, overrides=OVERRIDES[:1], backend=backend)
    assert not list(hidden.rglob("checkpoint*.pt")), "the command stopped before any work"


def test_gpu_tasks_land_on_the_gpu_node_and_are_told_their_device(cluster: dict[str, Any]) -> None:
    backend = RayBackend(address=cluster["cluster"].address, gpus_per_task=1)
    fn = functools.partial(_where, device=backend.task_device)
    out = backend.map(fn, [0, 1], labels=["a", "b"])
    assert [o.unwrap() for o in out] == [(cluster["gpu"].node_id, "0", "cuda")] * 2


def test_a_node_with_other_code_is_refused(cluster: dict[str, Any]) -> None:
    c = cluster["cluster"]
    other = c.add_node(num_cpus=1, env_vars={"ICLAB_SOURCE_HASH": "0123456789abcdef"})
    c.wait_for_nodes()
    try:
        with pytest.raises(ConfigError, match=rf"nodes \['[^']*\({other.node_id[:8]}\)'\] run other iclab code"):
            check_same_code(ray)
    finally:
        c.remove_node(other)
        c.wait_for_nodes()


def _remove_when_checkpointed(cluster: Any, node: Any, out: Path, removed: list[float], done: threading.Event) -> None:
    """Remove ``node`` (its raylet and workers killed) once the runs have checkpointed and before they finish."""
    while not done.is_set() and not list(out.rglob("checkpoint.pt")):
        time.sleep(0.05)
    if not done.is_set():
        cluster.remove_node(node, allow_graceful=False)
        removed.append(time.monotonic())


@pytest.fixture
def three_nodes():  # type: ignore[no-untyped-def]
    """A cluster of its own: three nodes of one CPU for three runs, so that every node runs one."""
    ray.shutdown()
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=1) for _ in range(2)]
    c.wait_for_nodes()
    yield c, nodes  # the test's RayBackend joins it
    ray.shutdown()
    c.shutdown()


@pytest.mark.slow
def test_an_experiment_survives_a_lost_node(
    three_nodes: tuple[Any, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_backends import _claims, _results, _same  # type: ignore[import-not-found]

    (c, nodes), out = three_nodes, tmp_path / "cluster"
    removed: list[float] = []
    done = threading.Event()
    watcher = threading.Thread(target=_remove_when_checkpointed, args=(c, nodes[1], out, removed, done))
    watcher.start()
    try:
        on_cluster = run_experiment(EXP, "smoke", out=out, overrides=OVERRIDES, backend=RayBackend(address=c.address))
    finally:
        done.set()
        watcher.join()
    assert removed, "a node was removed while the runs trained"
    assert f"joined the Ray cluster at {c.address} (--address {c.address}): 3 nodes, 3 CPUs" in capsys.readouterr().err
    serial = run_experiment(EXP, "smoke", out=tmp_path / "serial", overrides=OVERRIDES)
    assert _claims(on_cluster) == _claims(serial)
    assert _same(_results(on_cluster), _results(serial))
    assert on_cluster.out_dir.is_relative_to(out)
    assert sorted(p.parent.name for p in out.rglob("checkpoint.pt")) == ["seed0", "seed1", "seed2"]
