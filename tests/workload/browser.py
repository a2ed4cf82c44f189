"""A real headless Chromium, driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON
messages ended by NUL, read on fd 4 and written on fd 3 of the browser), with the standard library only.

`chromium()` finds the browser; `needs_chromium()` skips a test without it outside CI and fails it under
CI=true (.ci/run installs it from Debian's packages: a CI machine without it must not pass quietly).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str | None:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def needs_chromium() -> str:
    """The browser's path; a skip with its reason outside CI, a failure under CI=true, when there is none."""
    found = chromium()
    if found:
        return found
    why = "no Chromium on PATH (apt-get install chromium; .ci/run and `make test` under CI=true install it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {why}: the HTML report's browser test must run in CI")
    pytest.skip(why)


class BrowserError(Exception):
    pass


class Browser:
    """One headless Chromium process; `open(url, width, height)` loads a page in a new tab of that size."""

    def __init__(self, binary: str, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.profile = tempfile.TemporaryDirectory(prefix="chromium-")
        self._log = open(Path(self.profile.name) / "stderr.log", "wb")  # noqa: SIM115 - the browser's, closed with it
        to_browser, self._ours_w = os.pipe()
        self._ours_r, from_browser = os.pipe()

        def pipes() -> None:  # the browser reads commands on fd 3 and writes replies on fd 4
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-extensions", "--hide-scrollbars", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile.name}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=pipes, stdout=subprocess.DEVNULL, stderr=self._log)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next = 0

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._ours_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            while b"\0" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._ours_r], [], [], left)[0]:
                    raise BrowserError(f"{method}: no answer from Chromium in {self.timeout_s:.0f}s")
                chunk = os.read(self._ours_r, 1 << 20)
                if not chunk:
                    err = (Path(self.profile.name) / "stderr.log").read_text(errors="replace")[-2000:]
                    raise BrowserError(f"{method}: Chromium closed its pipe: {err}")
                self._buffer += chunk
            raw, _, self._buffer = self._buffer.partition(b"\0")
            reply = json.loads(raw)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url: str, width: int, height: int) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})
        session = self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        page = Page(self, session)
        page.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        page.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + self.timeout_s
        while page.evaluate(f"location.href === {json.dumps(url)} && document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise BrowserError(f"{url} did not finish loading in {self.timeout_s:.0f}s")
            time.sleep(0.05)
        return page

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._ours_r)
        os.close(self._ours_w)
        self._log.close()
        self.profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, self.session)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            width, height = self.evaluate("[document.documentElement.scrollWidth, "
                                          "document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", params)["data"]))
        return path
