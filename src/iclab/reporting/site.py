"""The reproduction as a static HTML site: ``<out>/report/``, read from the run directories.

    write_site(Path("runs"))                   # after `iclab reproduce`, or any time from the run directories
    screenshot(Path("runs/report"))           # runs/report/index.png, when playwright and chromium are installed

Pages: ``index.html`` (every paper, its experiments with figure thumbnails, claims passed/total, time, preset, and
what failed, each failing claim linked to its row), ``<paper>.html`` (per experiment: the card text, the figures,
the claims table, the resolved config, seeds, time; the paper-preset numbers beside ours where docs/ has them) and
``sweep-<name>.html`` (an ``iclab sweep`` table, sortable, with its figures). ``assets/`` holds the one CSS and the
one small script (table sorting) shipped in the package: no CDN, no network, it works from ``file://``.

Figures are not copied: pages link them where the runs wrote them, relative to the site
(``../<experiment>/<preset>-<hash>/fig1.png``), so the site stays valid while it lives in ``<out>`` beside the run
directories; ``iclab report --serve`` serves ``<out>`` for the same reason.

The data model is :mod:`iclab.reporting.pages` (one dataclass per page, read from the files on disk); this module
renders it with the Jinja2 templates in ``templates/`` (autoescaped: no string from a run directory is ever HTML).
A missing or damaged file never stops the site: the page says which file and why, in red, and the index counts it
among what failed.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import importlib.resources
import inspect
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from markupsafe import Markup, escape

from iclab.core.errors import IclabError
from iclab.core.io import atomic_write_text
from iclab.experiments.runner import ExperimentResult
from iclab.reporting.pages import (
    SITE_DIR,
    ExperimentPage,
    PaperPage,
    SweepPage,
    find_run_dirs,
    format_seconds,
    git_revision,
    library_version,
    natural,
    paper_page,
    read_papers,
    read_run_dir,
    read_sweep_dir,
)

log = logging.getLogger("iclab")

#: chromium flags for a headless, offline, throw-away browser (tests and :func:`screenshot`)
BROWSER_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def card_html(text: str) -> Markup:
    """A card docstring as HTML: blank-line paragraphs, ``- `` bullets as lists, indented blocks as code,
    ``code`` spans; everything escaped."""

    def inline(s: str) -> str:
        return re.sub(r"``(.+?)``|`(.+?)`", lambda m: f"<code>{m.group(1) or m.group(2)}</code>", str(escape(s)))

    parts = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = block.splitlines()
        if all(line.startswith("    ") for line in lines):
            parts.append(f"<pre>{escape(inspect.cleandoc(block))}</pre>")
            continue
        lead, items = [], []
        for line in lines:
            if re.match(r"\s*[-*] ", line):
                items.append(line.strip()[2:])
            elif items:
                items[-1] += " " + line.strip()
            else:
                lead.append(line.strip())
        if lead:
            parts.append(f"<p>{inline(' '.join(lead))}</p>")
        if items:
            parts.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
    return Markup("\n".join(parts))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list | dict):
        return json.dumps(v)
    return "" if v is None else str(v)


def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("iclab.reporting", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(fmt=_fmt, seconds=format_seconds, card=card_html, paper_page=paper_page)
    return env


def write_site(
    out: str | Path,
    *,
    results: Sequence[ExperimentResult] | None = None,
    failures: Mapping[str, str] | None = None,
) -> Path:
    """Write the site for the runs under ``out`` into ``<out>/report/`` and return its ``index.html``.

    ``results`` (from :func:`iclab.experiments.runner.run_experiment`): the pages show exactly these runs; without
    them, the newest run directory of every experiment under ``out``. ``failures``: experiment -> error, for those
    that did not run. Sweeps are every ``<out>/sweeps/*/summary.json``. Raises ``IclabError`` when ``out`` holds
    neither runs nor sweeps.
    """
    out = Path(out)
    site = out / SITE_DIR
    run_dirs = [Path(r.out_dir) for r in results] if results is not None else find_run_dirs(out)
    experiments = sorted((read_run_dir(d) for d in run_dirs), key=lambda e: natural(e.name))
    sweeps = [read_sweep_dir(s.parent) for s in sorted((out / "sweeps").glob("*/summary.json"))]
    failures = dict(failures or {})
    if not experiments and not sweeps and not failures:
        raise IclabError(f"no run directories or sweeps under {out}: run `iclab reproduce --out {out}` first")
    papers = read_papers(experiments, failures)
    site.mkdir(parents=True, exist_ok=True)
    _write_assets(site)
    pages = _render_pages(_common(out, site, papers, sweeps), experiments, papers, sweeps, failures)
    _write_pages(site, pages)
    for e in experiments:
        for problem in e.problems:
            log.warning("%s (%s): %s", e.name, e.run_dir, problem)
    for s in sweeps:
        for problem in s.problems:
            log.warning("sweep %s (%s): %s", s.name, s.dir, problem)
    return site / "index.html"


