"""The review page (web/review) built once per session and served for headless Chromium.

Skipped, with the reason, where Debian's ``chromium``, ``npm`` or the
``playwright`` package is missing, unless ``EFFECTGATE_REQUIRE_BROWSER=1``
(set by ``.ci/run``): then a missing piece fails the test instead.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "web" / "review"
CHROMIUM = Path(os.environ.get("EFFECTGATE_CHROMIUM", "/usr/bin/chromium"))


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    if shutil.which("npm") is None:
        return "npm is missing (apt-get install npm)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing (pip install playwright)"
    return None


def need_browser() -> None:
    """Skip (or, under EFFECTGATE_REQUIRE_BROWSER=1, fail) where a piece is missing."""
    why = _missing()
    if why is None:
        return
    if os.environ.get("EFFECTGATE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"EFFECTGATE_REQUIRE_BROWSER=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def page_dist() -> Path:
    """``web/review/dist``: ``npm ci`` when node_modules is missing, then ``vite build``."""
    need_browser()
    if not (PAGE / "node_modules").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PAGE, check=True)
    subprocess.run(["npm", "run", "build", "--silent"], cwd=PAGE, check=True)
    return PAGE / "dist"


@pytest.fixture(scope="module")
def page_url(page_dist: Path) -> Iterator[str]:
    """The built page served by a static file server on a free loopback port."""
    handler = functools.partial(_Quiet, directory=str(page_dist))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/index.html"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        del format, args
