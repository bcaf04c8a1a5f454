"""The leaderboard page in a real browser: headless Chromium loads it from a file, a click on a column
header re-sorts the rows (numbers by value, empty cells last), and screenshots are written.

Needs Debian's ``chromium`` and ``chromium-driver`` (``make setup-browser``); skipped without them.
Driven through chromedriver's WebDriver HTTP protocol with plain ``urllib`` (no selenium), because
``--dump-dom`` alone cannot click. The screenshots land in the test's temporary folder (``pytest
--basetemp DIR`` to keep them somewhere known): ``leaderboard.png`` (``chromium --screenshot=``, the
page as opened) and ``leaderboard-sorted.png`` (after the clicks).
"""
import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from bench.cli import main
from tests.test_leaderboard import DENSE, MAG2, MAG4, TAYLOR, _write, labels


def _binary(name: str):
    found = shutil.which(name) or f"/usr/bin/{name}"
    return found if os.access(found, os.X_OK) else None


CHROMIUM, CHROMEDRIVER = _binary("chromium"), _binary("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                       reason="needs headless Chromium and chromedriver (/usr/bin/chromium, /usr/bin/chromedriver): "
                              "install them with `make setup-browser`"),
]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"   # the W3C WebDriver key of an element reference


def _flags(profile) -> list:
    """Headless as root in a container: no sandbox, no GPU, no network chatter, a fresh profile."""
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--window-size=1400,900"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriver:
    """The few W3C WebDriver commands this test needs, over HTTP with urllib."""

    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"
        self.session = None

    def call(self, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise AssertionError(f"WebDriver {method} {path}: {e.code} {e.read()[:500]!r}") from None

    def s(self, method: str, path: str, body=None):
        return self.call(method, f"/session/{self.session}{path}", body)

    def start(self, args):
        value = self.call("POST", "/session", {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}})
        self.session = value["sessionId"]

    def script(self, js: str, *args):
        return self.s("POST", "/execute/sync", {"script": js, "args": list(args)})

    def click(self, css: str):
        el = self.s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]
        self.s("POST", f"/element/{el}/click", {})


@pytest.fixture
def driver(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wd = WebDriver(port)
    try:
        for _ in range(100):
            try:
                if wd.call("GET", "/status").get("ready"):
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        wd.start(_flags(tmp_path / "profile-webdriver"))
        yield wd
    finally:
        if wd.session:
            try:
                wd.call("DELETE", f"/session/{wd.session}")
            except (AssertionError, urllib.error.URLError, ConnectionError):
                pass
        proc.terminate()
        proc.wait(timeout=30)


COLUMN = """const [bench, col] = arguments;
const table = document.querySelector(`table.lb[data-bench="${bench}"]`);
const i = Array.from(table.tHead.rows[0].cells).findIndex(th => th.dataset.col === col);
return Array.from(table.tBodies[0].rows).map(tr => tr.cells[i].textContent.trim());"""


def test_page_loads_sorts_on_header_clicks_and_is_screenshotted(tmp_path, driver):
    results, out = tmp_path / "results", tmp_path / "out"
    _write(results, "dense", {"fid": {"value": 5.0, "stderr": 0.2}, "is": 9.0}, {"params": 1234567, "flops": 2.5e9})
    _write(results, "magnitude:sparsity=0.4", {"fid": 20.0, "is": 10.0}, {"params": 800000, "flops": 1.5e9})
    _write(results, "magnitude:sparsity=0.2", {"fid": 10.0, "is": 8.0}, {"params": 900000})
    _write(results, "taylor:sparsity=0.4", {"is": 7.0}, {"params": 800000})
    assert main(["leaderboard", "--results", str(results), "--out", str(out)]) == 0
    page = out / "tiny" / "leaderboard.html"
    url = page.resolve().as_uri()

    shot = tmp_path / "leaderboard.png"
    subprocess.run([CHROMIUM, *_flags(tmp_path / "profile-shot"), f"--screenshot={shot}", url],
                   check=True, capture_output=True, timeout=180)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000

    driver.s("POST", "/url", {"url": url})
    assert driver.s("GET", "/title") == "varbench leaderboard · tiny world"
    methods = lambda: driver.script(COLUMN, "shapes-c2i", "methods")   # noqa: E731
    assert methods() == labels([DENSE, MAG2, MAG4, TAYLOR])                   # as written: FID, lower first

    driver.click('table.lb[data-bench="shapes-c2i"] th[data-col="is"] button')    # IS: higher is better
    assert methods() == labels([MAG4, DENSE, MAG2, TAYLOR])
    assert driver.script("return document.querySelector('th[data-col=\"is\"]').getAttribute('aria-sort')") == "descending"
    driver.click('table.lb[data-bench="shapes-c2i"] th[data-col="is"] button')    # again: reversed
    assert methods() == labels([TAYLOR, MAG2, DENSE, MAG4])

    driver.click('table.lb[data-bench="shapes-c2i"] th[data-col="params"] button')  # "1,234,567" sorts as a number
    params = [float(p.replace(",", "")) for p in driver.script(COLUMN, "shapes-c2i", "params")]
    assert params == sorted(params) and params[-1] == 1234567

    for _ in range(2):                                                   # both directions: empty FLOPs last
        driver.click('table.lb[data-bench="shapes-c2i"] th[data-col="flops"] button')
        flops = driver.script(COLUMN, "shapes-c2i", "flops")
        assert flops[2:] == ["", ""] and set(flops[:2]) == {"2.5e+09", "1.5e+09"}
    assert driver.script(COLUMN, "shapes-c2i", "flops")[:2] == ["2.5e+09", "1.5e+09"]   # second click: descending

    png = base64.b64decode(driver.s("GET", "/screenshot"))
    (tmp_path / "leaderboard-sorted.png").write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
