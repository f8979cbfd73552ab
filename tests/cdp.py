"""A small client of the Chrome DevTools protocol for the browser tests: one headless Chromium driven over
--remote-debugging-pipe (the protocol's JSON messages, each ended by a NUL byte, on the browser's fds 3 and 4), so no
websocket library and no debugging port are needed."""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import time

# as tests/test_html_report.py runs it: no sandbox as root, no background connections on a closed network
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--remote-debugging-pipe"]


class Browser:
    """One Chromium process with one page (tab); `call` sends a command to the page and returns its result,
    `events` holds every page event received since it was last cleared."""

    def __init__(self, chromium: str, profile: str, log_path: str, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self.events: list[dict] = []
        self._next_id = 0
        self._buffer = b""
        self.session: str | None = None  # the page's, once attached
        browser_reads, self._writer = os.pipe()
        self._reader, browser_writes = os.pipe()
        child_ends = (browser_reads, browser_writes)

        def place_pipes():  # in the child, before exec: its ends on fds 3 (it reads) and 4 (it writes)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in child_ends]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        with open(log_path, "wb") as log:
            self.process = subprocess.Popen([chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            preexec_fn=place_pipes, pass_fds=(3, 4))
        for fd in child_ends:
            os.close(fd)
        try:
            target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        except BaseException:
            self.close()
            raise

    def call(self, method: str, params: dict | None = None) -> dict:
        return self._send(method, params or {}, self.session)

    def wait_for(self, method: str) -> dict:
        """The first page event `method` received (and since the events were last cleared)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            for event in self.events:
                if event["method"] == method:
                    return event["params"]
            self._receive(deadline)

    def settle(self, quiet_s: float = 0.3) -> None:
        """Receive events until none has come for `quiet_s` (late loads and errors after the load event)."""
        while self._receive(time.monotonic() + quiet_s, fail_late=False):
            pass

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited if a promise); a thrown error fails."""
        reply = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True})
        if "exceptionDetails" in reply:
            raise AssertionError(f"{expression[:60]}...: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def close(self) -> None:
        try:
            self._send("Browser.close", {})
        except (OSError, AssertionError):
            pass  # it may close the pipe before it replies
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._reader)
        os.close(self._writer)

    def _send(self, method: str, params: dict, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._writer, data):]
        except BrokenPipeError:
            raise AssertionError(f"Chromium closed its pipe (exit status {self.process.poll()})") from None
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._receive(deadline, want_id=self._next_id)
            if isinstance(reply, dict):
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]

    def _receive(self, deadline: float, want_id: int | None = None, fail_late: bool = True):
        """Read one message: the reply `want_id` is returned, a page event is kept in `events` (True returned).
        Past the deadline: fails, or with fail_late=False returns False."""
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._reader], [], [], left)[0]:
                if fail_late:
                    raise AssertionError(f"no answer from Chromium in {self.timeout_s} s")
                return False
            chunk = os.read(self._reader, 1 << 20)
            if not chunk:
                raise AssertionError(f"Chromium closed its pipe (exit status {self.process.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if want_id is not None and message.get("id") == want_id:
            return message
        if "method" in message and message.get("sessionId") == self.session:
            self.events.append(message)
        return True

