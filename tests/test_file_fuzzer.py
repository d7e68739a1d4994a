"""File fuzzer: every kind of file a finished run directory holds (checkpoint, results, summary, claims, metrics, sweep
table, config), truncated at several offsets, overwritten with random bytes, or replaced by a valid file of the wrong
content (hypothesis), is planted in a copy of a finished smoke run. The next ``run_experiment`` and ``write_site``
must recompute or warn, never raise, never hang (a per-case time limit), and end with the same claims.

The run is of a tiny card registered for this module only (one linear transformer of one layer, 20 steps, no
figures: a case costs well under a second). ``make test`` runs a bounded set of cases; ``-m slow`` many more. The
counts of a run go to ``docs/reliability.md`` through ``scripts/reliability_table.py`` (``ICLAB_FUZZ_COUNTS=path``
makes this module write them)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import random
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iclab.experiments import registry
from iclab.experiments.registry import ClaimResult, Experiment, RunContext
from iclab.experiments.runner import run_experiment
from iclab.experiments.sweep import run_sweep
from iclab.models import LinearTransformer, LinearTransformerConfig
from iclab.reporting.site import write_site
from iclab.tasks import LinearRegression
from iclab.training import ModelSpec, TrainConfig, TrainingRun

EXP = "fuzzcard.tiny"
CASE_SECONDS = 60  # one case: a recompute of the tiny card plus the site; a hang fails the case at this limit


@dataclass(frozen=True, kw_only=True)
class TinyConfig:
    seeds: int = 1
    steps: int = 20


def _run(cfg: TinyConfig, ctx: RunContext) -> dict[str, Any]:
    task = LinearRegression(d=3)
    train = TrainConfig(
        steps=cfg.steps, batch_size=32, lr=0.01, checkpoint_every=5, eval_every=5, eval_batch=64, progress=False
    )
    model = ModelSpec(LinearTransformer, LinearTransformerConfig(d=3, n_layers=1, init_std=0.1))
    runs = [
        TrainingRun(name=f"seed{s}", model=model, task=functools.partial(task.sample, n=10), train=train, seed=s)
        for s in range(cfg.seeds)
    ]
    done = ctx.execute(runs)
    return {"final": torch.tensor([r.final_test_loss for r in done], dtype=torch.float64), "steps": cfg.steps}


def _plot(results: dict[str, Any], cfg: TinyConfig, out: Path) -> list[Path]:
    return []


def _claims(results: dict[str, Any], cfg: TinyConfig) -> list[ClaimResult]:
    final = results["final"]
    return [
        ClaimResult("trained", bool(torch.isfinite(final).all()), float(final.mean()), "finite"),
        ClaimResult("steps", results["steps"] == cfg.steps, int(results["steps"]), str(cfg.steps)),
    ]


CARD = Experiment(
    name=EXP,
    title="a tiny card for the file fuzzer",
    config=TinyConfig,
    presets={"smoke": {}, "quick": {}, "paper": {}},
    run=_run,
    plot=_plot,
    claims=_claims,
    module=__name__,
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """A finished smoke run of the tiny card (and a one-point sweep of it), and its claims."""
    registry.all_experiments()  # the real cards first: the tiny card must not hide them from a first load
    registry.register(CARD)
    try:
        out = tmp_path_factory.mktemp("finished")
        res = run_experiment(EXP, "smoke", out=out)
        run_sweep({"name": "fz", "experiment": EXP, "preset": "smoke", "list": [{"steps": 20}]}, out=out)
        yield out, res.claims_json()
    finally:
        registry._REGISTRY.pop(EXP, None)


# --------------------------------------------------------------------------------------------------- the files


def _run_dir(out: Path) -> Path:
    return next((out / EXP).iterdir())


#: kind -> the file of that kind in a copy of the finished run (``out``)
FILES: dict[str, Callable[[Path], Path]] = {
    "checkpoint": lambda out: _run_dir(out) / "seed0" / "checkpoint.pt",
    "results": lambda out: _run_dir(out) / "results.pt",
    "summary": lambda out: _run_dir(out) / "summary.json",
    "claims": lambda out: _run_dir(out) / "claims.json",
    "metrics": lambda out: _run_dir(out) / "seed0" / "metrics.jsonl",
    "sweep table": lambda out: out / "sweeps" / "fz" / "sweep.parquet",
    "sweep summary": lambda out: out / "sweeps" / "fz" / "summary.json",
    "config": lambda out: _run_dir(out) / "config.yaml",
}
#: offset classes of a truncation: empty, one byte, the first half, all but the last byte
CUTS: dict[str, Callable[[int], int]] = {
    "empty": lambda n: 0,
    "1 byte": lambda n: min(1, n),
    "half": lambda n: n // 2,
    "less 1": lambda n: max(n - 1, 0),
}

# a valid file of the wrong content, per format
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
TORCH_VALUES = st.recursive(
    st.none()
    | st.integers(-(2**31), 2**31)
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.builds(torch.zeros, st.integers(0, 4)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
HOSTILE_JSON = ["[]", "null", '{"seconds": "abc"}', '{"seconds": -1}', "[" * 200_000 + "]" * 200_000, '{"a":1,"a":2}']
_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=False)
)
HOSTILE_YAML = [_BOMB, "a: 1\na: 2\n", "[" * 200_000, "experiment: [1, 2]\nconfig: 3\n"]


def _write_value(path: Path, value: Any) -> None:
    """``value`` in the format of ``path``'s file; a checksum sidecar is left as it was (a file replaced in place)."""
    if path.suffix == ".pt":
        torch.save(value, path)
    elif path.suffix == ".parquet":
        import pandas as pd

        pd.DataFrame({"x": [json.dumps(value, default=str)]}).to_parquet(path)
    elif path.suffix == ".yaml":
        path.write_text(yaml.safe_dump(value))
    elif path.suffix == ".jsonl":
        path.write_text(json.dumps(value) + "\n" + json.dumps(value) + "\n")
    else:
        path.write_text(json.dumps(value))


