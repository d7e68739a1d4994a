"""The `paper` presets that run in about two minutes or less on the 2-core CPU, run to the end and checked: every
claim must pass, so a paper preset cannot silently rot. `make verify-paper` runs them; the list and its times are in
docs/performance.md ("Paper presets", the rows marked ✓). Slow: excluded from `make test`. The other tests here hold
benchmarks/results/paper_presets.json and the tables written from it (scripts/paper_preset_tables.py)."""

from __future__ import annotations

import pytest

from iclab.experiments import run_experiment

#: experiment -> seconds of its paper preset in this test (one torch thread, as every test; `make verify-paper` runs two
#: at once) on the quiet 2-core CPU: 941 s in all; the measured runs, with their provenance, are the ``verify`` runs of
#: benchmarks/results/paper_presets.json
VERIFIED = {
    "ahn2023.theorem2": 30,
    "ahn2023.theorem5": 59,
    "sun2025.constructions": 39,
    "sun2025.fig3": 276,
    "zhang2025.fig1": 14,
    "zhang2025.fig3": 10,
    "zhang2025.fig6": 10,
    "zhang2025.fig7": 23,
    "zhang2025.fig8": 7,
    "zhang2025.fig9": 12,
    "zhang2025.fig11": 15,
    "zhang2025.fig13": 19,
    "zhang2025.fig14": 259,
    "zhang2025.fig12": 168,  # 120 001 steps, 5/5
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VERIFIED))
def test_paper_preset_passes_every_claim(name: str, tmp_path) -> None:
    res = run_experiment(name, "paper", out=tmp_path)
    failed = [(c.name, c.measured, c.expected) for c in res.claims if not c.passed]
    assert not failed, f"{name} at paper: {failed}"


def _entries() -> dict:
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "paper_presets.json"
    return json.loads(path.read_text())


def test_paper_preset_records_are_diagnosed_and_carry_their_provenance() -> None:
    """Every record in benchmarks/results/paper_presets.json is of a registered experiment; a run or a reduced run that
    failed a claim carries the note that diagnoses it; every run, reduced run and projection carries its provenance
    (a dated record of the machine and threads, no free-text label); the runs marked ``verify`` are exactly the ones
    this file re-runs. A registered experiment without a record (a new card) is allowed: the tables show it as "not
    run" / "not probed"."""
    from iclab.experiments.registry import all_experiments

    data = _entries()
    entries = data["experiments"]
    assert set(entries) <= set(all_experiments())
    undiagnosed = [n for n, e in entries.items() if e.get("run") and e["run"]["passed"] < e["run"]["claims"] and not e.get("note")]  # fmt: skip
    undiagnosed += [
        f"{n} ({r['overrides']})"
        for n, e in entries.items()
        for r in e.get("reduced", [])
        if r["failed"] and not r.get("note")
    ]
    assert not undiagnosed
    records = [data["verify_paper"]]
    for e in entries.values():
        records += [r for r in (e.get("run"), e.get("estimate"), *e.get("reduced", [])) if r]
        for r in e.get("reduced", []):
            assert r["overrides"] and len(r["failed"]) == r["claims"] - r["passed"]
    for r in records:
        assert "where" not in r and "probe" not in r, r
        prov = r["provenance"]
        assert prov["date"][:4].isdigit() and prov["machine"]["threads"] >= 1 and prov["machine"]["cores"] >= 1
        assert prov["commit"] is None or len(prov["commit"]["sha"]) == 40
    assert {n for n, e in entries.items() if e.get("run", {}).get("verify")} == set(VERIFIED)


