"""The documentation site (mkdocs.yml, docs/): ``mkdocs build --strict`` passes (a broken cross-reference, a page
missing from the nav or an unresolved API reference is an error), every internal link and anchor of every page
resolves, nothing is loaded from the network, and in chromium (Playwright, as tests/test_site_browser.py launches
it) the pages load without a console error, MathJax typesets the maths and search finds a word from ``file://``.

Skipped, with the reason, where the docs extra (mkdocs) is not installed; the browser tests also where playwright or
a chromium executable is missing.
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from site_fixtures import parse

pytest.importorskip("mkdocs", reason="the documentation site needs the docs extra (pip install -e '.[docs]')")

ROOT = Path(__file__).parents[1]
#: pages opened in chromium: the home page, a tutorial, a paper page, an API page with the notation's maths
BROWSER_PAGES = ("index.html", "tutorials/theory_meets_training.html", "papers/ahn2023.html", "api/index.html")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def test_every_doc_page_is_built(site: Path) -> None:
    built = {p.relative_to(site).with_suffix("").as_posix() for p in pages(site)}
    sources = {p.relative_to(ROOT / "docs").with_suffix("").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    tutorials = {f"tutorials/{p.stem}" for p in (ROOT / "docs" / "tutorials").glob("*.py")}
    assert sources | tutorials <= built


def test_links_resolve_and_nothing_is_remote(site: Path) -> None:
    ids = {page.resolve(): parse(page).ids for page in pages(site)}
    broken, remote = [], []
    for page in pages(site):
        text = page.read_text()
        for ref in parse(page).refs:
            url = urlsplit(ref)
            if url.scheme in ("data", "mailto", "javascript"):
                continue
            if url.scheme in ("http", "https") or ref.startswith("//"):
                if f'src="{ref}"' in text or f'<link href="{ref}" rel="stylesheet"' in text:
                    remote.append(f"{page.relative_to(site)}: {ref}")  # a resource, not a link to follow
                continue
            target = (page.parent / unquote(url.path)).resolve() if url.path else page.resolve()
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {ref}")
            elif url.fragment and target.suffix == ".html" and unquote(url.fragment) not in ids.get(target, set()):
                broken.append(f"{page.relative_to(site)}: {ref} (no id {url.fragment!r})")
    assert broken == []
    assert remote == [], "pages that load something from the network"


def test_api_reference_shows_exactly_all(site: Path) -> None:
    """Each API page documents every name of its package's ``__all__`` and no other top-level member."""
    for page in sorted((site / "api").glob("*.html")):
        if page.stem == "index":
            continue
        package = "iclab" if page.stem == "iclab" else f"iclab.{page.stem}"
        module = importlib.import_module(package)
        shown = {i.removeprefix(f"{package}.") for i in parse(page).ids if i.startswith(f"{package}.")}
        top = {i for i in shown if "." not in i}
        modules = {n for n in module.__all__ if inspect.ismodule(getattr(module, n))}  # pages of their own
        assert top == set(module.__all__) - modules, package


def open_page(browser: object, path: Path) -> tuple[object, list[str]]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto(path.as_uri(), wait_until="load")
    return page, errors


@pytest.mark.parametrize("name", BROWSER_PAGES)
def test_page_loads_clean_with_maths(browser: object, site: Path, name: str) -> None:
    page, errors = open_page(browser, site / name)
    try:
        if page.locator(".arithmatex").count():  # type: ignore[attr-defined]
            page.wait_for_selector("mjx-container svg", state="attached", timeout=20_000)  # type: ignore[attr-defined]
            assert page.locator(".arithmatex mjx-container").count() == page.locator(".arithmatex").count()  # type: ignore[attr-defined]
        else:
            assert name == "papers/ahn2023.html"  # the paper pages write their maths in Unicode
        images = page.eval_on_selector_all("img", "els => els.map(e => [e.getAttribute('src'), e.naturalWidth])")  # type: ignore[attr-defined]
        assert [src for src, width in images if width == 0] == [], "images that did not load"
        page.wait_for_timeout(50)  # type: ignore[attr-defined]
        assert errors == []
    finally:
        page.close()  # type: ignore[attr-defined]


def test_search_works_offline(browser: object, site: Path) -> None:
    page, errors = open_page(browser, site / "index.html")
    try:
        search = page.locator("input.md-search__input")  # type: ignore[attr-defined]
        search.click()
        search.press_sequentially("preconditioner")
        results = page.locator(".md-search-result__item")  # type: ignore[attr-defined]
        results.first.wait_for(timeout=20_000)
        assert results.count() > 0
        assert errors == []
    finally:
        page.close()  # type: ignore[attr-defined]
