"""Every notebook in a real JupyterLab (headless Chromium), on the bundled samples and on
captures unlike them — a training run without NVTX ranges of its own, a generation without
NVTX, a multi-rank run (one report per rank), a capture that holds GPU metrics but almost no
kernels (the committed ``sample_traces/run_structure`` exports, unpacked by the test into a
temporary folder).

Each notebook is run top to bottom with its parameters pointed at the capture, its main
widgets are clicked (the explorer's tabs and window buttons, the drill-down's and capture
form's controls), and the page is checked: no error or stderr output, no browser console error,
a bounded page height, every chart drawn with marks (data, or the one-line message of a view
whose data the trace lacks) and of a finite size. Screenshots and a JSON record per run are kept
in ``tests/artifacts/notebooks/`` (git-ignored).

``TRACEKIT_BROWSER_CASES`` (comma-separated case names) runs a subset; ``TRACEKIT_BROWSER_EXTRA``
(``name=path.sqlite,…``) adds captures of your own (the generation notebooks only).
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

RUN_STRUCTURE = ROOT / "sample_traces" / "run_structure"
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
#: Console messages of JupyterLab itself that say nothing about the notebooks (offline machine).
BENIGN = ("Failed to load resource", "net::ERR_", "favicon", "[Violation]", "Could not find a kernel")
#: A page taller than this has a runaway output (an infinitely wide or tall chart).
MAX_PAGE_PX = 60_000
#: No single chart is larger than this on either side.
MAX_CHART_PX = 6_000

#: The captures (``sample_traces/run_structure/<folder>``) and what each stands for.
CAPTURES = {
    "training": ("train_ddp_2gpu", "DDP training, no NVTX ranges of its own, no GPU metrics"),
    "generation": ("hf_generate_calls", "HF generate() three times, no NVTX, no NCCL, no GPU metrics"),
    "multirank": ("train_fsdp2_2gpu", "FSDP2 training, one report per rank"),
    "metrics_only": ("serve_child_nofollow", "a server's parent process: GPU metrics, no kernels"),
}


def _unpack(folder: str, target: Path) -> list[Path]:
    out = []
    for packed in sorted((RUN_STRUCTURE / folder).glob("*.sqlite.xz")):
        dst = target / folder / packed.name.removesuffix(".xz")
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            with lzma.open(packed) as src, open(dst, "wb") as f:
                shutil.copyfileobj(src, f)
        out.append(dst)
    return out


def _params(case: str, files: list[Path]) -> dict[str, dict[str, Any]]:
    """Each notebook's parameters for ``case`` (the bundled defaults: empty)."""
    if case == "bundled":
        return {name: {} for name in NOTEBOOKS}
    trace = str(files[0])
    ranks = str(files[0].parent) if len(files) > 1 else ""
    other = str(files[1]) if len(files) > 1 else "../sample_traces/llm_decode_1gpu/llm_decode_1gpu.sqlite"
    return {
        "01_capture.ipynb": {"MODE": "nsys", "PRESET": "llm-serving"},  # no nsys here: the form says so
        "02_overview.ipynb": {"TRACE": trace},
        "03_kernel_drilldown.ipynb": {"TRACE": trace},
        "04_multi_gpu_nccl.ipynb": {"TRACE": trace, "PER_RANK": ranks},
        "05_compare.ipynb": {"TRACE_A": other, "TRACE_B": trace},
        "06_paper_figures.ipynb": {"TRACE": trace},
        "07_diagnose.ipynb": {"TRACE": trace},
        "08_memory.ipynb": {"TRACE": trace},
        "09_export_perfetto.ipynb": {"TRACE": trace, "PER_RANK": ranks},
    }


def _with_params(src: Path, dst: Path, params: dict[str, Any]) -> None:
    """A copy of notebook ``src`` whose parameters cell assigns ``params``."""
    nb = json.loads(src.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    text = "".join(cell["source"])
    for key, value in params.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value!r}", text, flags=re.M)
        assert n == 1, f"{src.name} has no parameter {key}"
    cell["source"] = text
    dst.write_text(json.dumps(nb, indent=1))