def _write_assets(site: Path) -> None:
    """Copy the package's one CSS and one script into ``<site>/assets/``."""
    for name in ("site.css", "site.js"):
        src = importlib.resources.files("iclab.reporting") / "static" / name
        atomic_write_text(site / "assets" / name, src.read_text(encoding="utf-8"))


def _common(out: Path, site: Path, papers: Sequence[PaperPage], sweeps: Sequence[SweepPage]) -> dict[str, Any]:
    """What every template sees: the papers and sweeps (for the navigation), the links relative to ``site``
    (``rel``, and ``svg`` for a figure's vector twin where one was written) and the footer's provenance."""

    def rel(path: Path) -> str:
        return quote(Path(os.path.relpath(path, site)).as_posix())

    def svg(path: Path) -> str | None:
        return rel(path.with_suffix(".svg")) if path.with_suffix(".svg").is_file() else None

    return {
        "papers": papers,
        "sweeps": sweeps,
        "rel": rel,
        "svg": svg,
        "version": library_version(),
        "revision": git_revision(),
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "out": str(out),
    }


def _totals(exps: Sequence[ExperimentPage], broken: int) -> dict[str, Any]:
    """The counts a summary row shows for ``exps``; ``broken``: experiments that did not run, counted as failed."""
    return {
        "experiments": len(exps),
        "checked": sum(e.checked for e in exps),
        "passed": sum(e.passed for e in exps),
        "not_checked": sum(e.not_checked for e in exps),
        "failed": sum(len(e.failed) + len(e.problems) for e in exps) + broken,
        "seconds": sum(e.seconds or 0.0 for e in exps),
    }


def _render_pages(
    common: dict[str, Any],
    experiments: Sequence[ExperimentPage],
    papers: Sequence[PaperPage],
    sweeps: Sequence[SweepPage],
    failures: Mapping[str, str],
) -> dict[str, str]:
    """file name -> HTML: ``index.html``, one page per paper and one per sweep."""
    env = _environment()
    paper_totals = {
        p.paper: _totals(p.experiments, sum(k.split(".", 1)[0] == p.paper for k in failures)) for p in papers
    }
    totals = _totals(experiments, len(failures)) | {
        "problems": sum(len(s.problems) for s in sweeps),
        "presets": sorted({e.preset for e in experiments}),
    }
    pages = {
        "index.html": env.get_template("index.html").render(
            experiments=experiments,
            failures=failures,
            totals=totals,
            paper_totals=paper_totals,
            current="index",
            **common,
        )
    }
    for p in papers:
        failed_here = {k: v for k, v in failures.items() if k.split(".", 1)[0] == p.paper}
        pages[p.page] = env.get_template("paper.html").render(paper=p, failures=failed_here, current=p.paper, **common)
    for s in sweeps:
        target = next((e for e in experiments if e.name == s.experiment), None)
        pages[s.page] = env.get_template("sweep.html").render(sweep=s, target=target, current=s.page, **common)
    return pages


def _write_pages(site: Path, pages: Mapping[str, str]) -> None:
    """Write ``pages`` into ``site`` and delete the pages of papers or sweeps no longer there."""
    for name, html in pages.items():
        atomic_write_text(site / name, html)
    for stale in site.glob("*.html"):
        if stale.name not in pages:
            stale.unlink()


# ------------------------------------------------------------------------------------------------ a browser


def browser_executable() -> str | None:
    """Debian's chromium (or Chrome) on PATH, else None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


def screenshot(
    site_dir: str | Path, path: str | Path | None = None, *, width: int = 1280, height: int = 900
) -> Path | None:
    """Save a PNG of ``site_dir/index.html`` (default ``site_dir/index.png``) as a headless chromium shows it, one
    viewport tall; None (and a log line saying why) when playwright or a chromium executable is missing.

    Playwright's sync API runs in a thread of its own, so this works where an event loop is running (a notebook,
    another Playwright session)."""
    executable = browser_executable()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        log.warning("no screenshot: playwright is not installed (pip install playwright)")
        return None
    if executable is None:
        log.warning("no screenshot: no chromium executable on PATH (apt-get install chromium)")
        return None
    site_dir = Path(site_dir).resolve()
    if not (site_dir / "index.html").is_file():
        raise IclabError(f"no site at {site_dir}: run `iclab report` first")
    path = Path(path) if path is not None else site_dir / "index.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(_shoot, executable, (site_dir / "index.html").as_uri(), path, width, height).result()
    return path


def _shoot(executable: str, url: str, path: Path, width: int, height: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="iclab-chromium-") as profile:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=executable, args=list(BROWSER_ARGS), viewport={"width": width, "height": height}
        )
        try:
            page = context.new_page()
            page.goto(url, wait_until="load")
            page.screenshot(path=str(path))
        finally:
            context.close()
