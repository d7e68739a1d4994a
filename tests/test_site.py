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
from iclab.core.config import config_hash, to_dict
from iclab.core.errors import IclabError
from iclab.experiments.registry import ClaimResult, check, get
from iclab.experiments.runner import resolve_config
from iclab.reporting.curves import Curves, Run, downsample, script_json
from iclab.reporting.pages import find_run_dirs, read_run_dir, read_sweep_dir
from iclab.reporting.runs import card_run_name, config_diff
from iclab.reporting.site import card_html, write_site
from site_fixtures import broken_links, claim, figure, loss_rows, make_run_dir, make_sweep_dir

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
    run = f"../zhang2025.fig1/{card_run_name('zhang2025.fig1', 'smoke')}"
    assert f'src="{run}/fig2.png"' in paper and f'href="{run}/fig2.svg"' in paper
    assert "git " in paper and "iclab 0.1.0" in paper
    assert broken_links(site) == []


def test_paper_vs_ours_from_the_docs(out: Path) -> None:
    paper = (write_site(out).parent / "ahn2023.html").read_text()
    if "paper-vs-ours" not in paper:
        pytest.skip("docs/papers/ahn2023.md is not beside the package (installed, not a checkout)")
    section = paper[paper.index('id="paper-vs-ours"') :]
    assert "<table>" in section and "ahn2023.theorem5" in section and "<strong>3/3</strong>" in section
    assert "paper preset</dt><dd>3/3 claims" in paper  # benchmarks/results/paper_presets.json beside ours


def test_newest_card_run_wins(out: Path) -> None:
    old = out / "zhang2025.fig1" / card_run_name("zhang2025.fig1", "smoke")
    new = make_run_dir(out, "zhang2025.fig1", [claim("a")], preset="quick")
    past = time.time() - 100
    os.utime(old / "summary.json", (past, past))
    assert find_run_dirs(out) == [out / "ahn2023.theorem5" / card_run_name("ahn2023.theorem5", "smoke"), new]
    home = write_site(out).read_text()
    assert "preset quick, smoke" in home and "3/3</strong> checked claims passed" in home
    assert "+1 other run" in home  # the smoke run is listed under the quick one


def test_results_select_the_run_dirs(out: Path) -> None:
    make_run_dir(out, "cheng2024.fig5", [claim("x")])
    results = [SimpleNamespace(out_dir=out / "cheng2024.fig5" / card_run_name("cheng2024.fig5", "smoke"))]
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
    assert sweep.points == 5 and sweep.columns[:4] == ("train.lr", "final_loss", "seed", "status")  # metrics first
    assert sweep.rows[0][0] == ("0.001", "0.001") and sweep.rows[4][1] == ("", "")  # NaN: empty, sorts last
    site = write_site(tmp_path).parent
    html = (site / "sweep-lr.html").read_text()
    assert len(re.findall(r"<tr data-status=", html)) == 5 and '<tr data-status="failed">' in html
    assert '<table class="sortable sweep" id="sweep-lr">' in html and 'src="../sweeps/lr/sweep_train.lr.png"' in html
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


# ------------------------------------------------------------------------ curves, the right run, paper beside ours


def chart_data(html: str, prefix: str) -> list[dict]:
    """The JSON of every chart whose id starts with ``prefix``, parsed as the page's script parses it."""
    return [
        json.loads(m)
        for m in re.findall(rf'<script type="application/json" id="{prefix}[^"]*">(.*?)</script>', html, re.S)
    ]