def _script(name: str):
    """scripts/<name>.py as a module (a script, not part of the package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tables_script():
    return _script("paper_preset_tables")


def without_rows(text: str, names: set[str]) -> str:
    """``text`` without the table rows of the experiments ``names``."""
    return "\n".join(line for line in text.splitlines() if not any(line.startswith(f"| {n} ") for n in names))


def test_tables_are_generated_from_the_data() -> None:
    """The paper-preset sections of docs/papers/*.md, docs/performance.md and docs/scaling.md are what
    scripts/paper_preset_tables.py writes from the JSON (run it after changing the data). Rows of registered
    experiments without a record may be absent: adding an experiment needs no script run."""
    import re

    from iclab.experiments.registry import all_experiments

    tables = _tables_script()
    data = _entries()
    unrecorded = set(all_experiments()) - set(data["experiments"])
    for path, begin, end, body in tables.blocks(data):
        m = re.search(re.escape(begin) + r"\n(.*?)\n" + re.escape(end), path.read_text(), re.S)
        assert m, f"{path}: no {begin} section"
        assert without_rows(m.group(1), unrecorded) == without_rows(body, unrecorded), (
            f"{path}: run python scripts/paper_preset_tables.py"
        )


def test_an_experiment_without_a_record_is_shown_not_run() -> None:
    """A card never run nor probed at paper gets a row "not run" / "not probed" (no error), in every table."""
    tables = _tables_script()
    data = {"intro": "", "experiments": {}}
    row = tables._row("zhang2025.fig3", {})
    assert row.startswith("| zhang2025.fig3 | not run | — | not probed |")
    assert "| zhang2025.fig3 | | | not probed | | — |" in tables.scaling_table({}, ["zhang2025.fig3"])
    bodies = {path.name: body for path, _, _, body in tables.blocks(data)}
    assert "| zhang2025.fig3 | not run | — | not probed |" in bodies["zhang2025.md"]
    assert "| zhang2025.fig3 | not run | — | not probed |" in bodies["performance.md"]


def test_the_scaling_table_totals_what_is_left_to_run() -> None:
    """The last row sums the projections of the probed experiments with no run at paper; a run takes its row out of
    that total, not out of the total of all."""
    tables = _tables_script()
    est = {"train_runs": 1, "train_steps": 10, "projected_seconds": 3600.0, "threads": 2}
    run = {"seconds": 100.0, "passed": 1, "claims": 1}
    entries = {"a": {"estimate": est}, "b": {"estimate": est, "run": run}, "c": {"estimate": dict(est, threads=1)}}
    lines = tables.scaling_table(entries, ["a", "b", "c", "d"]).splitlines()
    assert lines[-2] == "| **all probed** | | | | **5** | |"  # 2 + 2 + 1 core-hours
    assert lines[-1] == "| **not yet run at paper: 2** | | | | **3** | |"  # a and c


def test_replace_block_keeps_the_rest_of_the_file(tmp_path) -> None:
    """Only the marked section is rewritten, from the file as it is just before the write."""
    tables = _tables_script()
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\nbefore\n\n{tables.BEGIN}\nold\n{tables.END}\n\nafter\n")
    assert tables.replace_block(page, "new")
    assert page.read_text() == f"# Page\n\nbefore\n\n{tables.BEGIN}\nnew\n{tables.END}\n\nafter\n"
    assert not tables.replace_block(page, "new")  # unchanged: not rewritten
    assert [p.name for p in tmp_path.iterdir()] == ["page.md"]  # no temporary file left


def test_record_labels_a_reduced_budget_and_keeps_the_paper_run(tmp_path, monkeypatch) -> None:
    """`paper_preset_tables.py record`: a run at the paper's settings is the preset's ``run``; one with any setting
    changed goes to ``reduced``, labelled with every departure, and never replaces the paper run. Each carries the
    provenance of the machine that records it, and ``--workers``."""
    import datetime
    import json

    import yaml

    from iclab.core.config import to_dict
    from iclab.experiments.registry import get
    from iclab.experiments.runner import resolve_config

    tables = _tables_script()
    store = tmp_path / "paper_presets.json"
    store.write_text(json.dumps({"intro": "", "experiments": {}}))
    monkeypatch.setattr(tables, "JSON", store)
    name = "zhang2025.fig5"
    paper = to_dict(resolve_config(get(name), "paper"))
    claims = [
        {"name": "a", "passed": True, "checked": True},
        {"name": "b", "passed": False, "checked": True},
        {"name": "c", "passed": False, "checked": False},
    ]

    def run_dir(
        tag: str,
        config: dict,
        pieces: int = 1,
        skipped: dict | None = None,
        retried: dict | None = None,
        commit: dict | None = None,
    ) -> object:
        d = tmp_path / tag
        d.mkdir()
        summary = {"experiment": name, "preset": "paper", "seconds": 12.34} | ({"pieces": pieces} if pieces > 1 else {})
        summary |= ({"skipped_steps": skipped} if skipped else {}) | ({"retried": retried} if retried else {})
        summary |= {"commit": commit} if commit else {}
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "claims.json").write_text(json.dumps(claims))
        (d / "config.yaml").write_text(yaml.safe_dump({"experiment": name, "preset": "paper", "config": config}))
        return d

    assert tables.departures(name, paper) == []
    reduced = json.loads(json.dumps(paper))
    reduced["seeds"] = 1
    reduced["train"]["steps"] = 100
    tables.record(run_dir("reduced", reduced), None, workers=2)
    worktree = {"sha": "1" * 40, "dirty": False}  # the code that ran, not this checkout
    paper_dir = run_dir(
        "paper", paper, pieces=3, skipped={"r1": [20, 3000]}, retried={"r2": [0.01, 1220, 0.005]}, commit=worktree
    )
    tables.record(paper_dir, "note", conditions="beside a probe")
    tables.record(run_dir("reduced-again", reduced), "small")  # the same departures: replaces its entry
    entry = json.loads(store.read_text())["experiments"][name]
    (red,) = entry["reduced"]
    assert red["note"] == "small" and entry["note"] == "note"  # a reduced run's note stays with it
    assert red["overrides"] == f"seeds=1 (paper 6), train.steps=100 (paper {paper['train']['steps']})"
    assert (red["claims"], red["passed"], red["failed"]) == (2, 1, ["b"]) and "workers" not in red
    run = entry["run"]
    assert "overrides" not in run and run["conditions"] == "beside a probe" and entry["note"] == "note"
    assert run["provenance"]["commit"] == worktree and red["provenance"]["commit"] != worktree
    for r in (red, run):
        assert set(r["provenance"]) >= {"date", "commit", "machine", "python", "torch", "device"}
        assert r["provenance"]["machine"]["threads"] >= 1 and r["provenance"]["load"] is None
    # dated when the run wrote its summary, not when it was recorded
    stamp = (tmp_path / "paper" / "summary.json").stat().st_mtime
    assert run["provenance"]["date"] == datetime.datetime.fromtimestamp(stamp, datetime.UTC).isoformat(
        timespec="seconds"
    )
    row = tables._row(name, {"reduced": entry["reduced"]})
    assert f"not run; reduced budget ({red['overrides']}): 1/2 in" in row
    assert row.endswith(f"| Reduced run ({red['overrides']}): small |")
    assert run["pieces"] == 3 and "pieces" not in red  # a run continued after deadlines: its time is all pieces
    assert (
        tables.where(run).endswith(
            ", in 3 pieces; steps skipped for a non-finite loss or gradient: r1 20 of 3000; diverged and trained again"
            " from the initial weights at a lower lr: r2 at lr 0.01 (step 1220, then 0.005); beside a probe"
        )
        and tables.where(run)[:4].isdigit()
    )
    bare = {**run, "workers": 2, "conditions": None, "pieces": 1, "skipped_steps": None, "retried": None}
    assert tables.where(bare).endswith(", --workers 2") and "skipped_steps" not in red


def test_estimate_records_the_projection(tmp_path, monkeypatch) -> None:
    """`paper_preset_tables.py estimate`: the probe's projection (no per-run list) with its overrides and provenance."""
    import json

    from iclab.experiments import estimate as estimate_module
    from iclab.experiments.registry import RunProbe

    tables = _tables_script()
    store = tmp_path / "paper_presets.json"
    store.write_text(json.dumps({"intro": "", "experiments": {"zhang2025.fig3": {"note": "kept"}}}))
    monkeypatch.setattr(tables, "JSON", store)
    probe = RunProbe("r", "sampled", steps=100, probed_steps=3, seconds=0.5, fixed_seconds=0.2, step_seconds=0.1)
    seen: list[tuple] = []

    def fake_estimate(name, preset, probe_steps, overrides=()):
        seen.append(tuple(overrides))
        prov = {"date": "2026-01-02T03:04:05+00:00", "machine": {"cpu": "X", "cores": 2, "threads": 1}}
        return estimate_module.Estimate(
            "zhang2025.fig3", "paper", 3, 1.0, (probe,), overrides=tuple(overrides), provenance=prov
        )

    monkeypatch.setattr(estimate_module, "estimate_experiment", fake_estimate)
    tables.estimate("zhang2025.fig3", 3)
    tables.estimate("zhang2025.fig3", 3, ["train_size=100"], "beside a run")
    assert seen == [(), ("train_size=100",)]  # --set reaches the probe
    entry = json.loads(store.read_text())["experiments"]["zhang2025.fig3"]
    est = entry["estimate"]
    assert entry["note"] == "kept" and "runs" not in est
    assert est["projected_seconds"] == round(1.0 - 0.5 + 0.2 + 0.1 * 100, 1)
    assert est["overrides"] == ["train_size=100"] and est["probe_runs"] is None and est["conditions"] == "beside a run"
    assert tables.probe(est) == "3 steps × every run, train_size=100; 2026-01-02, 2 × X, 1 thread; beside a run"


def _queue_script():
    return _script("paper_queue")


def test_the_queue_runs_the_unrun_presets_cheapest_first_until_its_deadline(tmp_path, monkeypatch, capsys) -> None:
    """scripts/paper_queue.py: the experiments without a paper run, those started first (the one furthest along
    first), then by projected core-hours; each `iclab run` gets what
    is left of the deadline; a stopped one (75) ends the call with 75, a failure with its code; --dry-run runs none."""
    import json

    q = _queue_script()
    data = {"experiments": {
        "a.big": {"estimate": {"core_hours": 9.0}},
        "a.done": {"run": {}, "estimate": {"core_hours": 0.1}},
        "a.small": {"estimate": {"core_hours": 1.5}},
        "a.none": {},
    }}  # fmt: skip
    assert q.queue(data) == [("a.small", 1.5), ("a.big", 9.0)]
    assert q.queue(data, max_core_hours=2) == [("a.small", 1.5)]
    (tmp_path / "a.big" / "paper-123").mkdir(parents=True)  # started, not finished: continued first
    assert q.queue(data, out=tmp_path) == [("a.big", 9.0), ("a.small", 1.5)]
    # both started: the one with more time in its pieces first (a damaged pieces.json counts 0)
    (tmp_path / "a.small" / "paper-9").mkdir(parents=True)
    (tmp_path / "a.small" / "paper-9" / "pieces.json").write_text('[{"seconds": 30.0}, {"seconds": 40.5}, "x"]')
    assert q.spent(tmp_path, "a.small") == 70.5 and q.queue(data, out=tmp_path) == [("a.small", 1.5), ("a.big", 9.0)]
    (tmp_path / "a.big" / "paper-123" / "pieces.json").write_text('[{"seconds": 600.0}]')
    assert q.queue(data, out=tmp_path) == [("a.big", 9.0), ("a.small", 1.5)]
    (tmp_path / "a.big" / "paper-123" / "pieces.json").write_text('[{"seconds": 6')
    assert q.spent(tmp_path, "a.big") == 0.0 and q.queue(data, out=tmp_path)[0] == ("a.small", 1.5)
    (tmp_path / "a.small" / "paper-9" / "summary.json").write_text("{}")
    (tmp_path / "a.big" / "paper-123" / "summary.json").write_text("{}")
    assert q.queue(data, out=tmp_path) == [("a.small", 1.5), ("a.big", 9.0)]
    assert [name for name, _ in q.queue(json.loads(q.JSON.read_text()))][:1]  # the stored records parse
    monkeypatch.setattr(q, "queue", lambda _data, _max=None, _out=None: [("a.small", 1.5), ("a.big", 9.0)])
    calls: list[list[str]] = []
    codes = iter([0, 75])
    monkeypatch.setattr(q.subprocess, "call", lambda cmd: calls.append(cmd) or next(codes))
    assert q.main(["--time-limit", "1h", "--workers", "2", "--out", "/tmp/x"]) == 75
    assert [c[c.index("run") + 1] for c in calls] == ["a.small", "a.big"]
    limits = [int(c[c.index("--time-limit") + 1].rstrip("s")) for c in calls]
    assert 3500 < limits[1] <= limits[0] <= 3600 and calls[0][-2:] == ["--out", "/tmp/x"]
    calls.clear()
    codes = iter([1])
    assert q.main(["--time-limit", "1h"]) == 1 and len(calls) == 1  # a failure stops the queue
    calls.clear()
    codes = iter([3, 0])
    assert q.main(["--time-limit", "1h", "--keep-going"]) == 3 and len(calls) == 2  # ... or not, and says so
    assert "a.small: failed (exit 3)" in capsys.readouterr().out
    calls.clear()
    codes = iter([3, 75])
    assert q.main(["--time-limit", "1h", "--keep-going"]) == 3 and len(calls) == 2  # the failure outranks the stop
    calls.clear()
    assert q.main(["--dry-run"]) == 0 and not calls
    assert "a.small: 1.5 core-hours projected" in capsys.readouterr().out
    assert q.main(["--time-limit", "60s"]) == 75 and not calls  # less than a piece is worth: nothing started