# --------------------------------------------------------------------------------------------------- one case


@dataclass
class Tally:
    """Cases tried, handled (no exception, no hang, same claims) and data lost (a file gone that was neither
    rewritten nor moved aside) per kind, across this module's tests."""

    tried: dict[str, int] = dataclasses.field(default_factory=dict)
    handled: dict[str, int] = dataclasses.field(default_factory=dict)
    lost: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, kind: str, ok: bool, lost: int) -> None:
        self.tried[kind] = self.tried.get(kind, 0) + 1
        self.handled[kind] = self.handled.get(kind, 0) + int(ok)
        self.lost[kind] = self.lost.get(kind, 0) + lost


TALLY = Tally()


class CaseTimeout(Exception):
    """A case ran past :data:`CASE_SECONDS`: a hang."""


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def on_alarm(*_: Any) -> None:
        raise CaseTimeout(f"no answer in {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _files(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")}


def _lost(before: set[str], out: Path) -> list[str]:
    """Files of ``before`` that are gone from ``out`` and were not moved aside (``<name>.corrupt*``)."""
    after = _files(out)
    return [f for f in before - after if not any(a.startswith(f + ".corrupt") for a in after)]


def _case(finished: tuple[Path, list[dict[str, Any]]], tmp: Path, kind: str, plant: Callable[[Path], None]) -> None:
    """Copy the finished run, damage ``kind``'s file with ``plant``, then the report and the same run again."""
    src, want = finished
    out = tmp / f"case{time.monotonic_ns()}"
    shutil.copytree(src, out)
    path = FILES[kind](out)
    if kind in ("checkpoint", "metrics"):  # read on a resume only: without results.pt the run resumes from them
        for f in path.parents[1].glob("results.pt*"):
            f.unlink()
    before = _files(out)
    plant(path)
    ok, lost = False, 0
    try:
        with _time_limit(CASE_SECONDS):
            write_site(out)  # the report reads the damaged file
            got = run_experiment(EXP, "smoke", out=out).claims_json()
        lost = len(_lost(before, out))
        ok = got == want and lost == 0
        assert got == want, f"{kind}: claims differ after the recompute: {got} != {want}"
        assert lost == 0, f"{kind}: files lost: {_lost(before, out)}"
    finally:
        TALLY.add(kind, ok, lost)
        shutil.rmtree(out, ignore_errors=True)


def _cut(how: str) -> Callable[[Path], None]:
    def plant(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: CUTS[how](len(data))])

    return plant


def _random_bytes(seed: int) -> Callable[[Path], None]:
    def plant(path: Path) -> None:
        n = max(path.stat().st_size, 64)
        path.write_bytes(random.Random(seed).randbytes(n))

    return plant


def _text(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text)


# --------------------------------------------------------------------------------------------------- the cases

#: make test: one case per kind, the offset class turning with the kind, random bytes for every other kind
QUICK = [(kind, list(CUTS)[i % len(CUTS)] if i % 2 else "random 0") for i, kind in enumerate(FILES)]
SLOW = [
    (kind, how) for kind in FILES for how in [*CUTS, *(f"random {s}" for s in range(4))] if (kind, how) not in QUICK
]


def _how(how: str) -> Callable[[Path], None]:
    return _random_bytes(int(how.split()[1])) if how.startswith("random") else _cut(how)


