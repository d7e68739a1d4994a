"""The HTML report in a real browser: Playwright drives Debian's chromium (its executable path; Playwright's own
browser download is not used) over ``file://`` pages of a small real report (three experiments at smoke, one claim
forced to fail, a synthetic sweep). Every page: no console error, every image loads, every link resolves; claim rows
match claims.json, the failing claim reads "failed" in red, a sweep column sorts as numbers both ways.

Skipped, with the reason, where playwright or a chromium executable is missing (`.ci/run` installs chromium).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from iclab.experiments.runner import run_experiment
from iclab.reporting.site import BROWSER_ARGS, browser_executable, screenshot, write_site
from site_fixtures import make_sweep_dir, parse

EXPERIMENTS = ("ahn2023.theorem5", "cheng2024.fig5", "zhang2025.fig1")  # ~0.3 s each at smoke
FAILING = "zhang2025.fig1"
PAGES = ("index.html", "ahn2023.html", "cheng2024.html", "zhang2025.html", "sweep-lr.html")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = browser_executable()
    if executable is None:
        pytest.skip("browser tests skipped: no chromium executable on PATH (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser tests skipped: playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=list(BROWSER_ARGS))  # a fresh temporary profile
        yield b
        b.close()


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
    make_sweep_dir(out)
    site = write_site(out, results=results).parent
    return out, site, claims


def open_page(browser: object, path: Path) -> tuple[object, list[str]]:
    """The page at ``path`` and the console errors and uncaught exceptions it raised while loading."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
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
        assert lrs() == ["0.001", "0.01", "0.1", "1", "10"]
        header = table.locator("th", has_text="final_loss")
        header.click()
        assert lrs() == ["0.1", "0.01", "0.001", "1", "10"]  # 0.0625 < 0.25 < 2.5 < 12; the failed point last
        assert header.get_attribute("aria-sort") == "ascending"
        header.click()
        assert lrs() == ["1", "0.001", "0.01", "0.1", "10"]
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
