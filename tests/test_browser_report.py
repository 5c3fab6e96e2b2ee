"""The HTML report in headless Chromium: every chart draws, no JS errors, no network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from tests.test_browser_helpers import ARTIFACTS, CHROMIUM_FLAGS, chromium_path, sync_playwright

pytest.importorskip("altair", reason="needs the notebook extra")

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

TP2 = SAMPLES / "llm_tp2_nccl" / "llm_tp2_nccl.sqlite"


def test_report_opens_offline_without_errors(tmp_path: Path) -> None:
    if not TP2.exists():
        pytest.skip(f"sample missing: {TP2}")
    executable = chromium_path()
    sync = sync_playwright()
    from tracekit.report import write_report

    report = write_report(TP2, tmp_path / "report.html")
    errors: list[str] = []
    requests: list[str] = []
    with sync() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})

            def route(r):  # type: ignore[no-untyped-def]
                if r.request.url.startswith(("file://", "data:", "blob:")):
                    r.continue_()
                else:
                    requests.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(report.as_uri())
            expected = page.locator("div.chart").count()
            page.wait_for_function(
                f"() => document.querySelectorAll('div.chart svg.marks').length >= {expected}",
                timeout=60_000,
            )
            state = page.evaluate(
                "() => ({charts: document.querySelectorAll('div.chart').length,"
                " drawn: document.querySelectorAll('div.chart svg.marks').length,"
                " failures: window.__tracekit_errors || [],"
                " sections: [...document.querySelectorAll('section h2')].map(h => h.textContent)})"
            )
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()
    (ARTIFACTS / "report.json").write_text(
        json.dumps({"state": state, "errors": errors, "requests": requests}, indent=2)
    )
    assert not errors and not state["failures"], errors + state["failures"]
    assert not requests, requests
    assert state["charts"] >= 8 and state["drawn"] >= state["charts"]
    assert state["sections"][:5] == ["Findings", "Run", "Overview", "Top kernels", "NVTX breakdown"]
