"""The Ray backend: :class:`RayBackend` runs tasks on a local Ray (``address=None``) or on a cluster (``"auto"`` or
``"HOST:PORT"`` of a running head), and refuses a cluster before any work when ``--address`` does not answer
(:data:`CONNECT_TIMEOUT_S`), when a node does not see the output directory (:func:`check_shared_storage`) or when a
node imports other iclab code than the driver (:func:`check_same_code`, :func:`source_hash`). Ray is an optional
extra (``pip install iclab[ray]``); :mod:`iclab.experiments.backends` re-exports every name here.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import socket
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iclab.core.errors import ConfigError, OutputError
from iclab.experiments._tasks import OnDone, Outcome, WorkerSettings, _check_labels, _finish, run_task

CONNECT_TIMEOUT_S = 15.0  # --address: a cluster that does not answer within this fails, naming the address


# --------------------------------------------------------------------------------------------------- same code


@functools.cache
def source_hash() -> str:
    """A hash of the iclab package's ``.py`` files (path and bytes) as this process imports them: a driver and its
    workers with different code would give different numbers, so a cluster whose nodes disagree is refused.
    ``ICLAB_SOURCE_HASH`` in a node's environment overrides it (tests simulate a node with other code)."""
    if os.environ.get("ICLAB_SOURCE_HASH"):
        return os.environ["ICLAB_SOURCE_HASH"]
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _node_code() -> tuple[str, str]:
    return socket.gethostname(), source_hash()


# --------------------------------------------------------------------------------------------------- Ray


