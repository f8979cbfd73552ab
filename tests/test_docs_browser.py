"""The documentation site checked in a real browser (issue #45): every page of the built site, found in the build
rather than listed here, is served over HTTP as a static host would serve it and opened in headless Chromium (one
process for all pages). Each page loads with no console error and nothing failed or fetched from outside the site,
every link and image within the site resolves to a file (and a link's #anchor to an element of its page), and
every figure is drawn. Screenshots of the home page and a tutorial are written to $CHIPSIM_ARTEFACTS (CI's
artefacts; a temporary folder where it is unset)."""

from __future__ import annotations

import base64
import functools
import http.server
import os
import shutil
import struct
import threading
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")

VIEWPORT = {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}

# what the page holds once its images are loaded or failed (lazy ones made eager first): its links, images and ids
PAGE_CONTENT = """(async () => {
  const images = [...document.images];
  images.forEach(img => { img.loading = "eager"; });
  await Promise.all(images.map(img => img.complete ? null : new Promise(done => { img.onload = img.onerror = done; })));
  return {
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    images: images.map(img => ({src: img.src, naturalWidth: img.naturalWidth})),
    ids: [...document.querySelectorAll("[id]")].map(element => element.id),
  };
})()"""


@pytest.fixture(scope="module")
def server(docs_site):
    """The built site on a local HTTP server: the origin its pages are read from."""
    handler = functools.partial(_QuietHandler, directory=str(docs_site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # pytest's output is no place for an access log
        pass


def site_pages(site) -> list[str]:
    """Every HTML page of the built site, as the path a reader's browser asks for (a folder's index.html by its
    folder, as the site's own links name it)."""
    pages = []
    for folder, _, names in os.walk(site):
        for name in names:
            if name.endswith(".html"):
                path = os.path.relpath(os.path.join(folder, name), site).replace(os.sep, "/")
                pages.append("/" + (path[:-len("index.html")] if name == "index.html" else path))
    return sorted(pages)


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    folder = os.environ.get("CHIPSIM_ARTEFACTS") or str(tmp_path_factory.mktemp("artefacts"))
    os.makedirs(folder, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def visits(docs_site, server, artefacts, tmp_path_factory):
    """path -> what the browser saw on that page: its errors, its requests outside the site, its links, images
    and element ids; and the screenshots' paths."""
    from cdp import Browser

    pages = site_pages(docs_site)
    tutorials = [p for p in pages if p.startswith("/tutorials/")]
    assert "/" in pages and tutorials, f"the site has no home page or no tutorial: {pages}"
    shots = {"/": "docs-home.png", tutorials[0]: "docs-tutorial.png"}
    scratch = tmp_path_factory.mktemp("chromium")
    browser = Browser(CHROMIUM, str(scratch / "profile"), str(scratch / "chromium.log"))
    try:
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(f"{domain}.enable")
        browser.call("Emulation.setDeviceMetricsOverride", VIEWPORT)
        seen = {}
        for path in pages:
            browser.events.clear()
            navigation = browser.call("Page.navigate", {"url": server + path})
            assert "errorText" not in navigation, f"{path}: {navigation['errorText']}"
            browser.wait_for("Page.loadEventFired")
            content = browser.evaluate(PAGE_CONTENT)
            browser.settle()
            urls = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in browser.events
                    if e["method"] == "Network.requestWillBeSent"}
            content["errors"] = [e for e in (_error(event, urls) for event in browser.events) if e]
            content["outside"] = [url for url in urls.values() if not url.startswith((server + "/", "data:", "blob:"))]
            if path in shots:
                png = base64.b64decode(browser.call("Page.captureScreenshot", {"format": "png"})["data"])
                content["screenshot"] = os.path.join(artefacts, shots[path])
                with open(content["screenshot"], "wb") as f:
                    f.write(png)
            seen[path] = content
    finally:
        browser.close()
    return seen


def _error(event, urls: dict[str, str]) -> str | None:
    """The console error, failed load or HTTP error an event reports, or None; `urls` names the page's requests."""
    method, params = event["method"], event["params"]
    if method == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        return f"uncaught: {details.get('exception', {}).get('description') or details['text']}"
    if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
        return "console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
    if method == "Log.entryAdded" and params["entry"]["level"] == "error":
        return f"{params['entry']['text']} {params['entry'].get('url', '')}"
    if method == "Network.loadingFailed" and not params.get("canceled"):
        return f"load failed: {params['errorText']}: {urls.get(params['requestId'], params['requestId'])}"
    if method == "Network.responseReceived" and params["response"]["status"] >= 400:
        return f"HTTP {params['response']['status']}: {params['response']['url']}"
    return None


def test_every_page_loads_with_no_console_error_and_nothing_from_outside(visits):
    assert len(visits) >= 9  # home, a tutorial, five reference pages, two reports (and 404.html)
    assert {path: page["errors"] for path, page in visits.items() if page["errors"]} == {}
    # a font or script from elsewhere fails for a reader offline (and on CI's closed network)
    assert {path: page["outside"] for path, page in visits.items() if page["outside"]} == {}


def test_every_link_and_image_within_the_site_resolves(visits, server, docs_site):
    broken = []
    for path, page in visits.items():
        for url in page["links"] + [image["src"] for image in page["images"]]:
            target, anchor = urldefrag(url)
            if not target.startswith(server + "/"):
                continue  # another site, or mailto: (not fetched on a closed network)
            target_path = unquote(urlsplit(target).path)
            file = os.path.join(docs_site, target_path.lstrip("/"))
            if os.path.isdir(file):
                file = os.path.join(file, "index.html")
            if not os.path.isfile(file):
                broken.append(f"{path}: {url}: no such file")
            elif anchor and target_path in visits and unquote(anchor) not in visits[target_path]["ids"]:
                broken.append(f"{path}: {url}: no element with that id")
    assert broken == []


def test_every_figure_is_drawn(visits):
    images = {path: page["images"] for path, page in visits.items()}
    assert any(images.values()), "no page of the site has a figure: the reports' figures are gone"
    assert [(path, image["src"]) for path, found in images.items() for image in found
            if image["naturalWidth"] == 0] == []


def test_screenshots_of_the_home_page_and_a_tutorial(visits):
    shots = [page["screenshot"] for page in visits.values() if "screenshot" in page]
    assert [os.path.basename(shot) for shot in shots] == ["docs-home.png", "docs-tutorial.png"]
    for shot in shots:
        with open(shot, "rb") as f:
            head = f.read(24)
        assert head[:8] == b"\x89PNG\r\n\x1a\n", shot
        assert struct.unpack(">II", head[16:24]) == (VIEWPORT["width"], VIEWPORT["height"]), shot
