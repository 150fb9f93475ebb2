"""profile=true's offline page: what one profiled run writes (summary.json, summary.html, breakdown.png),
the breakdown's numbers on planted intervals (the partition, the chart's segments, the page's table),
and the page rendered by a real headless browser (Debian's Chromium) with the network blocked: every
connection goes to a proxy on 127.0.0.1 that refuses it. The browser is driven over the DevTools
protocol (``--remote-debugging-pipe``), which reports every request the page makes: the page must
render, its chart must be decoded at its size, and the page must have asked for nothing beyond its
own file and inline data. (Chromium's own background traffic, its updater and sign-in pings, also
hits the refusing proxy; it is not the page's and is not counted.)"""

from __future__ import annotations

import base64
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _RefusingProxy(http.server.BaseHTTPRequestHandler):
    def _refuse(self) -> None:
        self.send_error(403, "blocked: no network in this test")

    do_GET = do_POST = do_HEAD = do_CONNECT = _refuse

    def log_message(self, *args) -> None:
        pass


class _Browser:
    """Headless Chromium over the DevTools pipe (fd 3: commands in, fd 4: answers and events out)."""

    def __init__(self, profile_dir: Path, proxy_port: int) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # in the child: the pipe ends at the fds Chromium reads and writes
            reads, writes = os.dup(to_browser_r), os.dup(from_browser_w)  # in case either is 3 or 4 already
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        self.proc = subprocess.Popen(
            [
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--remote-debugging-pipe", f"--user-data-dir={profile_dir}",
                f"--proxy-server=http://127.0.0.1:{proxy_port}", "--proxy-bypass-list=<-loopback>",
                "--window-size=1100,1500",
            ],
            preexec_fn=fds, close_fds=False, start_new_session=True,  # close_fds would close 3 and 4
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer, self._next_id, self.events = b"", 0, []

    def send(self, method: str, session: str | None = None, timeout: float = 60, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            answer = self._read(deadline)
            if answer.get("id") == self._next_id:
                assert "error" not in answer, answer
                return answer["result"]
            self.events.append(answer)
        raise TimeoutError(method)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = next((e for e in self.events if e.get("method") == method), None)
            if found:
                return found
            self.events.append(self._read(deadline))
        raise TimeoutError(method)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            assert time.time() < deadline, "the browser stopped answering"
            chunk = os.read(self._from_browser, 1 << 16)
            assert chunk, "the browser closed its pipe"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        os.close(self._to_browser)
        os.close(self._from_browser)


def _render(page: Path, screenshot: Path, evaluate: str = "null") -> tuple:
    """Load ``page`` in headless Chromium with the network blocked, save a screenshot; return (the URLs
    the page requested other than its own file and inline ``data:``, the value of the JavaScript
    expression ``evaluate`` in the loaded page)."""
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusingProxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    browser = _Browser(screenshot.parent / f"{screenshot.stem}-profile", proxy.server_address[1])
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        browser.send("Network.enable", session)
        browser.send("Page.enable", session)
        browser.send("Page.navigate", session, url=page.as_uri())
        browser.wait_for("Page.loadEventFired")
        time.sleep(0.5)  # late requests (none expected) still arrive as events
        value = browser.send("Runtime.evaluate", session, expression=evaluate, returnByValue=True)["result"]
        shot = browser.send("Page.captureScreenshot", session, format="png")["data"]
        screenshot.write_bytes(base64.b64decode(shot))
        requested = [
            e["params"]["request"]["url"]
            for e in browser.events
            if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == session
        ]
    finally:
        browser.close()
        proxy.shutdown()
        proxy.server_close()
    return [url for url in requested if url != page.as_uri() and not url.startswith("data:")], value.get("value")


def _not_blank(png: Path) -> int:
    """How many distinct colours the screenshot has (a blank or error page has a handful)."""
    from PIL import Image

    image = Image.open(png).convert("RGB")
    return len(image.getcolors(maxcolors=1 << 20) or [])


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One tiny profile=true run for the module's tests: (metrics, run dir)."""
    from conftest import TINY

    from trainer.config.compose import compose_for_run
    from trainer.run import run

    out = tmp_path_factory.mktemp("profiled") / "run"
    args = [*TINY, "profile=true", "trainer.max_epochs=1", "data.num_samples=128", "profiler.skip_first=1"]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("TRAINER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        return run(compose_for_run(args), str(out), args), out


def _embedded_png(text: str) -> bytes:
    images = re.findall(r'<img alt="step time breakdown" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', text)
    assert len(images) == 1, "the page has one inline chart"
    return base64.b64decode(images[0])


def _table(text: str) -> dict:
    """The page's breakdown table: label -> (ms per step, share in %)."""
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([\d.]+)</td><td>([\d.]+)%</td></tr>", text)
    return {label: (float(ms), float(share)) for label, ms, share in rows}


def _segments(fig) -> list:
    """The chart's stacked bar as drawn: (label, left, width) per segment, left to right."""
    (ax,) = fig.axes
    out = []
    for container in ax.containers:
        (bar,) = container.patches
        out.append((container.get_label(), round(bar.get_x(), 6), round(bar.get_width(), 6)))
    return out


def test_a_profiled_run_writes_its_summary_page_and_the_chart_of_its_numbers(profiled):
    import matplotlib.pyplot as plt
    from PIL import Image

    from trainer.callbacks.profile_page import CATEGORIES, chart_figure, chart_png

    m, out = profiled
    page = out / "profiler" / "summary.html"
    text = page.read_text()
    summary = json.loads((out / "profiler" / "summary.json").read_text())
    assert summary["steps"] >= 1 and summary["top_cpu"], summary  # real numbers from the trace
    assert sum(summary["breakdown_us"].values()) == pytest.approx(summary["step_time_us"], rel=1e-6)
    assert m["diagnosis"]["verdict"].split(":")[0] in text  # the doctor's verdict is on the page
    assert "http://" not in text and "https://" not in text  # no link to fetch anything from
    # the chart: the page inlines breakdown.png, and it is this run's breakdown drawn
    chart = (out / "profiler" / "breakdown.png").read_bytes()
    assert _embedded_png(text) == chart and Image.open(io.BytesIO(chart)).size[0] > 300
    assert chart == chart_png(summary)
    fig = chart_figure(summary)
    segments = _segments(fig)
    plt.close(fig)
    parts = {label: summary["breakdown_us"][key] for key, label in CATEGORIES}
    shares = {label: us / summary["step_time_us"] * 100 for label, us in parts.items() if us > 0}
    assert [label.rsplit(" ", 1)[0] for label, _, _ in segments] == list(shares)
    assert [w for _, _, w in segments] == pytest.approx(list(shares.values()), abs=1e-4)
    assert segments[-1][1] + segments[-1][2] == pytest.approx(100.0)
    # the table: every category, with its share of this run's steps
    table = _table(text)
    assert list(table) == [label for _, label in CATEGORIES]
    for (key, label), (_, share) in zip(CATEGORIES, table.values()):
        assert share == pytest.approx(summary["breakdown_us"][key] / summary["step_time_us"] * 100, abs=0.051), label


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run installs it)")
def test_the_profile_summary_page_renders_offline_in_a_real_browser(profiled, tmp_path):
    from PIL import Image

    _, out = profiled
    page = out / "profiler" / "summary.html"
    width, height = Image.open(out / "profiler" / "breakdown.png").size
    shot = tmp_path / "summary.png"
    requested, drawn = _render(page, shot, "[...document.images].map(i => [i.naturalWidth, i.naturalHeight])")
    assert requested == []  # the page asked the network for nothing
    assert drawn == [[width, height]], "the browser decoded the inline chart at its size"
    assert _not_blank(shot) > 50, "the screenshot is blank"
    # and the harness does see a page that reaches out: the check above can fail
    leaky = tmp_path / "leaky.html"
    leaky.write_text('<html><body><h1>x</h1><img src="http://example.invalid/chart.png"></body></html>')
    assert _render(leaky, tmp_path / "leaky.png")[0] == ["http://example.invalid/chart.png"]


def test_the_profiled_steps_hold_no_validation(train):
    """The profiler's steps end at each batch's end: the step after an epoch's last batch also held the
    validation and the epoch's end, and the page counted their seconds as a training step's. The
    window moves to steps clear of them (5 batches an epoch: steps 6-8, not 3-5)."""
    import json
    from types import SimpleNamespace

    from trainer.callbacks.profiler import clear_of_validation

    schedule = SimpleNamespace(skip_first=1, wait=1, warmup=1, active=3, repeat=1)
    assert clear_of_validation(schedule, 5) == 4 and clear_of_validation(schedule, 16) == 1
    assert clear_of_validation(schedule, 3) == 1  # no room between two validations: as given
    _, out = train("profile=true", "data.num_samples=40", "data.batch_size=8", "trainer.max_epochs=2")
    summary = json.loads((out / "profiler" / "summary.json").read_text())
    (trace,) = (out / "profiler").glob("*.pt.trace.json")
    steps = sorted(set(re.findall(r'"ProfilerStep#(\d+)"', trace.read_text())), key=int)
    # step 5 ends with the first epoch's validation and its end: the recorded steps come after it
    assert summary["steps"] == 3 and steps == ["6", "7", "8"], (summary["steps"], steps)


def test_the_breakdown_partition_counts_each_instant_once_by_priority():
    """Kernel time wins over the CPU time it overlaps; what nothing covers is "other"."""
    from trainer.callbacks.profile_page import partition

    steps = [(0.0, 100.0), (100.0, 200.0)]
    classes = {
        "kernel": [(10.0, 50.0), (150.0, 160.0)],
        "cpu": [(0.0, 60.0), (120.0, 170.0), (190.0, 250.0)],  # overlaps kernels; runs past the last step
        "data": [(60.0, 80.0)],
    }
    parts = partition(steps, classes)
    assert parts["kernel"] == 50.0 and parts["data"] == 20.0
    assert parts["cpu"] == (10 + 10) + (50 - 10) + 10  # 0-10, 50-60, 120-170 minus the kernel, 190-200
    assert parts["other"] == 200.0 - 50 - 20 - 70
    assert sum(parts.values()) == 200.0


def test_the_breakdown_chart_and_table_show_the_planted_intervals(tmp_path):
    """Four planted 50 ms steps: kernels 50 ms, data loading 20 ms, CPU 70 ms (what kernels do not cover),
    nothing 60 ms. The chart's segments (as drawn: left edge and width, in CATEGORIES order, empty
    ones left out), its legend, the page's table and the inlined PNG all show those numbers."""
    import matplotlib.pyplot as plt

    from trainer.callbacks.profile_page import CATEGORIES, CHART, chart_figure, partition, save, write_page

    ms = 1000.0  # the profiler's unit is the microsecond
    steps = [(0.0, 50 * ms), (50 * ms, 100 * ms), (100 * ms, 150 * ms), (150 * ms, 200 * ms)]
    classes = {
        "kernel": [(10 * ms, 50 * ms), (150 * ms, 160 * ms)],
        "cpu": [(0.0, 60 * ms), (120 * ms, 170 * ms), (190 * ms, 250 * ms)],
        "data": [(60 * ms, 80 * ms)],
    }
    summary = {"device": "cpu", "steps": 4, "step_time_us": 200 * ms, "breakdown_us": partition(steps, classes)}
    fig = chart_figure(summary)
    assert _segments(fig) == [
        ("GPU kernels 25%", 0.0, 25.0),
        ("data loading 10%", 25.0, 10.0),
        ("CPU-side execution 35%", 35.0, 35.0),
        ("other 30%", 70.0, 30.0),
    ]
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [label for label, _, _ in _segments(fig)]
    assert "4 steps, 50.0 ms per step (cpu)" in fig.axes[0].get_title()
    plt.close(fig)

    save(summary, str(tmp_path))
    text = Path(write_page(str(tmp_path), "input pipeline: more loader workers", "planted")).read_text()
    planted = {"kernel": (12.5, 25.0), "data": (5.0, 10.0), "cpu": (17.5, 35.0), "other": (15.0, 30.0)}  # ms/step, %
    assert _table(text) == {label: planted.get(key, (0.0, 0.0)) for key, label in CATEGORIES}
    assert _embedded_png(text) == (tmp_path / CHART).read_bytes()
    assert "4 profiled steps on cpu,\n50.00 ms per step" in text and "input pipeline: more loader workers" in text
