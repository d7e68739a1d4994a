"""The HTML report's data model: one dataclass per page, read from the files the runs wrote.

    page = read_run_dir(Path("runs/ahn2023.fig1/quick-874c25ad43"))     # ExperimentPage
    page.passed, page.checked, page.failed, page.figures, page.problems

:class:`ExperimentPage` is one run directory (``summary.json``, ``claims.json``, ``config.yaml``, figures, and the card
text from the registry); :class:`SweepPage` one ``<out>/sweeps/<name>/`` (``summary.json``, ``sweep.parquet``,
figures); :class:`PaperPage` a paper's experiments with what the repository's docs say of its paper preset. A missing
or damaged file never raises here: it becomes a line of the page's ``problems``. :mod:`iclab.reporting.site` renders
these pages.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import inspect
import logging
import math
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from markupsafe import Markup

from iclab.core.errors import CorruptFileError
from iclab.core.io import read_json
from iclab.core.provenance import describe
from iclab.core.safe_parse import load_yaml_text
from iclab.experiments.registry import ClaimResult, all_experiments
from iclab.experiments.runner import retried_entries, skipped_entries
from iclab.reporting.curves import Curves, read_curves
from iclab.reporting.runs import card_run_name, overrides_of, select_runs
from iclab.reporting.sweep_charts import resolve_run_dir, sweep_charts

log = logging.getLogger("iclab")

SITE_DIR = "report"  # <out>/report/: never read as a run directory


@dataclass(frozen=True, kw_only=True)
class ExperimentPage:
    """One experiment's run directory, as the site shows it."""

    name: str  # "ahn2023.fig1"
    run_dir: Path
    preset: str = "?"
    title: str = ""
    card: str = ""  # the card module's docstring
    seconds: float | None = None
    claims: tuple[ClaimResult, ...] = ()
    figures: tuple[Path, ...] = ()  # PNGs that exist; an SVG of the same stem may sit beside each
    config_text: str = ""
    seeds: dict[str, Any] = field(default_factory=dict)  # every config key naming a seed, dotted
    problems: tuple[str, ...] = ()  # files missing or damaged, in words
    curves: Curves = field(default_factory=Curves)  # the training runs' metrics.jsonl
    #: the overrides of the card's config at ``preset`` this run has: () the card's own run, None not known
    overrides: tuple[str, ...] | None = ()
    card_run: bool = True  # its directory name carries the hash of the card's own config
    others: tuple[ExperimentPage, ...] = ()  # the experiment's other run directories, newest first
    #: training runs that skipped steps for a non-finite loss or gradient: name -> (skipped, steps) (summary.json)
    skipped: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: training runs that diverged and trained again at a lower lr: name -> (lr, step, retry lr) (summary.json)
    retried: dict[str, tuple[float, int, float]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """'the card's config', or its overrides: 'train.lr=0.005'."""
        if self.card_run:
            return "the card's config"
        return ", ".join(self.overrides) if self.overrides else "overrides not known (the card is not registered here)"

    @property
    def run_page(self) -> str:
        """The file name of this run directory's own page."""
        return f"run-{slug(self.name)}--{slug(self.run_dir.name)}.html"

    @property
    def paper(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def page(self) -> str:
        """The file name of its paper's page."""
        return paper_page(self.name)

    @property
    def anchor(self) -> str:
        return slug(self.name)

    @property
    def checked(self) -> int:
        return sum(c.checked for c in self.claims)

    @property
    def passed(self) -> int:
        return sum(c.passed for c in self.claims if c.checked)

    @property
    def not_checked(self) -> int:
        return len(self.claims) - self.checked

    @property
    def failed(self) -> list[ClaimResult]:
        return [c for c in self.claims if c.status == "failed"]

    def claim_anchor(self, i: int) -> str:
        """The id of claim ``i``'s table row (unique on the paper page)."""
        return f"{self.anchor}--{i}-{slug(self.claims[i].name)}"


@dataclass(frozen=True, kw_only=True)
class SweepPage:
    """One sweep directory (``<out>/sweeps/<name>/``): its summary, its table and figures."""

    name: str
    dir: Path
    experiment: str = ""
    keys: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    points: int | None = None
    failed: int | None = None
    seconds: float | None = None
    figures: tuple[Path, ...] = ()
    columns: tuple[str, ...] = ()  # the swept keys, the metrics, then the rest (seed, status, run_dir, ...)
    rows: tuple[tuple[tuple[str, str], ...], ...] = ()  # per row, per column: (text shown, value sorted on)
    run_dirs: tuple[Path | None, ...] = ()  # per row, its run directory inside the report's ``out`` (None: none)
    charts: dict[str, Any] = field(default_factory=dict)  # :func:`iclab.reporting.sweep_charts.sweep_charts`
    problems: tuple[str, ...] = ()

    @property
    def page(self) -> str:
        return f"sweep-{slug(self.name)}.html"

    @property
    def numeric(self) -> tuple[bool, ...]:
        """Per column: every value a number (right-aligned)."""
        return tuple(all(_is_number(row[i][1]) for row in self.rows) for i in range(len(self.columns)))


def _is_number(key: str) -> bool:
    try:
        float(key or 0)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, kw_only=True)
class PaperPage:
    """One paper: its experiments and, where the repository's docs are at hand, its paper-preset table."""

    paper: str
    heading: str
    experiments: tuple[ExperimentPage, ...]
    preset_table: Markup | None = None  # docs/papers/<paper>.md between the paper-preset markers
    matched: Markup | None = None  # its "What matched and what did not" section
    paper_runs: dict[str, str] = field(default_factory=dict)  # experiment -> its paper-preset run, in words

    @property
    def page(self) -> str:
        return paper_page(self.paper)


def slug(s: str) -> str:
    """``s`` safe as a file name and an HTML id: letters, digits, ``_.-``; no leading dot."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-.") or "x"


def paper_page(name: str) -> str:
    """'ahn2023.fig1' or 'ahn2023' -> 'ahn2023.html'."""
    return f"{slug(name.split('.', 1)[0])}.html"


def natural(s: str) -> list[Any]:
    """'fig11' after 'fig3'."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _seeds(cfg: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(cfg, Mapping):
        for k, v in cfg.items():
            key = f"{prefix}{k}"
            if "seed" in str(k).lower() and not isinstance(v, Mapping):
                yield key, v
            else:
                yield from _seeds(v, key + ".")


def _card(module: str) -> str:
    try:
        return inspect.cleandoc(importlib.import_module(module).__doc__ or "")
    except ImportError:
        return ""


def read_run_dir(run_dir: str | Path) -> ExperimentPage:
    """An experiment page from ``run_dir``'s ``summary.json``, ``claims.json`` and ``config.yaml`` (and the card
    from the registry); each missing or damaged file becomes a line of ``problems``."""
    run_dir = Path(run_dir)
    problems: list[str] = []

    def load(name: str, parse: Any) -> Any:
        path = run_dir / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            return None
        try:
            return parse(path)
        except (CorruptFileError, OSError, yaml.YAMLError) as e:
            problems.append(f"{name} is damaged: {getattr(e, 'reason', e)}")
            return None

    summary = load("summary.json", read_json)
    summary = summary if isinstance(summary, dict) else {}
    raw_claims = load("claims.json", read_json)
    config_text = load("config.yaml", lambda p: p.read_text(errors="replace"))  # not UTF-8: damaged, not a crash
    config = None
    if config_text is not None:
        try:
            config = load_yaml_text(config_text, what="config.yaml")  # bounded: no alias bomb
        except yaml.YAMLError as e:
            problems.append(f"config.yaml is damaged: {str(e).splitlines()[0]}")
    config = config if isinstance(config, dict) else {}
    claims = []
    for i, c in enumerate(raw_claims if isinstance(raw_claims, list) else []):
        try:
            claims.append(ClaimResult.from_dict(c))
        except (KeyError, TypeError, AttributeError) as e:
            problems.append(f"claims.json entry {i} is not a claim ({type(e).__name__}: {e})")
    if raw_claims is not None and not isinstance(raw_claims, list):
        problems.append("claims.json is damaged: not a list of claims")
    name = str(summary.get("experiment") or config.get("experiment") or run_dir.parent.name)
    figures = confined(
        run_dir, summary.get("figures", []) if isinstance(summary.get("figures"), list) else [], problems
    )
    exp = all_experiments().get(name)
    seconds = summary.get("seconds")
    preset = str(summary.get("preset") or config.get("preset") or run_dir.name.split("-", 1)[0])
    overrides = overrides_of(name, preset, config.get("config")) if config else None
    curves = read_curves(run_dir)
    return ExperimentPage(
        name=name,
        run_dir=run_dir,
        preset=preset,
        title=exp.title if exp else "",
        card=_card(exp.module) if exp and exp.module else "",
        seconds=float(seconds) if isinstance(seconds, int | float) else None,
        claims=tuple(claims),
        figures=tuple(figures),
        config_text=config_text or "",
        seeds=dict(_seeds(config.get("config", {}))),
        problems=tuple(problems) + tuple(f"curves: {p}" for p in curves.problems),
        curves=curves,
        overrides=tuple(overrides) if overrides is not None else None,
        card_run=run_dir.name == card_run_name(name, preset),
        skipped=skipped_entries(summary.get("skipped_steps")),
        retried=retried_entries(summary.get("retried")),
    )


def confined(root: Path, names: Iterable[Any], problems: list[str]) -> list[Path]:
    """The files ``names`` (paths a run file gave, relative to ``root``) that exist inside ``root``; a name that
    leads outside it (``../../etc/x.png``, an absolute path, a link out) is ignored with a warning and a problem."""
    inside, base = [], root.resolve()
    for f in names:
        path = root / str(f)
        if not path.resolve().is_relative_to(base):
            log.warning("%s: figure %s is outside the run directory; ignored", root, f)
            problems.append(f"figure {f} is outside the run directory: ignored")
        elif path.is_file():
            inside.append(path)
        else:
            problems.append(f"figure {f} is missing")
    return inside


def find_runs(out: str | Path, main: Sequence[Path] | None = None) -> list[ExperimentPage]:
    """One page per experiment under ``out``: its card run (the newest run directory of the card's own config; the
    newest run directory when it has none, labelled with its overrides), the other run directories beside it.
    ``main``: show these run directories as the experiments' runs instead (the runs a reproduction just made)."""
    choices = select_runs(out)
    pages = []
    chosen = list(main) if main is not None else [c.card or c.others[0] for c in choices.values()]
    for run_dir in chosen:
        page = read_run_dir(run_dir)
        choice = choices.get(run_dir.parent.name)
        rest = [p for p in ([choice.card] if choice and choice.card else []) + list(choice.others if choice else ())]
        others = tuple(read_run_dir(p) for p in rest if p.resolve() != run_dir.resolve())
        pages.append(dataclasses.replace(page, others=others))
    return sorted(pages, key=lambda e: natural(e.name))


def find_run_dirs(out: str | Path) -> list[Path]:
    """The run directory every experiment under ``out`` shows: the newest of the card's own config (by
    ``summary.json``'s modification time), else the newest (:func:`iclab.reporting.runs.select_runs`)."""
    choices = select_runs(out)
    return [c.card or c.others[0] for _, c in sorted(choices.items(), key=lambda kv: natural(kv[0]))]


def _cell(v: Any) -> tuple[str, str]:
    """(text, sort key) of one sweep-table value; numbers sort as numbers, missing values last."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "", ""
    if hasattr(v, "item") and not isinstance(v, str | bytes):
        with contextlib.suppress(ValueError, TypeError):
            v = v.item()
    if isinstance(v, bool):
        return str(v).lower(), str(int(v))
    if isinstance(v, float):
        return f"{v:.4g}", repr(v)
    if isinstance(v, int):
        return str(v), str(v)
    return str(v), str(v)


def read_sweep_dir(sweep_dir: str | Path) -> SweepPage:
    """A sweep page from ``summary.json`` and ``sweep.parquet`` of ``sweep_dir``."""
    sweep_dir = Path(sweep_dir)
    problems: list[str] = []
    summary: Any = {}
    try:
        summary = read_json(sweep_dir / "summary.json")
    except CorruptFileError as e:
        problems.append(f"summary.json is damaged: {e.reason}")
    summary = summary if isinstance(summary, dict) else {}
    columns: tuple[str, ...] = ()
    rows: list[tuple[tuple[str, str], ...]] = []
    run_dirs: list[Path | None] = []
    charts: dict[str, Any] = {}
    keys = tuple(map(str, summary.get("keys", []) or []))
    metrics = tuple(map(str, summary.get("metrics", []) or []))
    table = sweep_dir / "sweep.parquet"
    if not table.is_file():
        problems.append("sweep.parquet is missing")
    else:
        import pandas as pd  # only sites with sweeps pay for pandas

        try:
            df = pd.read_parquet(table)
            df.columns = list(map(str, df.columns))
            first = [c for c in (*keys, *metrics) if c in df.columns]
            df = df[first + [c for c in df.columns if c not in first]]
            columns = tuple(df.columns)
            rows = [tuple(_cell(v) for v in row) for row in df.itertuples(index=False, name=None)]
            out = sweep_dir.parent.parent
            run_dirs = [resolve_run_dir(v, out) for v in df.get("run_dir", pd.Series([None] * len(df)))]
            charts = sweep_charts(df, keys=keys, metrics=[m for m in metrics if m in df.columns], out=out)
        except Exception as e:  # pyarrow raises several types for a torn file
            problems.append(f"sweep.parquet is damaged: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    names = summary.get("figures") if isinstance(summary.get("figures"), list) else None
    figures = confined(sweep_dir, names, problems) if names is not None else sorted(sweep_dir.glob("sweep_*.png"))

    def num(k: str) -> Any:
        v = summary.get(k)
        return v if isinstance(v, int | float) and not isinstance(v, bool) else None

    return SweepPage(
        name=str(summary.get("name") or sweep_dir.name),
        dir=sweep_dir,
        experiment=str(summary.get("experiment", "")),
        keys=keys,
        metrics=metrics,
        points=num("points"),
        failed=num("failed"),
        seconds=num("seconds"),
        figures=tuple(f for f in figures if f.is_file() and f.suffix == ".png"),
        columns=columns,
        rows=tuple(rows),
        run_dirs=tuple(run_dirs),
        charts=charts,
        problems=tuple(problems),
    )


# ------------------------------------------------------------------------------------- the repository's docs


def repo_root() -> Path | None:
    """The source checkout this package runs from (src layout), if docs/ is there; None when installed."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "docs" / "papers").is_dir() else None


_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://)[^)]*\)")


def _markdown(text: str) -> Markup:
    """Trusted Markdown of the repository's docs as HTML; relative links (to other docs) become plain text."""
    import markdown

    return Markup(markdown.markdown(_LINK.sub(r"\1", text), extensions=["tables"]))


def _paper_docs(root: Path | None, paper: str) -> tuple[str, Markup | None, Markup | None]:
    """(heading, paper-preset table, "what matched" section) of docs/papers/<paper>.md, or what is missing as None."""
    path = root / "docs" / "papers" / f"{slug(paper)}.md" if root else None
    if path is None or not path.is_file():
        return paper, None, None
    text = path.read_text()
    heading = text.splitlines()[0].lstrip("# ").strip() if text else paper
    table = None
    m = re.search(r"<!-- paper-preset:begin -->(.*?)<!-- paper-preset:end -->", text, re.S)
    if m:
        table = _markdown(m.group(1))
    matched = None
    m = re.search(r"^## What matched[^\n]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if m:
        matched = _markdown(m.group(1))
    return heading, table, matched


def _paper_runs(root: Path | None) -> dict[str, str]:
    """Experiment -> its paper-preset run in words, from benchmarks/results/paper_presets.json."""
    path = root / "benchmarks" / "results" / "paper_presets.json" if root else None
    if path is None or not path.is_file():
        return {}
    try:
        data = read_json(path)["experiments"]
        said = {}
        for name, entry in data.items():
            run, est = entry.get("run") or {}, entry.get("estimate") or {}
            if run:
                where = f" ({describe(run['provenance'])})" if run.get("provenance") else ""
                text = f"{run['passed']}/{run['claims']} claims in {format_seconds(float(run['seconds']))}{where}"
            elif est.get("projected_seconds"):
                text = f"not run here; projected {format_seconds(float(est['projected_seconds']))} (iclab estimate)"
            else:
                text = "not run here"
            said[str(name)] = text + (f"; {entry['note']}" if entry.get("note") else "")
        return said
    except (CorruptFileError, KeyError, TypeError, ValueError, AttributeError) as e:
        log.warning("%s: not used in the report (%s)", path, e)
        return {}


def read_papers(experiments: Sequence[ExperimentPage], failed: Iterable[str] = ()) -> list[PaperPage]:
    """One page per paper of ``experiments`` (and of the experiment names in ``failed``, which did not run), with
    the paper-preset table, the "what matched" section and each experiment's paper-preset run from the repository's
    docs when this package runs from a checkout (omitted otherwise)."""
    root = repo_root()
    paper_runs = _paper_runs(root)
    papers = []
    for paper in sorted({e.paper for e in experiments} | {n.split(".", 1)[0] for n in failed}, key=natural):
        heading, table, matched = _paper_docs(root, paper)
        exps = tuple(sorted((e for e in experiments if e.paper == paper), key=lambda e: natural(e.name)))
        runs = {e.name: paper_runs[e.name] for e in exps if e.name in paper_runs}
        papers.append(
            PaperPage(
                paper=paper, heading=heading, experiments=exps, preset_table=table, matched=matched, paper_runs=runs
            )
        )
    return papers


def git_revision() -> str:
    """``git rev-parse --short HEAD`` of the checkout this package runs from, else "unknown"."""
    root = repo_root()
    if root is None or not shutil.which("git"):
        return "unknown"
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev.stdout.strip() if rev.returncode == 0 and rev.stdout.strip() else "unknown"


def library_version() -> str:
    try:
        return importlib.metadata.version("iclab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def format_seconds(s: float | None) -> str:
    """12.3 s, 4.5 min, 2.1 h; "?" for None."""
    if s is None:
        return "?"
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"
