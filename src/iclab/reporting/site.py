"""The reproduction as a static HTML site: ``<out>/report/``, read from the run directories.

    write_site(Path("runs"))                   # after `iclab reproduce`, or any time from the run directories
    screenshot(Path("runs/report"))           # runs/report/index.png, when playwright and chromium are installed

Pages: ``index.html`` (every paper, its experiments with a figure each, claims passed/total, compute time, preset,
and what failed, each failing claim linked to its row), ``<paper>.html`` (per experiment, the run of the card's own
config: the card text, the training curves, the figures, the paper's numbers beside ours, the claims table, the
resolved config, seeds, time, the other runs with their overrides; the paper-preset numbers beside ours where docs/
has them), ``run-<experiment>--<run>.html`` (one per other run directory), ``sweep-<name>.html`` (an ``iclab sweep``:
every point's curves, each metric against each key, its table, sortable and filtered, with its figures) and, from
``iclab report --compare``, ``compare.html``. ``assets/`` holds the one CSS and the one small script (table sorting,
filters, charts) shipped in the package and the plotly.min.js of the ``plotly`` package: no CDN, no network, it
works from ``file://``; chart data sits in each page as JSON (:mod:`iclab.reporting.curves`).

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
from iclab.reporting.curves import Curves, Run, script_json
from iclab.reporting.pages import (
    SITE_DIR,
    ExperimentPage,
    PaperPage,
    SweepPage,
    find_runs,
    format_seconds,
    git_revision,
    library_version,
    paper_page,
    read_papers,
    read_run_dir,
    read_sweep_dir,
    slug,
)
from iclab.reporting.runs import flatten

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


def _script_json(data: Any) -> Markup:
    """Chart data for a ``<script type="application/json">`` element: JSON with ``<``, ``>`` and ``&`` escaped."""
    return Markup(script_json(data))


def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("iclab.reporting", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        fmt=_fmt, seconds=format_seconds, card=card_html, paper_page=paper_page, slug=slug, json=_script_json
    )
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
    experiments = find_runs(out, [Path(r.out_dir) for r in results] if results is not None else None)
    sweeps = [read_sweep_dir(s.parent) for s in sorted((out / "sweeps").glob("*/summary.json"))]
    failures = dict(failures or {})
    if not experiments and not sweeps and not failures:
        raise IclabError(f"no run directories or sweeps under {out}: run `iclab reproduce --out {out}` first")
    papers = read_papers(experiments, failures)
    site.mkdir(parents=True, exist_ok=True)
    common = _common(out, site, papers, sweeps) | {"plotly": _write_assets(site)}
    pages = _render_pages(common, experiments, papers, sweeps, failures)
    _write_pages(site, pages)
    for e in [*experiments, *(o for x in experiments for o in x.others)]:
        for problem in e.problems:
            log.warning("%s (%s): %s", e.name, e.run_dir, problem)
    for s in sweeps:
        for problem in s.problems:
            log.warning("sweep %s (%s): %s", s.name, s.dir, problem)
    return site / "index.html"


def _write_assets(site: Path) -> bool:
    """Copy the package's one CSS and one script into ``<site>/assets/``, and plotly.min.js from the ``plotly``
    package (once: a copy of the same size stays); False when plotly is not installed (no interactive charts)."""
    for name in ("site.css", "site.js"):
        src = importlib.resources.files("iclab.reporting") / "static" / name
        atomic_write_text(site / "assets" / name, src.read_text(encoding="utf-8"))
    try:
        bundle = Path(str(importlib.resources.files("plotly") / "package_data" / "plotly.min.js"))
    except ModuleNotFoundError:
        bundle = None
    if bundle is None or not bundle.is_file():
        log.warning("no interactive charts in the report: the plotly package is not installed (pip install plotly)")
        return False
    dest = site / "assets" / "plotly.min.js"
    if not dest.is_file() or dest.stat().st_size != bundle.stat().st_size:
        tmp = dest.with_suffix(".js.tmp")
        shutil.copyfile(bundle, tmp)
        os.replace(tmp, dest)
    return True


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
            **(common | {"plotly": False}),  # no chart: the index does not load plotly.min.js (4.8 MB)
        )
    }
    plotly = common["plotly"]
    for p in papers:
        failed_here = {k: v for k, v in failures.items() if k.split(".", 1)[0] == p.paper}
        charts = {"plotly": plotly and any(e.curves.runs for e in p.experiments)}
        pages[p.page] = env.get_template("paper.html").render(
            paper=p, failures=failed_here, current=p.paper, **(common | charts)
        )
    links: dict[Path, str] = {}
    for e in experiments:
        links[e.run_dir.resolve()] = f"{e.page}#{e.anchor}"
        for o in e.others:
            links.setdefault(o.run_dir.resolve(), o.run_page)
            charts = {"plotly": plotly and bool(o.curves.runs)}
            pages[o.run_page] = env.get_template("run.html").render(run=o, current=e.paper, **(common | charts))
    for s in sweeps:
        target = next((e for e in experiments if e.name == s.experiment), None)
        pages[s.page] = env.get_template("sweep.html").render(
            sweep=s, target=target, current=s.page, run_links=links, **(common | {"plotly": plotly and _has_charts(s)})
        )
    return pages


def _has_charts(s: SweepPage) -> bool:
    return bool(s.charts.get("scatter") or s.charts.get("overlay", {}).get("points"))


def _write_pages(site: Path, pages: Mapping[str, str]) -> None:
    """Write ``pages`` into ``site`` and delete the pages of papers or sweeps no longer there."""
    for name, html in pages.items():
        atomic_write_text(site / name, html)
    for stale in site.glob("*.html"):
        if stale.name not in pages and stale.name != "compare.html":  # `iclab report --compare` wrote that one
            stale.unlink()


# ------------------------------------------------------------------------------------------------ compare runs


def write_compare(out: str | Path, run_dirs: Sequence[str | Path]) -> Path:
    """Write ``<out>/report/compare.html``: the curves of ``run_dirs`` overlaid (one colour per run), the keys of
    their resolved configs (``config.yaml``) that differ, and their claims side by side. Raises ``IclabError`` for
    fewer than two run directories or one without a ``config.yaml`` or ``summary.json``."""
    if len(run_dirs) < 2:
        raise IclabError(f"--compare needs two run directories or more; got {len(run_dirs)}")
    for d in run_dirs:
        if not (Path(d) / "config.yaml").is_file() and not (Path(d) / "summary.json").is_file():
            raise IclabError(f"{d} is not a run directory (no config.yaml or summary.json): give <out>/<exp>/<run>")
    runs = [read_run_dir(d) for d in run_dirs]
    labels = _compare_labels(runs)
    curves = Curves(
        runs=tuple(
            Run(name=f"{label}/{r.name}", series=r.series) for label, e in zip(labels, runs) for r in e.curves.runs
        )
    )
    configs = [flatten(_config(e)) for e in runs]
    keys = list(dict.fromkeys(k for c in configs for k in c))
    said = [[json.dumps(c[k], sort_keys=True, default=str) if k in c else None for c in configs] for k in keys]
    diff = [(k, [_fmt(c[k]) if k in c else "—" for c in configs]) for k, s in zip(keys, said) if len(set(s)) > 1]
    names = list(dict.fromkeys(c.name for e in runs for c in e.claims))
    claims = [(n, [next((c for c in e.claims if c.name == n), None) for e in runs]) for n in names]
    out = Path(out)
    site = out / SITE_DIR
    site.mkdir(parents=True, exist_ok=True)
    common = _common(out, site, [], []) | {"plotly": _write_assets(site)}
    html = (
        _environment()
        .get_template("compare.html")
        .render(
            runs=runs,
            labels=labels,
            curves=curves,
            diff=diff,
            claims=claims,
            problems=[f"{label}: {p}" for label, e in zip(labels, runs) for p in e.problems],
            current="compare",
            **common,
        )
    )
    atomic_write_text(site / "compare.html", html)
    return site / "compare.html"


def _config(e: ExperimentPage) -> Any:
    import yaml

    from iclab.core.safe_parse import load_yaml_text

    try:
        data = load_yaml_text(e.config_text, what="config.yaml") if e.config_text else {}  # bounded
    except yaml.YAMLError:
        return {}
    return {"preset": e.preset} | (data.get("config", {}) if isinstance(data, dict) else {})


def _compare_labels(runs: Sequence[ExperimentPage]) -> list[str]:
    """Short unique names: the run directory's name, with its experiment where the experiments differ."""
    labels = [r.run_dir.name if len({x.name for x in runs}) == 1 else f"{r.name}/{r.run_dir.name}" for r in runs]
    return [f"{label} ({i + 1})" if labels.count(label) > 1 else label for i, label in enumerate(labels)]


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


