"""Helpers of the HTML-report tests (tests/test_site.py, tests/test_site_browser.py): synthetic run and sweep
directories, and a link checker that reads the written pages. Import with ``from site_fixtures import ...``."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import yaml

from iclab.plotting import save, subplots
from iclab.reporting.runs import card_run_name


def figure(path: Path) -> Path:
    """A small real figure (PNG + SVG) at ``path``."""
    fig, axes = subplots()
    axes[0, 0].plot(np.arange(10), np.arange(10) ** 2, label="x²")
    axes[0, 0].legend()
    return save(fig, path)


def make_run_dir(
    out: Path,
    name: str,
    claims: list[dict],
    *,
    preset: str = "smoke",
    tag: str | None = None,
    config: dict | None = None,
    figures: tuple[str, ...] = ("fig.png",),
    metrics: dict[str, list[dict]] | None = None,
) -> Path:
    """``out/<name>/<preset>-<tag>/`` as the runner writes it: config.yaml, claims.json, summary.json, figures, and
    ``metrics``: {training run: its metrics.jsonl rows}. ``tag`` None: the hash of the card's own config at ``preset``
    (the report shows it as the experiment's run), "0000" for an experiment the registry does not know."""
    if tag is None:
        tag = (card_run_name(name, preset) or f"{preset}-0000").split("-", 1)[1]
    run_dir = out / name / f"{preset}-{tag}"
    run_dir.mkdir(parents=True)
    config = config if config is not None else {"seeds": 2, "train": {"seed": 0, "steps": 3}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"experiment": name, "preset": preset, "config": config}))
    (run_dir / "claims.json").write_text(json.dumps(claims))
    for f in figures:
        figure(run_dir / f)
    summary = {"experiment": name, "preset": preset, "seconds": 1.5, "passed": True, "figures": list(figures)}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    for run, rows in (metrics or {}).items():
        (run_dir / run).mkdir(parents=True)
        (run_dir / run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def loss_rows(steps: int = 5, scale: float = 1.0, every: int = 10) -> list[dict]:
    """metrics.jsonl rows of a falling loss: train_loss, test_loss and lr every ``every`` steps."""
    return [
        {"step": s * every, "train_loss": scale * 2.0 / (1 + s), "test_loss": scale * 2.5 / (1 + s), "lr": 0.01}
        for s in range(steps)
    ]


def claim(name: str, status: str = "passed", measured: object = 0.5, detail: str = "") -> dict:
    return {
        "name": name,
        "passed": status == "passed",
        "checked": status != "not checked",
        "measured": measured,
        "expected": "<= 1",
        "detail": detail,
    }


SWEEP_ROWS = [  # lr, seed, final_loss, status; as numbers final_loss sorts 0.0625 < 0.25 < 2.5 < 12, as text 12 < 2.5
    (0.001, 0, 2.5, "ok"),
    (0.01, 0, 0.25, "ok"),
    (0.1, 0, 0.0625, "ok"),
    (1.0, 0, 12.0, "ok"),
    (10.0, 0, float("nan"), "failed"),  # a failed point: no metric, sorts last both ways
]


def make_sweep_dir(
    out: Path, name: str = "lr", experiment: str = "zhang2025.fig1", *, runs: bool = False, seeds: int = 1
) -> Path:
    """``out/sweeps/<name>/`` as ``iclab sweep`` writes it: summary.json, sweep.parquet, sweep_<key>.png/.svg.
    ``runs``: also a run directory with a metrics.jsonl per finished point (its ``run_dir`` written as the sweep
    would, relative to the directory it ran in); ``seeds``: every point repeated with seeds 0..seeds-1."""
    import pandas as pd  # the sweep table's reader; only these tests need it

    d = out / "sweeps" / name
    d.mkdir(parents=True)
    rows = [
        (lr, s, loss * (1 + 0.1 * s) if loss == loss else loss, st)
        for s in range(seeds)
        for lr, _, loss, st in SWEEP_ROWS
    ]
    df = pd.DataFrame(rows, columns=["train.lr", "seed", "final_loss", "status"])
    df["claims_passed"] = [2, 2, 1, 0, 0] * seeds
    df["claims_total"] = 2
    df["seconds"] = [0.5, 0.4, 0.6, 0.5, 0.1] * seeds
    df["host"] = "localhost"
    error = "Traceback (most recent call last):\n  ...\nDivergenceError: loss is nan <b>bold?</b>"
    df["error"] = ([""] * 4 + [error]) * seeds
    df["run_dir"] = [f"runs/{experiment}/smoke-{i}" for i in range(len(df))]
    if runs:
        for i, row in df.iterrows():
            if row["status"] == "ok":
                cfg = {"seeds": 1, "train": {"lr": float(row["train.lr"]), "seed": int(row["seed"])}}
                make_run_dir(
                    out,
                    experiment,
                    [claim("a")],
                    tag=f"p{i}",
                    config=cfg,
                    figures=(),
                    metrics={"seed0": loss_rows(scale=row["train.lr"])},
                )
                df.loc[i, "run_dir"] = f"elsewhere/{experiment}/smoke-p{i}"
    df.to_parquet(d / "sweep.parquet")
    figure(d / "sweep_train.lr.png")
    summary = {
        "kind": "sweep",
        "name": name,
        "experiment": experiment,
        "keys": ["train.lr"],
        "metrics": ["final_loss"],
        "points": 5,
        "failed": 1,
        "seconds": 2.1,
        "figures": ["sweep_train.lr.png"],
    }
    (d / "summary.json").write_text(json.dumps(summary))
    return d


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"] or "")
        for key in ("href", "src"):
            if a.get(key):
                self.refs.append(a[key] or "")


def parse(page: Path) -> _Refs:
    p = _Refs()
    p.feed(page.read_text())
    return p


def broken_links(site: Path) -> list[str]:
    """Every href/src of every page under ``site`` that names a missing file or a missing id; [] when all resolve."""
    bad = []
    ids = {page.resolve(): parse(page).ids for page in site.glob("*.html")}
    for page in site.glob("*.html"):
        for ref in parse(page).refs:
            url = urlsplit(ref)
            if url.scheme in ("http", "https", "data", "mailto"):
                continue
            target = (page.parent / unquote(url.path)).resolve() if url.path else page.resolve()
            if not target.exists():
                bad.append(f"{page.name}: {ref} (no file {target})")
            elif url.fragment and unquote(url.fragment) not in ids.get(target, set()):
                bad.append(f"{page.name}: {ref} (no id {url.fragment!r} in {target.name})")
    return bad