def test_card_run_is_the_reproduction_and_overrides_are_listed(tmp_path: Path) -> None:
    """A newer run with an override (`iclab run ahn2023.fig1 --preset smoke train.lr=0.005`) is listed under the
    card's run, labelled with its override, and has a page of its own; it never replaces the card's run."""
    name = "ahn2023.fig1"
    card = resolve_config(get(name), "smoke")
    config = to_dict(card)
    card_dir = make_run_dir(tmp_path, name, [claim("card claim")], config=config)
    lr = resolve_config(get(name), "smoke", ["train.lr=0.005"])
    other = make_run_dir(tmp_path, name, [claim("override claim")], tag=config_hash(lr), config=to_dict(lr), figures=())
    past = time.time() - 100
    os.utime(card_dir / "summary.json", (past, past))  # the override run is the newer
    assert card_dir.name == f"smoke-{config_hash(card)}" and card_dir.name == card_run_name(name, "smoke")
    assert find_run_dirs(tmp_path) == [card_dir]
    site = write_site(tmp_path).parent
    page = (site / "ahn2023.html").read_text()
    assert "card claim" in page and "override claim" not in page and f"<code>{card_dir}</code>" in page
    run_page = f"run-{name}--{other.name}.html"
    assert f'<a href="{run_page}">{other.name}</a>' in page and "<code>train.lr=0.005</code>" in page
    own = (site / run_page).read_text()
    assert "Not the reproduction" in own and "override claim" in own and "<code>train.lr=0.005</code>" in own
    assert broken_links(site) == []


def test_only_an_override_run_is_said_so(tmp_path: Path) -> None:
    lr = resolve_config(get("ahn2023.fig1"), "smoke", ["train.lr=0.005"])
    make_run_dir(tmp_path, "ahn2023.fig1", [claim("a")], tag=config_hash(lr), config=to_dict(lr))
    page = (write_site(tmp_path).parent / "ahn2023.html").read_text()
    assert "No run of the card's own config at preset smoke is here" in page and "<code>train.lr=0.005</code>" in page


def test_config_diff() -> None:
    a = {"train": {"lr": 0.01, "steps": 3}, "n": 20, "flag": True}
    b = {"train": {"lr": 0.005, "steps": 3}, "n": 20, "flag": False, "extra": [1, 2]}
    assert config_diff(a, b) == ["train.lr=0.005", "flag=false", "extra=[1, 2]"]
    assert config_diff(a, a) == [] and config_diff(b, a) == ["train.lr=0.01", "flag=true", "extra removed"]


def test_downsample_keeps_first_last_and_min() -> None:
    n = 100_000
    xs = [float(i) for i in range(n)]
    ys: list[float | None] = [1.0 + ((i * 7919) % 1000) / 1000 for i in range(n)]
    ys[12_345] = -5.0  # the best point, between two kept ones
    ys[3] = None  # a gap (not finite)
    dx, dy = downsample(xs, ys, 2000)
    assert len(dx) <= 2000 and dx[0] == 0.0 and dx[-1] == n - 1 and 12_345.0 in dx and -5.0 in dy
    assert dx == sorted(dx) and downsample(xs[:10], ys[:10], 2000) == (xs[:10], ys[:10])
    rows = [{"step": i, "train_loss": 1 / (1 + i)} for i in range(30_000)]
    payload = Curves(runs=(Run("seed0", read_metrics_rows(rows)), Run("seed1", read_metrics_rows(rows)))).payload()
    assert [len(s[0]) for r in payload["runs"] for s in r["series"].values()] == [1999, 1999]  # the min is the last
    assert payload["means"][0]["n"] == 2 and len(payload["means"][0]["series"]["train_loss"][0]) == 1999
    assert payload["means"][0]["group"] == "run"  # seed0, seed1: one group


def read_metrics_rows(rows: list[dict]) -> dict:
    series: dict = {}
    for r in rows:
        xs, ys = series.setdefault("train_loss", ([], []))
        xs.append(float(r["step"]))
        ys.append(r["train_loss"])
    return series


