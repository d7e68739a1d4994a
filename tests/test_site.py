"""The HTML report (iclab.reporting.site) without a browser: pages built from run directories alone, counts, the
newest run directory per experiment, escaping of hostile strings, damaged files said in words, sweep tables, links,
and the SVG beside every PNG. The browser checks are in tests/test_site_browser.py."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from iclab.cli import app
from iclab.core.errors import IclabError
from iclab.reporting.pages import find_run_dirs, read_run_dir, read_sweep_dir
from iclab.reporting.site import card_html, write_site
from site_fixtures import broken_links, claim, figure, make_run_dir, make_sweep_dir

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def claim_rows(html: str) -> list[str]:
    return re.findall(r'<tr class="claim [^"]*" id="[^"]*" data-status="([^"]*)"', html)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    make_run_dir(
        tmp_path,
        "zhang2025.fig1",
        [claim("a"), claim("b", "failed", 3.25, "too far"), claim("c", "not checked", detail="not checked: smoke")],
        figures=("fig1.png", "fig2.png"),
    )
    make_run_dir(tmp_path, "ahn2023.theorem5", [claim("scale"), claim("loss")])
    return tmp_path


def test_site_from_run_dirs(out: Path) -> None:
    index = write_site(out)
    site = index.parent
    assert index == out / "report" / "index.html"
    assert {p.name for p in site.glob("*.html")} == {"index.html", "ahn2023.html", "zhang2025.html"}
    assert (site / "assets" / "site.css").is_file() and (site / "assets" / "site.js").is_file()
    home = index.read_text()
    assert "3/4</strong> checked claims passed" in home and "1 not checked at this preset" in home
    # the failing claim is named in "What failed" and linked to its row on the paper page
    link = re.search(r'<a href="(zhang2025\.html#([^"]+))">zhang2025\.fig1 · b</a>', home)
    assert link, "the failing claim is linked from the index"
    paper = (site / "zhang2025.html").read_text()
    assert claim_rows(paper) == ["passed", "failed", "not checked"]
    assert f'id="{link.group(2)}" data-status="failed"' in paper
    assert '<span class="status failed">failed</span>' in paper
    # the card text, the config, the seeds, the run's figures (and SVGs) by relative links
    assert "Zhang et al. 2025, Fig. 1" in paper and "attention_equals_mlp" in paper
    assert "train.seed = 0" in paper and "seeds = 2" in paper
    assert (
        'src="../zhang2025.fig1/smoke-0000/fig2.png"' in paper
        and 'href="../zhang2025.fig1/smoke-0000/fig2.svg"' in paper
    )
    assert "git " in paper and "iclab 0.1.0" in paper
    assert broken_links(site) == []


def test_paper_vs_ours_from_the_docs(out: Path) -> None:
    paper = (write_site(out).parent / "ahn2023.html").read_text()
    if "paper-vs-ours" not in paper:
        pytest.skip("docs/papers/ahn2023.md is not beside the package (installed, not a checkout)")
    section = paper[paper.index('id="paper-vs-ours"') :]
    assert "<table>" in section and "ahn2023.theorem5" in section and "<strong>3/3</strong>" in section
    assert "paper preset</dt><dd>3/3 claims" in paper  # benchmarks/results/paper_presets.json beside ours


def test_newest_run_dir_wins(out: Path) -> None:
    old = out / "zhang2025.fig1" / "smoke-0000"
    new = make_run_dir(out, "zhang2025.fig1", [claim("a")], preset="quick", tag="1111")
    past = time.time() - 100
    os.utime(old / "summary.json", (past, past))
    assert find_run_dirs(out) == [out / "ahn2023.theorem5" / "smoke-0000", new]
    home = write_site(out).read_text()
    assert "preset quick, smoke" in home and "3/3</strong> checked claims passed" in home


def test_results_select_the_run_dirs(out: Path) -> None:
    make_run_dir(out, "cheng2024.fig5", [claim("x")])
    results = [SimpleNamespace(out_dir=out / "cheng2024.fig5" / "smoke-0000")]
    index = write_site(out, results=results, failures={"sun2025.fig1": "ConfigError: bad"})  # type: ignore[arg-type]
    assert {p.name for p in index.parent.glob("*.html")} == {"index.html", "cheng2024.html", "sun2025.html"}
    home = index.read_text()
    assert "1 did not run" in home and "ConfigError: bad" in home
    assert broken_links(index.parent) == []


def test_hostile_strings_are_escaped(tmp_path: Path) -> None:
    make_run_dir(
        tmp_path,
        "zhang2025.fig1",
        [claim(HOSTILE, "failed", HOSTILE, HOSTILE)],
        config={"note": HOSTILE, "seed": HOSTILE},
    )
    site = write_site(tmp_path).parent
    for page in ("index.html", "zhang2025.html"):
        html = (site / page).read_text()
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(" in html
    assert len(claim_rows((site / "zhang2025.html").read_text())) == 1


def test_damaged_and_missing_files_are_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = make_run_dir(tmp_path, "zhang2025.fig1", [claim("a")], figures=("fig1.png", "gone.png"))
    (bad / "claims.json").write_text('[{"name": "a", "passe')
    (bad / "config.yaml").unlink()
    (bad / "gone.png").unlink()
    make_run_dir(tmp_path, "ahn2023.theorem5", [{"no": "name"}])
    with caplog.at_level(logging.WARNING, logger="iclab"):
        site = write_site(tmp_path).parent
    home = (site / "index.html").read_text()
    for said in ("claims.json is damaged: not readable JSON", "config.yaml is missing", "figure gone.png is missing"):
        assert said in home and said in caplog.text
    assert "claims.json entry 0 is not a claim (KeyError" in home
    assert "Nothing: every checked claim passed" not in home
    page = read_run_dir(bad)
    assert page.claims == () and [f.name for f in page.figures] == ["fig1.png"]
    assert broken_links(site) == []


def test_nothing_to_report(tmp_path: Path) -> None:
    with pytest.raises(IclabError, match=r"no run directories or sweeps under .*: run `iclab reproduce"):
        write_site(tmp_path)


def test_sweep_page(tmp_path: Path) -> None:
    make_run_dir(tmp_path, "zhang2025.fig1", [claim("a")])
    make_sweep_dir(tmp_path)
    sweep = read_sweep_dir(tmp_path / "sweeps" / "lr")
    assert sweep.points == 5 and sweep.columns[:4] == ("train.lr", "seed", "final_loss", "status")
    assert sweep.rows[0][0] == ("0.001", "0.001") and sweep.rows[4][2] == ("", "")  # NaN: empty, sorts last
    site = write_site(tmp_path).parent
    html = (site / "sweep-lr.html").read_text()
    assert len(re.findall(r"<tr data-status=", html)) == 5 and '<tr data-status="failed">' in html
    assert '<table class="sortable sweep">' in html and 'src="../sweeps/lr/sweep_train.lr.png"' in html
    assert 'href="zhang2025.html#zhang2025.fig1"' in html  # the swept experiment's section
    assert "<summary>DivergenceError: loss is nan &lt;b&gt;bold?&lt;/b&gt;</summary>" in html  # a traceback folds
    assert 'href="sweep-lr.html"' in (site / "index.html").read_text()
    assert broken_links(site) == []


def test_damaged_sweep(tmp_path: Path) -> None:
    d = make_sweep_dir(tmp_path)
    (d / "sweep.parquet").write_bytes(b"PAR1 torn")
    site = write_site(tmp_path).parent
    assert "sweep.parquet is damaged" in (site / "index.html").read_text()
    assert "sweep.parquet is damaged" in (site / "sweep-lr.html").read_text()


def test_stale_pages_are_removed(out: Path) -> None:
    site = write_site(out).parent
    (site / "cheng2024.html").write_text("old")
    write_site(out)
    assert not (site / "cheng2024.html").exists()


def test_card_html() -> None:
    html = card_html("Lead <b> with ``code``\nwrapped.\n\n    iclab run x\n\nClaims:\n- one: a\n  more\n- two `t`")
    assert html == (
        "<p>Lead &lt;b&gt; with <code>code</code> wrapped.</p>\n<pre>iclab run x</pre>\n<p>Claims:</p>\n"
        "<ul><li>one: a more</li><li>two <code>t</code></li></ul>"
    )


def test_figures_are_also_svg_and_deterministic(tmp_path: Path) -> None:
    png = figure(tmp_path / "a.png")
    svg = tmp_path / "a.svg"
    assert png == tmp_path / "a.png" and png.read_bytes()[:4] == b"\x89PNG"
    first = hashlib.sha256(svg.read_bytes()).hexdigest()
    assert svg.read_text().lstrip().startswith("<?xml") and "<text" in svg.read_text()  # text stays text
    figure(tmp_path / "a.png")
    assert hashlib.sha256(svg.read_bytes()).hexdigest() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "a.svg"]  # no temporary files left


def test_hostile_experiment_name_stays_inside_the_site(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path, "zhang2025.fig1", [claim("a")])
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps(summary | {"experiment": "../../evil<b>.fig1"}))
    site = write_site(tmp_path).parent
    pages = sorted(tmp_path.rglob("*.html"))
    assert len(pages) == 2 and all(p.parent == site for p in pages)  # ('' is not a file name: x.html)
    assert "../../evil&lt;b&gt;.fig1" in (site / "index.html").read_text()
    assert broken_links(site) == []


def test_cli_reproduce_writes_the_site(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["reproduce", "ahn2023.theorem5", "--preset", "smoke", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "report.md").is_file() and "site:" in res.output
    page = (tmp_path / "report" / "ahn2023.html").read_text()
    assert len(claim_rows(page)) == len(json.loads(next(tmp_path.glob("ahn2023.theorem5/*/claims.json")).read_text()))


def test_cli_report(out: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    res = CliRunner().invoke(app, ["report", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "report" / "index.html").is_file()
    empty = tmp_path_factory.mktemp("empty")
    res = CliRunner().invoke(app, ["report", "--out", str(empty)])
    assert res.exit_code == 2 and "no run directories or sweeps under" in res.output


def test_cli_report_serve(out: Path) -> None:
    """`iclab report --serve` serves OUT: the index and the figures it links load over HTTP."""
    iclab = Path(sys.executable).with_name("iclab")
    cmd = [str(iclab)] if iclab.is_file() else [sys.executable, "-m", "iclab.cli"]
    proc = subprocess.Popen(
        [*cmd, "report", "--out", str(out), "--serve", "--port", "0"], stderr=subprocess.PIPE, text=True
    )
    try:
        url = None
        assert proc.stderr is not None
        for line in proc.stderr:
            if m := re.search(r"serving (http://\S+)", line):
                url = m.group(1)
                break
        assert url and url.endswith("/report/index.html"), "no URL printed"
        html = urllib.request.urlopen(url, timeout=10).read().decode()
        src = re.search(r'<img src="([^"]+)"', html)
        assert src and urllib.request.urlopen(urllib.parse.urljoin(url, src.group(1)), timeout=10).status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
