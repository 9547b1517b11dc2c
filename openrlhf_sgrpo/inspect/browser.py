"""Headless Chromium over the DevTools protocol: open a report, read its DOM, catch its errors.

``--dump-dom`` alone cannot tell that a script threw, so this speaks the protocol (a websocket,
through ``aiohttp``): uncaught exceptions (``Runtime.exceptionThrown``), ``console.error`` and
browser log errors are collected, every network request the page makes is recorded (a
self-contained report makes none), and ``evaluate`` runs JavaScript in the page as a person's
clicks would. Debian ships the browser as ``chromium-headless-shell`` (or ``chromium``).

    python -m openrlhf_sgrpo.inspect.browser report.html --screenshot docs/img/inspector.png

exits 1 when the page logged a script error.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

CHROMIUM_ENV = "SGRPO_CHROMIUM"
CHROMIUM_NAMES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "headless_shell")
APT_PACKAGE = "chromium-headless-shell"
SETTLED_SCANS = 2  # walks of /proc in a row with nothing left of the browser's group (Browser._settle_group)


class BrowserError(RuntimeError):
    """Chromium did not start or did not answer; the message says what was tried."""


def find_chromium() -> str | None:
    """``$SGRPO_CHROMIUM`` or the first Chromium build on PATH."""
    explicit = os.environ.get(CHROMIUM_ENV)
    if explicit:
        return explicit if shutil.which(explicit) else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _describe_exception(details: dict) -> str:
    exc = details.get("exception") or {}
    text = exc.get("description") or details.get("text") or "exception"
    return f"{text} (line {details.get('lineNumber', '?')}:{details.get('columnNumber', '?')})"


def group_members(group: int) -> list[tuple[int, str, int]]:
    """``(pid, state, ppid)`` of every process in process group ``group``, zombies included."""
    members = []
    for stat_path in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat_path.read_text()
        except OSError:
            continue  # ended meanwhile
        fields = raw.rpartition(")")[2].split()  # state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == group:
            members.append((int(stat_path.parent.name), fields[0], int(fields[1])))
    return members


class Browser:
    """``with Browser() as b: b.open(url); b.evaluate(js); b.errors``: one headless page."""

    def __init__(self, executable: str | None = None, timeout_s: float = 60.0, width: int = 1280, height: int = 900):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise BrowserError(f"no Chromium found (tried ${CHROMIUM_ENV}, {', '.join(CHROMIUM_NAMES)}); "
                               f"install it with: apt-get install -y {APT_PACKAGE}")
        self.timeout_s, self.width, self.height = timeout_s, width, height
        self.errors: list[str] = []
        self.console: list[str] = []
        self.requests: list[str] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._loaded: asyncio.Event | None = None
        self._profile = tempfile.TemporaryDirectory(prefix="sgrpo-chromium-")
        self.profile_dir = self._profile.name  # on the browser's command line: it names its processes
        self._proc: subprocess.Popen | None = None
        self._loop = asyncio.new_event_loop()

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> Browser:
        # Only our own local file is rendered (no network), so Chromium's sandbox, which needs
        # user namespaces that containers and root shells often lack, is turned off.
        cmd = [self.executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
               f"--user-data-dir={self._profile.name}", f"--window-size={self.width},{self.height}", "about:blank"]
        # A group of its own: Debian's chromium-headless-shell is a shell script that runs the
        # browser as its child, so signalling the process we started would orphan the browser.
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            self._run(self._connect())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if getattr(self, "_ws", None) is not None:
                self._run(self._close())
        finally:
            if self._proc is not None:
                self._end_process_group()
                if self._proc.stderr is not None:
                    self._proc.stderr.close()
            self._loop.close()
            self._profile.cleanup()

    def _end_process_group(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the browser's whole process group (the wrapper script, the browser, its
        zygotes and renderers), SIGKILL to whatever of it still runs after ``grace_s``. Members
        that end up as this process's children (it may be a child subreaper: the sandbox service
        makes itself one) are reaped, so no zombie of the browser stays behind either."""
        group = self._proc.pid  # start_new_session: the group's id is the leader's pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break  # nothing of the group is left, not even a zombie
            if self._settle_group(group, grace_s):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=grace_s)

    def _settle_group(self, group: int, grace_s: float, scans: int = SETTLED_SCANS) -> bool:
        """Reap until ``scans`` walks of ``/proc`` in a row find the group settled (True), or
        ``grace_s`` passes (False). One walk is not atomic: a zombie read while its parent is still
        a member, the parent reaped before its own entry is read, looks parentless in that walk and
        reaches this process (a subreaper) only after it; stopping there left it a zombie for good
        (CI, 2026-12-07). Its reparenting is done by the time the parent is gone, so the next walk
        sees it as this process's child and reaps it."""
        deadline = time.monotonic() + grace_s
        settled = 0
        while time.monotonic() < deadline:
            settled = 0 if self._reap_group(group) else settled + 1
            if settled >= scans:
                return True
            time.sleep(0.05)
        return False

    def _reap_group(self, group: int) -> int:
        """Reap the group's zombies that are this process's children; how many members this walk
        reaped or found not settled yet (still running, or ended under a parent of the group), so
        that only a walk with nothing left to do counts as settled. Chromium is
        multithreaded: its main process shows as a zombie (not reapable yet) while other threads
        of it still end, and only then do its ended children pass to this process (a child
        subreaper) or to init; stopping at "nothing runs" left them here as zombies for good."""
        self._proc.poll()  # the leader: Popen reaps it
        members = group_members(group)
        in_group = {pid for pid, _, _ in members}
        unsettled = 0
        for pid, state, ppid in members:
            if state == "Z" and ppid == os.getpid() and pid != group:
                try:
                    os.waitpid(pid, os.WNOHANG)  # 0 while other threads of it still end
                except ChildProcessError:
                    continue  # reaped elsewhere meanwhile
                unsettled += 1
            elif state != "Z" or ppid in in_group:
                unsettled += 1
        return unsettled

    @property
    def pid(self) -> int | None:
        """The started process's pid, which is also its process group's id (None before start)."""
        return self._proc.pid if self._proc is not None else None

    def _run(self, coro):
        return self._loop.run_until_complete(asyncio.wait_for(coro, self.timeout_s))

    def _port(self) -> int:
        marker = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace")[-2000:] if self._proc.stderr else ""
                raise BrowserError(f"{self.executable} exited with {self._proc.returncode}: {err}")
            if marker.exists():
                first = marker.read_text().split("\n", 1)[0].strip()
                if first.isdigit():
                    return int(first)
            time.sleep(0.05)
        raise BrowserError(f"{self.executable} did not open its DevTools port within {self.timeout_s:.0f} s")

    async def _connect(self) -> None:
        port = self._port()
        self._loaded = asyncio.Event()
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next((t for t in targets if t.get("type") == "page"), None)
        if page is None:
            raise BrowserError(f"Chromium on port {port} lists no page target: {targets}")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.ensure_future(self._read())
        for domain in ("Runtime", "Log", "Page", "Network"):
            await self._send(f"{domain}.enable")
        await self._send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                         deviceScaleFactor=1, mobile=False)

    async def _close(self) -> None:
        self._reader.cancel()
        await self._ws.close()
        await self._session.close()

    # ------------------------------------------------------------ protocol
    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    if "error" in data:
                        fut.set_exception(BrowserError(f"DevTools error: {data['error']}"))
                    else:
                        fut.set_result(data.get("result", {}))
            else:
                self._event(data.get("method", ""), data.get("params", {}))

    def _event(self, method: str, params: dict) -> None:
        if method == "Runtime.exceptionThrown":
            self.errors.append("uncaught: " + _describe_exception(params.get("exceptionDetails", {})))
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append(f"{params.get('type')}: {text}")
            if params.get("type") in ("error", "assert"):
                self.errors.append(f"console.{params.get('type')}: {text}")
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") == "error":
                self.errors.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            self.requests.append(params.get("request", {}).get("url", ""))
        elif method == "Page.loadEventFired" and self._loaded is not None:
            self._loaded.set()

    async def _send(self, method: str, **params) -> dict:
        msg_id = next(self._ids)
        fut = self._loop.create_future()
        self._pending[msg_id] = fut
        await self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        return await fut

    # ------------------------------------------------------------ API
    def open(self, url_or_path: str | Path) -> None:
        """Navigate and wait for the load event (a path becomes a file:// URL)."""
        url = str(url_or_path)
        if "://" not in url:
            url = Path(url).resolve().as_uri()

        async def go():
            self._loaded.clear()
            result = await self._send("Page.navigate", url=url)
            if result.get("errorText"):
                raise BrowserError(f"cannot open {url}: {result['errorText']}")
            await self._loaded.wait()
        self._run(go())

    def evaluate(self, expression: str):
        """Run JavaScript in the page and return its value (JSON-serializable results)."""
        result = self._run(self._send("Runtime.evaluate", expression=expression, returnByValue=True,
                                      awaitPromise=True))
        if "exceptionDetails" in result:
            raise BrowserError("evaluate failed: " + _describe_exception(result["exceptionDetails"]))
        return result.get("result", {}).get("value")

    def screenshot(self, path: str | Path, full_height: int | None = None) -> Path:
        """PNG of the page at the browser's width; ``full_height`` px tall (default: the viewport)."""
        async def shoot():
            if full_height:
                await self._send("Emulation.setDeviceMetricsOverride", width=self.width, height=full_height,
                                 deviceScaleFactor=1, mobile=False)
            return await self._send("Page.captureScreenshot", format="png")
        data = base64.b64decode(self._run(shoot())["data"])
        path = Path(path)
        path.write_bytes(data)
        return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.inspect.browser",
                                description="Render a report in headless Chromium; report script errors.")
    p.add_argument("html", help="the report file")
    p.add_argument("--screenshot", help="write a PNG of the page here")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=1000)
    p.add_argument("--eval", default=None, help="JavaScript to run after load (e.g. a click) before the screenshot")
    args = p.parse_args(argv)
    if not Path(args.html).is_file():
        print(f"error: {args.html} is not a file", file=sys.stderr)
        return 2
    try:
        with Browser(width=args.width, height=args.height) as browser:
            browser.open(args.html)
            if args.eval:
                browser.evaluate(args.eval)
            if args.screenshot:
                print(f"wrote {browser.screenshot(args.screenshot, args.height)}")
            errors = list(browser.errors)
    except BrowserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for e in errors:
        print(f"script error: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
