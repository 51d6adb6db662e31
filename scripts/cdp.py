"""A small Chrome DevTools Protocol client for headless Chromium (used by scripts/browser_test.py).

Starts Debian's `chromium` (no browser download), opens pages and talks to them over the DevTools
websocket with `websocket-client`: navigate, evaluate JavaScript, collect JavaScript errors, take
screenshots. Only what the course's browser test needs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("Chromium not found: install it with `apt-get install -y chromium` (Debian).")


class Browser:
    """One headless Chromium process with its own throw-away profile."""

    def __init__(self, width: int = 1280, height: int = 1600, offline: bool = True):
        """offline: every request outside 127.0.0.1 and file:// fails (a proxy that is not there;
        loopback bypasses proxies), as on a laptop with no network."""
        self.profile = tempfile.mkdtemp(prefix="course-chromium-")
        args = [
            find_chromium(), "--headless=new", "--remote-debugging-port=0",
            f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
            "--disable-gpu", "--no-first-run", "--no-default-browser-check",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
            "--allow-file-access-from-files", "about:blank",
        ]
        if offline:
            args[1:1] = ["--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=127.0.0.1"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # CI runs as root; Chromium refuses its sandbox there
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline and self.port is None:
            line = self.process.stderr.readline()
            if not line and self.process.poll() is not None:
                raise RuntimeError(f"Chromium exited with code {self.process.returncode}")
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                self.port = int(match.group(1))
        if self.port is None:
            raise RuntimeError("Chromium did not start its DevTools server within 60 s")

    def new_page(self) -> Page:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?about:blank",
                                         method="PUT")
        with urllib.request.urlopen(request, timeout=30) as response:
            info = json.load(response)
        return Page(info["webSocketDebuggerUrl"])

    def close(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Page:
    """A page (tab): CDP calls, with every event kept in `self.events`."""

    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, timeout=120, suppress_origin=True,
                                              max_size=None)
        self.next_id = 0
        self.events: list[dict] = []
        self.call("Runtime.enable")
        self.call("Page.enable")
        self.call("Log.enable")

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def navigate(self, url: str, timeout: float = 60):
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout)

    def evaluate(self, expression: str, await_promise: bool = False):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=await_promise)
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluate failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60, interval: float = 0.25) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.evaluate(expression):
                    return True
            except RuntimeError:
                pass
            time.sleep(interval)
        return False

    def javascript_errors(self) -> list[str]:
        """Uncaught exceptions and console.error messages seen so far."""
        errors = []
        for event in self.events:
            if event["method"] == "Runtime.exceptionThrown":
                details = event["params"]["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text")
                errors.append(f"uncaught: {text}")
            elif event["method"] == "Runtime.consoleAPICalled" and \
                    event["params"]["type"] == "error":
                args = event["params"]["args"]
                errors.append("console.error: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in args))
        return errors

    def screenshot(self, path: Path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(base64.b64decode(data))

    def close(self):
        try:
            self.call("Page.close")
        except Exception:  # noqa: BLE001 - the tab may already be gone
            pass
        self.ws.close()
