"""02_overview in a real JupyterLab, in headless Chromium: widgets and charts render, no JS errors.

JupyterLab runs on 127.0.0.1 over a copy of the notebook (so that the repository's notebook
keeps no outputs); every request that leaves the loopback is blocked and recorded, which also
proves the charts load no JavaScript from a CDN. The screenshot is kept in tests/artifacts/.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.test_browser_helpers import (
    ARTIFACTS,
    CHROMIUM_FLAGS,
    ROOT,
    chromium_path,
    jupyterlab,
    sync_playwright,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.notebook,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

NOTEBOOK = "02_overview.ipynb"
#: Console messages of JupyterLab itself that say nothing about our output (offline machine).
BENIGN = (
    "Failed to load resource",
    "net::ERR_",
    "favicon",
    "[Violation]",
    "Could not find a kernel",
)


def _prepare(tmp: Path) -> Path:
    (tmp / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, tmp / "notebooks" / NOTEBOOK)
    (tmp / "sample_traces").symlink_to(ROOT / "sample_traces", target_is_directory=True)
    return tmp


def test_overview_notebook_renders_in_jupyterlab(tmp_path: Path) -> None:
    pytest.importorskip("jupyterlab", reason="needs the notebook extra: pip install 'tracekit[notebook]'")
    pytest.importorskip("anywidget", reason="the notebook's charts are anywidget JupyterCharts: pip install anywidget")
    executable = chromium_path()
    sync = sync_playwright()
    root = _prepare(tmp_path)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with jupyterlab(root, ARTIFACTS / "jupyterlab.log") as base:
        url, token = base.split("|")
        page_errors: list[str] = []
        console_errors: list[str] = []
        outside: list[str] = []
        with sync() as p:
            browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})

                def route(r):  # type: ignore[no-untyped-def]
                    if r.request.url.startswith(
                        ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")
                    ):
                        r.continue_()
                    else:
                        outside.append(r.request.url)
                        r.abort()

                page.route("**/*", route)
                page.on("pageerror", lambda e: page_errors.append(f"{e}\n{e.stack}"[:1500]))
                page.on(
                    "console",
                    lambda m: console_errors.append(m.text) if m.type == "error" else None,
                )
                page.goto(
                    f"{url}/lab/tree/notebooks/{NOTEBOOK}?token={token}",
                    wait_until="domcontentloaded",
                )
                page.wait_for_function(
                    "() => window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')",
                    timeout=90_000,
                )
                # wait for the kernel, then run everything
                page.wait_for_function(
                    "() => { const w = window.jupyterapp.shell.currentWidget;"
                    " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
                    " && w.sessionContext.session.kernel.status === 'idle'; }",
                    timeout=90_000,
                )
                page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
                started = time.monotonic()
                page.wait_for_function(
                    "() => { const cells = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];"
                    " return cells.length > 0 && cells.every(c => /\\[\\d+\\]/.test(c.textContent)); }",
                    timeout=180_000,
                )
                # widgets and vega charts draw asynchronously after the kernel replies
                page.wait_for_function(
                    "() => document.querySelectorAll('.jp-OutputArea .lm-TabBar, .jp-OutputArea .widget-tab').length > 0"
                    " && document.querySelectorAll('.jp-OutputArea .vega-embed svg, .jp-OutputArea .vega-embed canvas').length >= 3",
                    timeout=60_000,
                )
                page.wait_for_timeout(2000)
                run_s = time.monotonic() - started
                # a hidden tab creates its chart when shown: click "Timeline" and see it drawn
                before = page.evaluate(
                    "() => document.querySelectorAll('.jp-OutputArea .vega-embed svg').length"
                )
                tab = page.locator(".jp-OutputArea .lm-TabBar-tab", has_text="Timeline").first
                tab.scroll_into_view_if_needed()
                tab.click()
                page.wait_for_function(
                    f"() => document.querySelectorAll('.jp-OutputArea .vega-embed svg').length > {before}",
                    timeout=60_000,
                )
                page.wait_for_timeout(1500)
                page.screenshot(path=str(ARTIFACTS / "02_overview_jupyterlab.png"), full_page=True)
                state = page.evaluate(
                    "() => ({"
                    " charts: document.querySelectorAll('.jp-OutputArea .vega-embed').length,"
                    " drawn: document.querySelectorAll('.jp-OutputArea .vega-embed svg, .jp-OutputArea .vega-embed canvas').length,"
                    " tabs: document.querySelectorAll('.jp-OutputArea .lm-TabBar-tab').length,"
                    " widgetErrors: [...document.querySelectorAll('.jp-OutputArea')].map(e => e.innerText)"
                    "   .filter(t => /Error displaying widget|model not found|Traceback/.test(t)).length,"
                    " errorOutputs: document.querySelectorAll('.jp-OutputArea-output[data-mime-type=\"application/vnd.jupyter.stderr\"]').length,"
                    " text: document.querySelector('.jp-Notebook').innerText.slice(0, 2000) })"
                )
                # closing the page aborts widget models still loading; those errors are ours
                seen_errors = list(page_errors)
            finally:
                browser.close()
    page_errors = seen_errors
    relevant = [m for m in console_errors if not any(b in m for b in BENIGN)]
    (ARTIFACTS / "02_overview_jupyterlab.json").write_text(
        json.dumps(
            {
                "state": state,
                "page_errors": page_errors,
                "console_errors": console_errors,
                "outside_requests": outside,
                "run_s": run_s,
            },
            indent=2,
        )  # fmt: skip
    )
    assert not page_errors, page_errors
    assert not relevant, relevant
    assert state["widgetErrors"] == 0, state["text"]
    assert state["tabs"] >= 7, state  # the explorer's seven tabs
    assert state["drawn"] >= 3, state
    assert not [u for u in outside if "esm.sh" in u or "cdn" in u or "jsdelivr" in u], outside


def test_diagnose_notebook_shows_finding_cards(tmp_path: Path) -> None:
    """Issue 27 §6: notebook 07 in JupyterLab shows `tracekit.diagnose(trace)` as cards — one
    per finding, with severity, time at stake, the whole title, advice and the next commands —
    not as `Diagnosis('x.sqlite', 2 findings, window=nvtx)` or a cut-off frame. The screenshot
    is kept as tests/artifacts/07_diagnose_jupyterlab.png."""
    pytest.importorskip("jupyterlab", reason="needs the notebook extra: pip install 'tracekit[notebook]'")
    executable = chromium_path()
    sync = sync_playwright()
    root = tmp_path
    (root / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "07_diagnose.ipynb", root / "notebooks" / "07_diagnose.ipynb")
    (root / "sample_traces").symlink_to(ROOT / "sample_traces", target_is_directory=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    import tracekit

    expected = tracekit.diagnose(ROOT / "sample_traces" / "planted" / "planted_host_bound" / "planted_host_bound.sqlite")
    with jupyterlab(root, ARTIFACTS / "jupyterlab_07.log") as base:
        url, token = base.split("|")
        page_errors: list[str] = []
        with sync() as p:
            browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1300, "height": 1000})
                page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(
                    ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")) else r.abort())
                page.on("pageerror", lambda e: page_errors.append(str(e)[:500]))
                page.goto(f"{url}/lab/tree/notebooks/07_diagnose.ipynb?token={token}", wait_until="domcontentloaded")
                page.wait_for_function(
                    "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                    " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
                    " && w.sessionContext.session.kernel.status === 'idle'; }",
                    timeout=120_000,
                )
                page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
                page.wait_for_function("() => document.querySelectorAll('.jp-OutputArea .tk-finding').length > 0",
                                       timeout=180_000)
                page.wait_for_timeout(1500)
                first = page.locator(".jp-OutputArea .tk-diagnosis").first
                first.scroll_into_view_if_needed()
                first.screenshot(path=str(ARTIFACTS / "07_diagnose_jupyterlab.png"))
                state = page.evaluate(
                    "() => { const d = document.querySelector('.jp-OutputArea .tk-diagnosis');"
                    " return { cards: [...d.querySelectorAll('.tk-finding')].map(c => c.dataset.category),"
                    " text: d.innerText, details: d.querySelectorAll('details').length,"
                    " reprs: [...document.querySelectorAll('.jp-OutputArea')].filter(e => /Diagnosis\\(/.test(e.innerText)).length }; }"
                )
            finally:
                browser.close()
    assert not page_errors, page_errors
    assert state["cards"] == [f.category for f in expected.items]
    assert state["reprs"] == 0  # the plain repr is not what the user sees
    top = expected.items[0]
    assert top.title in state["text"] and "What to try:" in state["text"] and top.next[0] in state["text"]
    assert state["details"] == sum(1 for f in expected.items if f.evidence.height)