def test_curves_on_the_page(tmp_path: Path) -> None:
    rows = loss_rows(steps=6)
    rows[2]["test_loss"] = float("nan")  # json.dumps writes NaN; the page shows a gap
    make_run_dir(
        tmp_path,
        "ahn2023.fig6",
        [claim("a")],
        metrics={"n2-seed0": rows, "n2-seed1": loss_rows(6, 2.0), "n6-seed0": rows},
    )
    (tmp_path / "ahn2023.fig6").glob("*/n6-seed0/metrics.jsonl").__next__().open("a").write("{torn\n")
    site = write_site(tmp_path).parent
    html = (site / "ahn2023.html").read_text()
    (data,) = chart_data(html, "curves-")
    assert data["metrics"] == ["train_loss", "test_loss", "lr"]
    assert [(r["name"], r["group"], r["seed"]) for r in data["runs"]] == [
        ("n2-seed0", "n2", "0"),
        ("n2-seed1", "n2", "1"),
        ("n6-seed0", "n6", "0"),
    ]
    assert data["runs"][0]["series"]["test_loss"][1][2] is None
    (mean,) = data["means"]
    assert mean["group"] == "n2" and mean["series"]["train_loss"][1][0] == pytest.approx(3.0)  # (2 + 4) / 2
    assert "n6-seed0/metrics.jsonl: 1 line not readable, skipped" in html
    assert '<body data-plotly="assets/plotly.min.js">' in html and (site / "assets" / "plotly.min.js").is_file()
    assert "plotly.min.js" not in (site / "index.html").read_text()  # no chart there


def test_hostile_metric_names_stay_data(tmp_path: Path) -> None:
    evil = "</script><script>alert(1)</script>"
    rows = [{"step": 0, evil: 1.0, "train_loss": 2.0}, {"step": 1, evil: 0.5, "train_loss": 1.0}]
    make_run_dir(tmp_path, "zhang2025.fig1", [claim("a")], metrics={f"seed0{evil}": rows})
    html = (write_site(tmp_path).parent / "zhang2025.html").read_text()
    assert "<script>alert" not in html and "alert(1)</script>" not in html
    (data,) = chart_data(html, "curves-")
    assert evil in data["metrics"] and data["runs"][0]["series"][evil] == [[0.0, 1.0], [1.0, 0.5]]
    assert script_json({"k": "a\u2028</b>&"}) == '{"k":"a\\u2028\\u003c/b\\u003e\\u0026"}'


def test_figures_outside_the_run_dir_are_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir = make_run_dir(tmp_path, "zhang2025.fig1", [claim("a")])
    secret = figure(tmp_path / "secret.png")
    (tmp_path / "zhang2025.fig1" / "link.png").symlink_to(secret)
    summary = json.loads((run_dir / "summary.json").read_text())
    names = ["fig.png", "../../secret.png", str(secret), "../link.png"]
    (run_dir / "summary.json").write_text(json.dumps(summary | {"figures": names}))
    with caplog.at_level(logging.WARNING, logger="iclab"):
        page = read_run_dir(run_dir)
    assert [f.name for f in page.figures] == ["fig.png"]
    assert sum("outside the run directory" in p for p in page.problems) == 3
    assert caplog.text.count("is outside the run directory; ignored") == 3
    html = (write_site(tmp_path).parent / "zhang2025.html").read_text()
    assert 'secret.png"' not in html.replace("figure ../../secret.png", "")


def test_paper_values_beside_ours(tmp_path: Path) -> None:
    c = check("acc", 0.71, expected=0.7177, atol=0.02, paper=0.7177, where="Wang et al. 2025, Fig. 3")
    assert ClaimResult.from_dict(c.to_dict()) == c and c.to_dict()["where"] == "Wang et al. 2025, Fig. 3"
    assert "paper_value" not in check("b", 1.0, lo=0).to_dict()  # claims.json unchanged where the paper gives none
    make_run_dir(tmp_path, "wang2025.fig3", [c.to_dict(), claim("other")])
    html = (write_site(tmp_path).parent / "wang2025.html").read_text()
    table = html[html.index('<table class="paper-vs-ours">') :]
    table = table[: table.index("</table>")]
    assert "Wang et al. 2025, Fig. 3" in table and "0.7177" in table and "0.71" in table and "other" not in table
    assert '<span class="status passed">passed</span>' in table