@dataclass
class RayBackend:
    """Ray core tasks: ``ray.init(address)`` (None: a local Ray started here with this machine's cores; "auto" or
    "HOST:PORT": a running cluster), one task per item with ``cpus_per_task`` CPUs (and torch threads) and
    ``gpus_per_task`` GPUs. Ray retries a task whose worker died up to ``max_retries`` times."""

    address: str | None = None
    cpus_per_task: float = 1
    gpus_per_task: float = 0
    max_retries: int = 3
    num_cpus: int | None = None  # a local Ray only: cores to give it (default: all)
    name: str = "ray"

    def __post_init__(self) -> None:
        if not (isinstance(self.cpus_per_task, int | float) and self.cpus_per_task > 0):
            raise ConfigError(f"--cpus-per-task must be > 0; got {self.cpus_per_task!r}")
        if not (isinstance(self.gpus_per_task, int | float) and self.gpus_per_task >= 0):
            raise ConfigError(f"--gpus-per-task must be >= 0; got {self.gpus_per_task!r}")
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError("--backend ray needs Ray: pip install 'iclab[ray]'") from None

    @property
    def parallelism(self) -> int:
        ray = self._ray()
        return max(1, int(ray.cluster_resources().get("CPU", 1) // self.cpus_per_task))

    @property
    def task_device(self) -> str | None:
        """The device a task trains on: ``cuda`` (Ray sets each task's ``CUDA_VISIBLE_DEVICES`` to the GPUs it
        reserved, so its first visible GPU is its own) when tasks reserve GPUs; None: the driver's ``--device``."""
        return "cuda" if self.gpus_per_task > 0 else None

    def _ray(self) -> Any:
        import ray

        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
            if self.address is None:
                kwargs["num_cpus"] = self.num_cpus
            else:
                kwargs["address"] = self.address
                _check_reachable(self.address)
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local Ray on loopback; a cluster sets its own
            try:
                ray.init(**kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ConfigError(f"cannot connect to Ray at {self.address!r}: {e}") from None
            if self.address is not None:
                sys.stderr.write(_joined(ray, self.address) + "\n")
        return ray

    def map(
        self, fn: Callable[[Any], Any], items: Sequence[Any], *, labels: Sequence[str], on_done: OnDone | None = None
    ) -> list[Outcome]:
        _check_labels(items, labels)
        ray = self._ray()
        check_same_code(ray)
        threads = max(1, int(self.cpus_per_task))
        settings = WorkerSettings.from_driver(threads)
        remote = ray.remote(num_cpus=self.cpus_per_task, num_gpus=self.gpus_per_task, max_retries=self.max_retries)(
            run_task
        )
        refs = {remote.remote(fn, item, settings): i for i, item in enumerate(items)}
        outcomes: dict[int, Outcome] = {}
        waiting = list(refs)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            for ref in done:
                i = refs[ref]
                try:
                    result = ray.get(ref)
                except Exception as e:  # the worker died more than max_retries times, or the task could not run
                    result = (None, f"{type(e).__name__}: {e}", "", 0.0)
                outcomes[i] = _finish(i, labels[i], result, 1, on_done)
        return [outcomes[i] for i in range(len(items))]

    def check_shared_storage(self, out: Path) -> None:
        """Refuse ``out`` unless every node of the cluster sees it (resume across machines needs shared storage)."""
        check_shared_storage(self._ray(), out)


def _check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail within ``timeout`` seconds, naming ``address``, when nothing listens at a ``HOST:PORT`` address (Ray's own
    connection retries take minutes). ``auto`` and ``ray://`` addresses are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(
            f"cannot reach a Ray cluster at --address {address} within {timeout:.0f} s ({e.strerror or e}): is its "
            f"head running (`ray start --head --port {port}`) and the port open from here?"
        ) from None


def _joined(ray: Any, address: str) -> str:
    """One line saying which cluster ``--address`` joined: its address, nodes, CPUs and GPUs."""
    res = ray.cluster_resources()
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    gcs = getattr(ray.get_runtime_context(), "gcs_address", address)
    return (
        f"joined the Ray cluster at {gcs} (--address {address}): {nodes} nodes, {res.get('CPU', 0):g} CPUs, "
        f"{res.get('GPU', 0):g} GPUs"
    )


def _on_every_node(ray: Any, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """``fn(*args)`` run once on every alive node (a zero-CPU task pinned to it), by node address."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(fn)
    refs = {
        f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})": probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
        ).remote(*args)
        for n in ray.nodes()
        if n.get("Alive")
    }
    return {addr: ray.get(ref) for addr, ref in refs.items()}


_CHECKED_CODE: set[str] = set()


def check_same_code(ray: Any) -> None:
    """Refuse a cluster whose nodes import other iclab code than the driver (:func:`source_hash`): the same seeds
    would not give the same numbers. Checked once per cluster and driver."""
    key = str(getattr(ray.get_runtime_context(), "gcs_address", "")) + str(len(ray.nodes()))
    if key in _CHECKED_CODE:
        return
    mine = source_hash()
    other = {addr: code for addr, (_, code) in _on_every_node(ray, _node_code).items() if code != mine}
    if other:
        raise ConfigError(
            f"nodes {sorted(other)} run other iclab code than this driver (source hash {sorted(set(other.values()))} "
            f"there, {mine} here): install the same iclab version on every node (pip install of the same commit, or a "
            "shared checkout), then run again"
        )
    _CHECKED_CODE.add(key)


def check_shared_storage(ray: Any, out: Path) -> None:
    """Write a marker under ``out`` and read it on every alive node; a node that does not see it is named."""
    out = Path(out).resolve()
    if sum(1 for n in ray.nodes() if n.get("Alive")) <= 1:
        return  # one machine: local storage is shared with itself
    marker = out / f".iclab-shared-{uuid.uuid4().hex}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        marker.write_text("iclab")
    except OSError as e:
        raise OutputError(f"cannot write {out} ({e.strerror or e})") from e
    try:
        blind = [addr for addr, seen in _on_every_node(ray, _sees, str(marker)).items() if not seen]
    finally:
        marker.unlink(missing_ok=True)
    if blind:
        raise OutputError(
            f"--out {out} is not shared storage: nodes {blind} do not see it. On a cluster put --out on storage every "
            "node mounts at the same path (NFS, a mounted bucket), so that a run resumed on another node finds its "
            "checkpoints"
        )


def _sees(path: str) -> bool:
    """Whether this node sees ``path``. A node whose environment sets ``ICLAB_UNMOUNTED`` to a folder behaves as if
    it did not mount that folder (tests simulate a node without the shared storage on one machine)."""
    hidden = os.environ.get("ICLAB_UNMOUNTED")
    if hidden and Path(path).resolve().is_relative_to(Path(hidden).resolve()):
        return False
    return Path(path).is_file()


@contextlib.contextmanager
def local_ray(num_cpus: int = 2) -> Iterator[None]:
    """A local Ray for the span of a block (tests, examples); shut down after."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=num_cpus, log_to_driver=False, include_dashboard=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