@pytest.mark.parametrize(("kind", "how"), QUICK, ids=[f"{k}-{h}" for k, h in QUICK])
def test_damaged_file_is_recomputed_or_reported(finished, tmp_path, kind: str, how: str) -> None:
    _case(finished, tmp_path, kind, _how(how))


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "how"), SLOW, ids=[f"{k}-{h}" for k, h in SLOW])
def test_damaged_file_every_offset(finished, tmp_path, kind: str, how: str) -> None:
    _case(finished, tmp_path, kind, _how(how))


HOSTILE = [
    *((kind, text) for kind in ("summary", "claims", "sweep summary") for text in HOSTILE_JSON),
    *(("config", text) for text in HOSTILE_YAML),
    ("metrics", '{"step": 1}\n' + "[" * 200_000 + "\n"),
]
#: make test: the shapes the hostile tester found (summary ``[]`` and ``{"seconds": "abc"}``, claims nested 200 000
#: deep, the alias bomb as config.yaml)
HOSTILE_QUICK = [("summary", "[]"), ("claims", HOSTILE_JSON[4]), ("config", _BOMB)]


def _ids(cases: list[tuple[str, str]]) -> list[str]:
    return [f"{k}-{HOSTILE.index((k, t))}" for k, t in cases]


@pytest.mark.parametrize(("kind", "text"), HOSTILE_QUICK, ids=_ids(HOSTILE_QUICK))
def test_hostile_document(finished, tmp_path, kind: str, text: str) -> None:
    """JSON of the wrong shape or nested 200 000 deep, repeated keys, a YAML alias bomb: bounded, then recomputed."""
    _case(finished, tmp_path, kind, _text(text))


HOSTILE_SLOW = [c for c in HOSTILE if c not in HOSTILE_QUICK]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "text"), HOSTILE_SLOW, ids=_ids(HOSTILE_SLOW))
def test_hostile_document_all(finished, tmp_path, kind: str, text: str) -> None:
    _case(finished, tmp_path, kind, _text(text))


def _generated(finished: Any, tmp_path: Path, kind: str, value: Any) -> None:
    _case(finished, tmp_path, kind, lambda path: _write_value(path, value))


VALUES = {
    ".pt": TORCH_VALUES,
    ".parquet": JSON_VALUES,
    ".yaml": JSON_VALUES,
    ".jsonl": JSON_VALUES,
    ".json": JSON_VALUES,
}
SUFFIX = {"checkpoint": ".pt", "results": ".pt", "sweep table": ".parquet", "config": ".yaml", "metrics": ".jsonl"}
KIND_VALUES = st.sampled_from(list(FILES)).flatmap(lambda k: st.tuples(st.just(k), VALUES[SUFFIX.get(k, ".json")]))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=KIND_VALUES)
def test_generated_wrong_values(finished, tmp_path, case: tuple[str, Any]) -> None:
    """A valid file of any kind holding generated values of the right format and the wrong content."""
    _generated(finished, tmp_path, *case)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=KIND_VALUES)
def test_generated_wrong_values_many(finished, tmp_path, case: tuple[str, Any]) -> None:
    _generated(finished, tmp_path, *case)


@pytest.fixture(scope="module", autouse=True)
def _write_counts() -> Iterator[None]:
    """With ``ICLAB_FUZZ_COUNTS=path``: the cases tried, handled and the data lost per file kind, with their
    provenance, written to ``path`` when the module ends (``scripts/reliability_table.py`` reads it)."""
    yield
    target = os.environ.get("ICLAB_FUZZ_COUNTS")
    if target and TALLY.tried:
        from iclab.core.io import atomic_write_json
        from iclab.core.provenance import provenance

        atomic_write_json(target, {"provenance": provenance(), **dataclasses.asdict(TALLY)})


def test_results_of_the_wrong_shape_are_recomputed(finished, tmp_path) -> None:
    """``results.pt`` holding ``{'hello': 1}`` with no checksum to fail (or a forged one): it loads, the card's own
    claims are its schema, it is moved aside and recomputed."""

    def plant(path: Path) -> None:
        torch.save({"hello": 1}, path)
        path.with_name(path.name + ".sha256").unlink()

    _case(finished, tmp_path, "results", plant)


def test_warnings_name_the_file(finished, tmp_path, caplog) -> None:
    """A damaged file gives one warning line naming it and where it was moved."""
    with caplog.at_level(logging.WARNING, logger="iclab"):
        _case(finished, tmp_path, "summary", _text('{"seconds": "abc"}'))
    lines = [r.getMessage() for r in caplog.records if "summary.json" in r.getMessage()]
    assert len(lines) == 1 and "summary.json.corrupt" in lines[0], lines


def test_reliability_table_matches_its_counts() -> None:
    """docs/reliability.md's fuzzer table is what scripts/reliability_table.py writes from the recorded counts."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "reliability_table.py"
    spec = importlib.util.spec_from_file_location("reliability_table", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.rewrite() == script.PAGE.read_text(), "run: python scripts/reliability_table.py"
