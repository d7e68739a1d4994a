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
    tag: str = "0000",
    config: dict | None = None,
    figures: tuple[str, ...] = ("fig.png",),
) -> Path:
    """``out/<name>/<preset>-<tag>/`` as the runner writes it: config.yaml, claims.json, summary.json, figures."""
    run_dir = out / name / f"{preset}-{tag}"
    run_dir.mkdir(parents=True)
    config = config if config is not None else {"seeds": 2, "train": {"seed": 0, "steps": 3}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"experiment": name, "preset": preset, "config": config}))
    (run_dir / "claims.json").write_text(json.dumps(claims))
    for f in figures:
        figure(run_dir / f)
    summary = {"experiment": name, "preset": preset, "seconds": 1.5, "passed": True, "figures": list(figures)}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


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


def make_sweep_dir(out: Path, name: str = "lr", experiment: str = "zhang2025.fig1") -> Path:
    """``out/sweeps/<name>/`` as ``iclab sweep`` writes it: summary.json, sweep.parquet, sweep_<key>.png/.svg."""
    import pandas as pd  # the sweep table's reader; only these tests need it

    d = out / "sweeps" / name
    d.mkdir(parents=True)
    df = pd.DataFrame(SWEEP_ROWS, columns=["train.lr", "seed", "final_loss", "status"])
    df["claims_passed"] = [2, 2, 1, 0, 0]
    df["claims_total"] = 2
    df["seconds"] = [0.5, 0.4, 0.6, 0.5, 0.1]
    df["host"] = "localhost"
    df["error"] = [""] * 4 + ["Traceback (most recent call last):\n  ...\nDivergenceError: loss is nan <b>bold?</b>"]
    df["run_dir"] = [f"runs/{experiment}/smoke-{i}" for i in range(len(df))]
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