def _cases() -> list[str]:
    names = ["bundled", *CAPTURES]
    chosen = [c for c in os.environ.get("TRACEKIT_BROWSER_CASES", "").split(",") if c]
    return [c for c in names if not chosen or c in chosen]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One JupyterLab (loopback only) and one headless Chromium for every case."""
    pytest.importorskip("jupyterlab", reason="needs the notebook extra: pip install 'tracekit[notebook]'")
    pytest.importorskip("anywidget", reason="the charts are anywidget JupyterCharts: pip install anywidget")
    executable = chromium_path()
    sync = sync_playwright()
    root = tmp_path_factory.mktemp("lab")
    (root / "sample_traces").symlink_to(ROOT / "sample_traces", target_is_directory=True)
    # every cell stays in the DOM (no windowing), so every chart can be checked
    settings = root / ".settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    news = root / ".settings" / "@jupyterlab" / "apputils-extension"  # no "Jupyter news?" pop-up
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with jupyterlab(root, ARTIFACTS / "jupyterlab_notebooks.log") as base, sync() as p:
        url, token = base.split("|")
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield {"root": root, "url": url, "token": token, "browser": browser}
        finally:
            browser.close()


STATE_JS = """
() => {
  const outputs = [...document.querySelectorAll('.jp-OutputArea-output')];
  const errors = outputs.filter(o => o.getAttribute('data-mime-type') === 'application/vnd.jupyter.stderr'
      || o.querySelector('.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'))
    .map(o => o.innerText.slice(0, 600));
  const widgetErrors = [...document.querySelectorAll('.jp-OutputArea')].map(e => e.innerText)
    .filter(t => /Error displaying widget|model not found|Traceback \\(most recent call last\\)/.test(t))
    .map(t => t.slice(0, 600));
  const charts = [...document.querySelectorAll('.jp-OutputArea .vega-embed')].map(e => {
    const svg = e.querySelector('svg');
    const box = e.getBoundingClientRect();
    let marks = 0, message = null;
    if (svg) {
      for (const g of svg.querySelectorAll('g.role-mark')) {
        let p = g.parentElement, guide = false;
        while (p && p !== svg) {
          if (/role-(axis|legend|title)/.test(p.getAttribute('class') || '')) { guide = true; break; }
          p = p.parentElement;
        }
        if (!guide) marks += g.querySelectorAll('path, text, line, rect, circle').length;
      }
      const texts = [...svg.querySelectorAll('g.mark-text text')].map(t => t.textContent);
      message = texts.find(t => /\\(capture with|no .* in the|nsys profile|ncu --/.test(t)) || null;
    }
    return {drawn: !!(svg || e.querySelector('canvas')), marks, message, visible: e.getClientRects().length > 0,
            width: svg ? svg.getBoundingClientRect().width : box.width,
            height: svg ? svg.getBoundingClientRect().height : box.height};
  });
  const panel = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer')
    || document.querySelector('.jp-NotebookPanel .jp-Notebook');
  const counts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(c => c.textContent.trim());
  return {errors, widgetErrors, charts, pageHeight: panel ? panel.scrollHeight : 0, counts,
          tabs: document.querySelectorAll('.jp-OutputArea .lm-TabBar-tab').length,
          text: (document.querySelector('.jp-Notebook') || document.body).innerText.slice(0, 3000)};
}
"""


def _run_notebook(lab: dict[str, Any], case: str, name: str, out: Path) -> dict[str, Any]:
    page = lab["browser"].new_page(viewport={"width": 1400, "height": 1000})
    console: list[str] = []
    page_errors: list[str] = []
    outside: list[str] = []

    def route(r: Any) -> None:
        if r.request.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: page_errors.append(str(e)[:800]))
    page.on("console", lambda m: console.append(m.text[:800]) if m.type == "error" else None)
    started = time.monotonic()
    try:
        rel = f"work/{case}/notebooks/{name}"
        page.goto(f"{lab['url']}/lab/tree/{rel}?reset&token={lab['token']}", wait_until="domcontentloaded")
        page.wait_for_function(
            "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
            " && w.sessionContext.session.kernel.status === 'idle'; }",
            timeout=120_000,
        )
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(
            "() => { const w = window.jupyterapp.shell.currentWidget;"
            " const cells = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];"
            " return cells.length > 0 && cells.every(c => /\\[\\d+\\]/.test(c.textContent))"
            " && w.sessionContext.session.kernel.status === 'idle'; }",
            timeout=600_000,
        )
        page.wait_for_timeout(2500)  # widgets and charts draw after the kernel replies
        _click_widgets(page, name)
        page.wait_for_timeout(1500)
        state = page.evaluate(STATE_JS)
        # the notebook scrolls inside the page: a viewport as tall as it, for one whole picture
        tall = min(max(int(state["pageHeight"]) + 250, 1000), 20_000)
        page.set_viewport_size({"width": 1400, "height": tall})
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / f"{name.removesuffix('.ipynb')}.png"), full_page=True)
        # leave the kernel: the next notebook gets its own
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        page.wait_for_timeout(500)
    finally:
        page.close()
    state.update(console=[m for m in console if not any(b in m for b in BENIGN)], page_errors=page_errors,
                 outside=outside, seconds=round(time.monotonic() - started, 1))
    (out / f"{name.removesuffix('.ipynb')}.json").write_text(json.dumps(state, indent=1))
    return state


def _click(page: Any, selector: str, text: str | None = None) -> int:
    """Click every visible match (scrolled into view); how many were clicked."""
    loc = page.locator(selector, has_text=text) if text else page.locator(selector)
    clicked = 0
    for i in range(loc.count()):
        item = loc.nth(i)
        try:
            item.scroll_into_view_if_needed(timeout=5000)
            if item.is_visible() and item.is_enabled():
                item.click(timeout=5000)
                clicked += 1
                page.wait_for_timeout(400)
        except Exception:  # a control that went away while the view redrew
            continue
    return clicked


def _click_widgets(page: Any, name: str) -> None:
    """The main controls of each notebook's widgets, as a user would click them."""
    tabs = page.locator(".jp-OutputArea .lm-TabBar-tab")
    for i in range(tabs.count()):  # the explorer's and the compare widget's tabs
        try:
            tabs.nth(i).scroll_into_view_if_needed(timeout=5000)
            tabs.nth(i).click(timeout=5000)
            page.wait_for_timeout(900)
        except Exception:
            continue
    for label in ("whole trace", "steady window"):
        _click(page, ".jp-OutputArea button.jupyter-button", label)
    if name.startswith("01_"):
        _click(page, ".jp-OutputArea .p-Accordion-child, .jp-OutputArea .jupyter-widget-Collapse-header")
    if name.startswith("03_"):  # the drill-down's kernel picker: the second kernel
        pick = page.locator(".jp-OutputArea select").first
        if pick.count():
            options = pick.locator("option")
            if options.count() > 1:
                pick.select_option(index=1)
    page.wait_for_timeout(1500)


@pytest.mark.parametrize("case", _cases())
def test_every_notebook_in_jupyterlab(lab: dict[str, Any], case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """All nine notebooks on one capture: no error, no console error, bounded height, every
    chart drawn with marks (a chart in a tab not shown last keeps the marks it drew) and,
    where visible, of a finite size; the missing data said in words."""
    files: list[Path] = []
    if case != "bundled":
        files = _unpack(CAPTURES[case][0], tmp_path_factory.mktemp("captures"))
    work = lab["root"] / "work" / case / "notebooks"
    work.mkdir(parents=True)
    (work.parent / "sample_traces").symlink_to(ROOT / "sample_traces", target_is_directory=True)
    out = ARTIFACTS / "notebooks" / case
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    failures: list[str] = []
    for name, params in _params(case, files).items():
        _with_params(ROOT / "notebooks" / name, work / name, params)
        state = _run_notebook(lab, case, name, out)
        where = f"{case}/{name}"
        if state["errors"] or state["widgetErrors"]:
            failures.append(f"{where}: error output {state['errors'] + state['widgetErrors']}")
        if state["page_errors"] or state["console"]:
            failures.append(f"{where}: browser errors {state['page_errors'] + state['console']}")
        if state["pageHeight"] > MAX_PAGE_PX:
            failures.append(f"{where}: page {state['pageHeight']} px tall")
        for i, c in enumerate(state["charts"]):
            if not c["drawn"] or c["marks"] == 0:
                failures.append(f"{where}: chart {i} drawn without marks ({c})")
            if c["visible"] and not (0 < c["width"] < MAX_CHART_PX and 0 < c["height"] < MAX_CHART_PX):
                failures.append(f"{where}: chart {i} is {c['width']:.0f} × {c['height']:.0f} px")
        if any(u for u in state["outside"] if "cdn" in u or "jsdelivr" in u or "esm.sh" in u):
            failures.append(f"{where}: requests off the machine {state['outside']}")
        if name.startswith(("02_", "03_", "04_", "08_")) and not state["charts"]:
            failures.append(f"{where}: no chart at all")
        if name.startswith("02_") and state["tabs"] < 8:
            failures.append(f"{where}: the explorer's tabs are missing ({state['tabs']})")
    (out / "summary.txt").write_text("\n".join(failures) or "ok")
    assert not failures, "\n".join(failures)