def serve(out: str | Path, port: int = 8000, host: str = "127.0.0.1") -> Any:
    """An HTTP server (``http.server.ThreadingHTTPServer``, not yet serving) for ``iclab report --serve``: it serves
    ``out`` (the pages link the figures where the runs wrote them, ``../<experiment>/...``), and of it only regular
    files reached without a symbolic link: a link in ``out`` to ``/etc`` (or anywhere) answers 404, as does a
    directory, a device or a FIFO. ``OSError`` when the port cannot be bound."""
    import http.server
    import stat

    root = Path(os.path.realpath(out))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def send_head(self) -> Any:
            local = Path(self.translate_path(self.path))  # '..' and '.' already gone: a path under `directory`
            try:
                rel = local.relative_to(self.directory)
            except ValueError:
                rel = None
            if rel is not None and local.is_dir() and not os.path.islink(local):
                if not self.path.split("?", 1)[0].split("#", 1)[0].endswith("/"):
                    return super().send_head()  # a redirect to the directory's URL with its '/' (no listing)
                rel = rel / "index.html"
            if rel is None or os.path.realpath(root / rel) != str(root / rel) or not _regular(root / rel):
                self.send_error(404, "File not found")
                return None
            self.path = "/" + quote(rel.as_posix())  # the directory case: serve its index.html, no listing
            return super().send_head()

    def _regular(path: Path) -> bool:
        try:
            return stat.S_ISREG(os.lstat(path).st_mode)
        except OSError:
            return False

    def handler(*args: Any, **kwargs: Any) -> Handler:
        return Handler(*args, directory=str(root), **kwargs)

    return http.server.ThreadingHTTPServer((host, port), handler)
