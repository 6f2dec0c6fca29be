"""The docs site (mkdocs.yml, issue #53): it builds with ``--strict`` (a broken link or anchor, a
page left out of the nav, a warning of any kind fails), and a real headless Chromium reads it
as a reader would: every page of the nav loads, the images show, the API page carries the
docstrings, search answers. Nothing it loads comes from any host but 127.0.0.1.

Needs the ``docs`` extra (mkdocs, mkdocstrings, playwright's client) and Debian's chromium
(scripts/services.sh installs it): without them the test skips, which CI=true turns into a
failure (tests/conftest.py).
"""

from __future__ import annotations

import functools
import http.server
import inspect
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"


def _nav_pages(nav) -> list[str]:
    """The Markdown files of mkdocs.yml's nav, in order."""
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def _html(md: str) -> str:
    stem = md[: -len(".md")]
    return (stem[: -len("README")] + "index" if stem.endswith("README") else stem) + ".html"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]' (make docs)")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=180)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log[-4000:]}"
    assert not re.search(r"^(WARNING|ERROR)", log, re.M), log[-4000:]
    return out


def test_the_site_builds_strictly_with_every_page_and_no_outside_asset(site):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = _nav_pages(config["nav"])
    # every page of docs/ is in the nav (the repo/ copies of files the guides link are not pages of it)
    on_disk = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(pages) == on_disk
    assert all((site / _html(p)).is_file() for p in pages)
    # an asset (script, style, font, image, frame) from another host would be a request the
    # reader's browser makes; a plain link in text is not
    asset = re.compile(r"<(?:script|link|img|iframe|source|video|audio)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.I)
    for html in site.rglob("*.html"):
        assert not asset.search(html.read_text()), f"{html.relative_to(site)} loads an asset from another host"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def served(site):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium; scripts/services.sh does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the docs extra: pip install -e '.[docs]'")
    with sync_api.sync_playwright() as pw:
        # Debian's chromium, not a browser playwright downloads; root needs --no-sandbox
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def test_every_page_loads_in_headless_chromium_and_nothing_leaves_localhost(served, browser):
    from rockroll.sandbox import SandboxSpec

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    requested: list[str] = []

    def guard(route):  # record every request, and let none out even if the assertion below would catch it
        requested.append(route.request.url)
        host = urlsplit(route.request.url).hostname
        route.continue_() if host == "127.0.0.1" else route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    pages = _nav_pages(config["nav"])
    assert pages[0] == "index.md"
    for md in pages:
        response = page.goto(f"{served}/{_html(md)}", wait_until="load")
        assert response is not None and response.status == 200, md
        # "<the page's heading> - rockroll"; the home page is the site's name alone
        title = page.title()
        assert title == config["site_name"] if md == "index.md" else title.endswith(f" - {config['site_name']}"), (md, title)

    # the images show: docs/*.png from a page beside them (sandbox.md's dashboard) and from a
    # subfolder (a result's curve), docs/img/*.png (the demo's curves)
    for md in ("sandbox.md", "results/guess-number-cpu.md", "results/demo-sft-rl.md"):
        page.goto(f"{served}/{_html(md)}", wait_until="load")
        widths = page.eval_on_selector_all("article img", "imgs => imgs.map(i => [i.src, i.complete && i.naturalWidth])")
        assert widths, f"{md}: no image"
        assert all(w for _, w in widths), f"{md}: images that did not load: {[s for s, w in widths if not w]}"
    assert any("/img/" in s for s, _ in widths)  # the demo's, from docs/img/

    # the API page shows SandboxSpec's docstring
    page.goto(f"{served}/api/sandbox.html", wait_until="load")
    first_line = inspect.getdoc(SandboxSpec).splitlines()[0]
    spec = page.locator("[id='rockroll.sandbox.SandboxSpec']").locator("xpath=..")
    assert first_line in spec.inner_text(), first_line
    assert page.locator("[id='rockroll.sandbox.open_sandbox']").count() == 1

    # search answers, from the index the site built (a web worker on the same origin)
    page.goto(f"{served}/index.html", wait_until="load")
    box = page.locator("input.md-search__input")
    box.click(timeout=10_000)
    box.press_sequentially("snapshot")  # typed, key by key, as a reader does
    results = page.locator(".md-search-result__item")
    results.first.wait_for(state="visible", timeout=20_000)
    assert results.count() > 0
    assert "snapshot" in page.locator(".md-search-result").inner_text().lower()

    context.close()
    assert not errors, errors
    assert requested and all(urlsplit(u).hostname == "127.0.0.1" for u in requested), \
        sorted({u for u in requested if urlsplit(u).hostname != "127.0.0.1"})