def test_sweep_charts_filter_and_links(tmp_path: Path) -> None:
    make_run_dir(tmp_path, "zhang2025.fig1", [claim("a")])
    make_sweep_dir(tmp_path, runs=True, seeds=2)
    sweep = read_sweep_dir(tmp_path / "sweeps" / "lr")
    overlay, (scatter,) = sweep.charts["overlay"], sweep.charts["scatter"]
    assert len(overlay["points"]) == 8 and overlay["points"][0]["values"] == {"train.lr": 0.001, "seed": 0}
    assert scatter["repeated"] and scatter["traces"][0]["x"] == [0.001, 0.01, 0.1, 1.0]
    assert scatter["traces"][0]["y"][0] == pytest.approx(2.625) and scatter["traces"][0]["se"][0] == pytest.approx(
        0.125
    )
    site = write_site(tmp_path).parent
    html = (site / "sweep-lr.html").read_text()
    assert 'class="table-filter" data-table="sweep-lr"' in html and 'id="sweep-lr"' in html
    assert html.count('<a href="run-zhang2025.fig1--smoke-p') == 8  # every finished point's run page
    assert broken_links(site) == []
    one = tmp_path / "one"
    make_sweep_dir(one)
    (single,) = read_sweep_dir(one / "sweeps" / "lr").charts["scatter"]
    assert not single["repeated"] and single["traces"][0]["se"] == [None] * 4


def test_cli_report_compare(tmp_path: Path) -> None:
    name = "ahn2023.fig1"
    runs = []
    for lr in (0.01, 0.005):
        cfg = resolve_config(get(name), "smoke", [f"train.lr={lr}"])
        runs.append(
            make_run_dir(
                tmp_path,
                name,
                [claim("a", measured=lr)],
                tag=config_hash(cfg),
                config=to_dict(cfg),
                metrics={"seed0": loss_rows(scale=lr * 100)},
            )
        )
    res = CliRunner().invoke(app, ["report", "--out", str(tmp_path), "--compare", *map(str, runs)])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "report" / "compare.html").read_text()
    (data,) = chart_data(html, "compare-curves")
    assert [r["name"] for r in data["runs"]] == [f"{runs[0].name}/seed0", f"{runs[1].name}/seed0"]
    diff = html[html.index('class="sortable config-diff"') :]
    assert "<code>train.lr</code></td><td>0.01</td><td>0.005</td>" in diff.replace("\n", "")
    res = CliRunner().invoke(app, ["report", "--out", str(tmp_path), "--compare", str(runs[0])])
    assert res.exit_code == 2 and "two run directories or more" in res.output


def test_runs_that_skipped_steps_are_named_on_the_page(tmp_path: Path) -> None:
    """summary.json's ``skipped_steps`` (run -> [skipped, steps]) and ``retried`` (run -> [lr, step, retry lr]) are
    shown in the experiment's metadata; an entry of
    another shape is left out, and a run with none shows no such line."""
    run_dir = make_run_dir(tmp_path, "cheng2024.fig4", [claim("a")])
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["skipped_steps"] = {"linear-linear-L7-s0": [20, 3000], "odd": "x", "neg": [-1, 3]}
    summary["retried"] = {"linear-2-head-L7-s2": [0.01, 1220, 0.005], "odd": [0.01, "x", 1], "short": [1, 2]}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    make_run_dir(tmp_path, "zhang2025.fig1", [claim("a")])
    page = read_run_dir(run_dir)
    assert page.skipped == {"linear-linear-L7-s0": (20, 3000)}
    assert page.retried == {"linear-2-head-L7-s2": (0.01, 1220, 0.005)}
    site = write_site(tmp_path).parent
    html = (site / "cheng2024.html").read_text()
    assert "<dt>skipped steps</dt>" in html and "<code>linear-linear-L7-s0</code> 20 of 3000" in html
    assert "<dt>retried</dt>" in html and "<code>linear-2-head-L7-s2</code> lr 0.01 at step 1220, then 0.005" in html
    other = (site / "zhang2025.html").read_text()
    assert "skipped steps" not in other and "<dt>retried</dt>" not in other
