"""The HTML report in a real browser: Playwright drives Debian's chromium (its executable path; Playwright's own
browser download is not used) over ``file://`` pages of a small real report (three experiments at smoke, one claim
forced to fail, a run of cheng2024.fig5 with a learning-rate override, a synthetic sweep with run directories and two
seeds, a compare page). Every page: no console error, every image loads, every link resolves; claim rows match
claims.json, the failing claim reads "failed" in red, a sweep column sorts as numbers both ways; the curves draw
their points, hover shows a value, the log toggle works, the sweep filter filters, the compare page overlays two
runs, the override run is listed, never shown as the reproduction, and a hostile metric name runs no script.

Skipped, with the reason, where playwright or a chromium executable is missing (`.ci/run` installs chromium).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from iclab.experiments.runner import run_experiment
from iclab.reporting.site import screenshot, write_compare, write_site
from site_fixtures import make_sweep_dir, parse

EXPERIMENTS = ("ahn2023.theorem5", "cheng2024.fig5", "zhang2025.fig1")  # ~0.3 s each at smoke
FAILING = "zhang2025.fig1"
PAGES = ("index.html", "ahn2023.html", "cheng2024.html", "zhang2025.html", "sweep-lr.html")
CURVES = "cheng2024.fig5"  # trains (metrics.jsonl); OVERRIDE is its run with another learning rate
OVERRIDE = "train.lr=0.005"
EVIL = "</script><script>alert(1)</script>"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, list[dict]]]:
    """(runs dir, site dir, experiment -> its claims.json) of a small real report."""
    out = tmp_path_factory.mktemp("runs")
    results = [run_experiment(name, "smoke", out=out) for name in EXPERIMENTS]
    claims = {}
    for r in results:
        path = r.out_dir / "claims.json"
        data = json.loads(path.read_text())
        if r.experiment.name == FAILING:  # one failing claim, as a real failure writes it
            data[0] |= {"passed": False, "checked": True, "detail": "forced to fail by the browser test"}
            path.write_text(json.dumps(data))
        claims[r.experiment.name] = data
    lr = run_experiment(CURVES, "smoke", out=out, overrides=[OVERRIDE])
    log = next(results[1].out_dir.rglob("metrics.jsonl"))  # a hostile metric name in the card run's curves
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps(r | {EVIL: 1.0 + i}) + "\n" for i, r in enumerate(rows)))
    make_sweep_dir(out, runs=True, seeds=2)
    site = write_site(out, results=results).parent
    write_compare(out, [results[1].out_dir, lr.out_dir])
    return out, site, claims


def open_page(browser: object, path: Path) -> tuple[object, list[str]]:
    """The page at ``path`` and the console errors, uncaught exceptions and dialogs (alert()) it raised."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("dialog", lambda d: (errors.append(f"dialog: {d.message}"), d.dismiss()))
    page.goto(path.as_uri(), wait_until="load")
    return page, errors


@pytest.mark.parametrize("name", PAGES)
def test_page_loads_clean(browser: object, report: tuple[Path, Path, dict], name: str) -> None:
    _, site, _ = report
    page, errors = open_page(browser, site / name)
    try:
        images = page.eval_on_selector_all("img", "els => els.map(e => [e.getAttribute('src'), e.naturalWidth])")
        assert images, f"{name} shows no figure"
        assert [src for src, width in images if width == 0] == [], "images that did not load"
        hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        assert hrefs
        broken = []
        for href in hrefs:
            url = urlsplit(href)
            assert url.scheme == "file", f"{name} links off the machine: {href}"
            target = Path(unquote(url.path))
            if not target.exists():
                broken.append(f"{href}: no such file")
            elif url.fragment and unquote(url.fragment) not in parse(target).ids:
                broken.append(f"{href}: no id {url.fragment!r} in {target.name}")
        assert broken == []
        page.wait_for_timeout(50)  # let late script errors arrive
        assert errors == []
    finally:
        page.close()


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_claim_rows_match_claims_json(browser: object, report: tuple[Path, Path, dict], experiment: str) -> None:
    _, site, claims = report
    page, _ = open_page(browser, site / f"{experiment.split('.')[0]}.html")
    try:
        rows = page.locator(f'section[id="{experiment}"] tr.claim')
        assert rows.count() == len(claims[experiment])
        statuses = [rows.nth(i).get_attribute("data-status") for i in range(rows.count())]
        expected = [
            "not checked" if not c["checked"] else "passed" if c["passed"] else "failed" for c in claims[experiment]
        ]
        assert statuses == expected
    finally:
        page.close()


