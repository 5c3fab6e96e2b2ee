"""Helpers of the browser tests (no tests here): find Chromium and Playwright, start JupyterLab on loopback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


def chromium_path() -> str:
    """Debian's chromium (or ``$CHROMIUM``); skips the test with the install line when absent."""
    for candidate in (
        os.environ.get("CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("chromium not found: apt-get install -y chromium (or set CHROMIUM=/path/to/chrome)")
    raise AssertionError  # unreachable


def sync_playwright():  # type: ignore[no-untyped-def]
    try:
        from playwright.sync_api import sync_playwright as sp
    except ImportError:
        pytest.skip("playwright not installed: pip install playwright (no browser download needed)")
    return sp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def jupyterlab(root: Path, log: Path) -> Iterator[str]:
    """Run ``jupyter lab`` on 127.0.0.1 serving ``root``; yields its base URL with the token."""
    port, token = free_port(), "tracekit-test"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(root / ".runtime"), "JUPYTER_CONFIG_DIR": str(root / ".config"),
           "JUPYTERLAB_SETTINGS_DIR": str(root / ".settings"), "JUPYTERLAB_WORKSPACES_DIR": str(root / ".workspaces")}  # fmt: skip
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--ServerApp.disable_check_xsrf=True", "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly", "--ServerApp.terminals_enabled=False",
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"jupyter lab exited with {proc.returncode}: {log.read_text()[-2000:]}"
                    )
                try:
                    with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"jupyter lab did not start: {log.read_text()[-2000:]}"
                        ) from None
                    time.sleep(0.5)
            yield f"{url}|{token}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