def test_failing_claim_is_shown_failed(browser: object, report: tuple[Path, Path, dict]) -> None:
    _, site, claims = report
    page, _ = open_page(browser, site / "index.html")
    try:
        page.locator("#failed a", has_text=f"{FAILING} · {claims[FAILING][0]['name']}").click()
        page.wait_for_load_state("load")
        row = page.locator("tr.claim:target")  # the link lands on the claim's row
        assert row.count() == 1 and row.get_attribute("data-status") == "failed"
        badge = row.locator(".status")
        assert badge.is_visible() and badge.inner_text() == "failed"
        assert "forced to fail by the browser test" in row.inner_text()
        assert badge.evaluate("e => getComputedStyle(e).color") == "rgb(207, 34, 46)"  # red, by colour as well
        passed = page.locator('tr.claim[data-status="passed"] .status').first
        assert passed.evaluate("e => getComputedStyle(e).color") == "rgb(26, 127, 55)"
    finally:
        page.close()


def test_sweep_table_sorts_numerically(browser: object, report: tuple[Path, Path, dict]) -> None:
    _, site, _ = report
    page, errors = open_page(browser, site / "sweep-lr.html")
    try:
        table = page.locator("table.sweep")
        lrs = lambda: table.locator("tbody tr td:first-child").all_inner_texts()  # noqa: E731
        assert lrs() == ["0.001", "0.01", "0.1", "1", "10"] * 2  # two seeds
        header = table.locator("th", has_text="final_loss")
        header.click()
        twice = lambda xs: [x for x in xs for _ in (0, 1)]  # noqa: E731  (seed 1's loss is 1.1 times seed 0's)
        assert lrs() == twice(["0.1", "0.01", "0.001", "1", "10"])  # 0.0625 < 0.25 < 2.5 < 12; failed points last
        assert header.get_attribute("aria-sort") == "ascending"
        header.click()
        assert lrs() == twice(["1", "0.001", "0.01", "0.1", "10"])
        assert header.get_attribute("aria-sort") == "descending"
        assert errors == []
    finally:
        page.close()


def test_screenshot_of_the_index(browser: object, report: tuple[Path, Path, dict]) -> None:
    out, site, _ = report
    path = screenshot(site, out / "index.png")
    assert path == out / "index.png"
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (1280, 900)


def plot_of(page: object, selector: str) -> object:
    """The Plotly graph div inside the chart ``selector``, once scrolled to and drawn."""
    page.locator(selector).scroll_into_view_if_needed()  # type: ignore[attr-defined]
    page.wait_for_selector(f"{selector}[data-ready] .plot .scatterlayer .trace", state="attached")  # type: ignore[attr-defined]
    return page.locator(f"{selector} .plot")  # type: ignore[attr-defined]


def test_curves_draw_hover_and_log_toggle(browser: object, report: tuple[Path, Path, dict]) -> None:
    _, site, _ = report
    page, errors = open_page(browser, site / "cheng2024.html")
    try:
        chart = f'section[id="{CURVES}"] div.chart'
        plot = plot_of(page, chart)
        source = page.locator(f'section[id="{CURVES}"] script[type="application/json"]').text_content()
        data = json.loads(source)
        run = data["runs"][0]
        drawn = plot.evaluate("p => p.data.map(t => [t.name, t.x.length, t.y.slice()])")
        steps, train = run["series"]["train_loss"]
        assert [len(steps), train] in [[n, y] for _, n, y in drawn], "the train loss is drawn point for point"
        assert plot.locator(".scatterlayer .trace path.js-line").count() >= 2  # train and test loss
        plot.evaluate("p => Plotly.Fx.hover(p, [{curveNumber: 0, pointNumber: 1}])")
        hover = plot.locator(".hoverlayer .hovertext").text_content()
        assert f"{drawn[0][2][1]:.5g}" in hover and "step" in hover
        box = page.locator(f"{chart} input.chart-log-toggle")
        assert box.is_checked() and plot.evaluate("p => p.layout.yaxis.type") == "log"  # a positive loss
        box.click()
        assert plot.evaluate("p => p.layout.yaxis.type") == "linear"
        page.locator(f"{chart} select.chart-metric").select_option(EVIL)  # the hostile name is a menu entry
        assert plot.evaluate("p => p.data.length") >= 1
        page.wait_for_timeout(50)
        assert errors == []  # no alert(1): the name never ran
    finally:
        page.close()


def test_override_run_is_not_the_reproduction(browser: object, report: tuple[Path, Path, dict]) -> None:
    out, site, _ = report
    page, errors = open_page(browser, site / "cheng2024.html")
    try:
        section = page.locator(f'section[id="{CURVES}"]')
        card = next(
            d
            for d in (out / CURVES).iterdir()
            if (d / "summary.json").is_file() and "0.005" not in (d / "config.yaml").read_text()
        )
        shown = section.locator("dl.meta dd code").all_inner_texts()
        assert str(card) in shown and not any("0.005" in s or s.endswith(OVERRIDE) for s in shown)
        others = section.locator("table.other-runs tbody tr")
        assert others.count() == 1 and OVERRIDE in others.locator("td.overrides").inner_text()
        others.locator("a").click()
        page.wait_for_load_state("load")
        assert "Not the reproduction" in page.locator("p.run-label").inner_text()
        assert errors == []
    finally:
        page.close()


def test_sweep_charts_and_filter(browser: object, report: tuple[Path, Path, dict]) -> None:
    _, site, _ = report
    page, errors = open_page(browser, site / "sweep-lr.html")
    try:
        overlay = plot_of(page, 'div.chart[data-kind="overlay"]')
        assert overlay.evaluate("p => p.data.length") == 8  # 4 finished points x 2 seeds
        scatter = plot_of(page, 'div.chart[data-kind="scatter"]')
        assert scatter.evaluate("p => p.data[0].error_y.visible") is True  # seeds repeat: error bars
        assert "mean ± s.e. over seeds" in page.locator('div.chart[data-kind="scatter"] select').inner_text()
        rows = page.locator("table.sweep tbody tr")
        page.locator("input.table-filter").fill("0.001 ok")
        visible = [rows.nth(i).is_visible() for i in range(rows.count())]
        assert sum(visible) == 2 and "2 of 10 rows" in page.locator(".filter-count").inner_text()
        page.locator("input.table-filter").fill("")
        assert all(rows.nth(i).is_visible() for i in range(rows.count()))
        assert errors == []
    finally:
        page.close()


def test_compare_overlays_two_runs(browser: object, report: tuple[Path, Path, dict]) -> None:
    _, site, _ = report
    page, errors = open_page(browser, site / "compare.html")
    try:
        for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
            assert Path(unquote(urlsplit(href).path)).exists(), href
        plot = plot_of(page, "div.chart")
        names = plot.evaluate("p => p.data.map(t => t.name)")
        runs = page.locator("table.compared tbody tr td:first-child code").all_inner_texts()
        assert len(runs) == 2 and all(any(n.startswith(r + "/") for n in names) for r in runs)
        assert "train.lr" in page.locator("table.config-diff").inner_text()
        assert errors == []
    finally:
        page.close()
