"""One real-browser test: JupyterLab on loopback, headless Chromium (Debian's) driven by Playwright.

The browser opens a notebook, runs every cell, and the test asserts what the rendered widget shows:
the card in monospace, the share link (and that its copy button puts it on the clipboard), and, for a
result traced without a plan, that the plan button names the host and, once clicked, shows the
card. Screenshots go to the test's tmp dir and are copied to ``tests/artifacts/``.

Needs ``jupyterlab`` and ``playwright`` (PyPI) and ``/usr/bin/chromium`` (Debian's ``chromium``
package; Playwright's own browser download is not used). Skipped, saying which, when one is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM = os.environ.get("NEURARCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
START_TIMEOUT_S = 90
RUN_TIMEOUT_MS = 180_000

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install jupyterlab)")
pytest.importorskip("ipywidgets")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} not found (apt-get install -y chromium)", allow_module_level=True)

CELLS = [
    "%load_ext neurarch_trace\n"
    "import torch\n"
    "from torch import nn\n"
    "model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))",
    "%neurarch model --input 1,3,32,32 --name BrowserNet --plan --share",
    "r = %neurarch model --input 1,3,32,32 --name ButtonNet --no-save\nr",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def lab(tmp_path: Path, plan_server: str) -> Iterator[dict]:
    """A JupyterLab server on a free loopback port, with a token, serving a fresh notebook."""
    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(src) for src in CELLS],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
    )
    nbformat.write(nb, root / "widget.ipynb")
    settings = tmp_path / "settings"
    for plugin, values in {
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }.items():
        folder = settings / plugin.split("/")[0] / plugin.split("/")[1]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{plugin.split('/')[2]}.jupyterlab-settings").write_text(json.dumps(values))
    port = _free_port()
    token = "neurarch-test-token"
    env = dict(os.environ)
    env.update({
        "NEURARCH_API": str(plan_server),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
    })
    env.pop("NEURARCH_API_KEY", None)
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("JupyterLab did not start: " + (tmp_path / "lab.log").read_text()[-2000:])
            time.sleep(0.25)
        yield {"base": base, "token": token, "root": root, "log": tmp_path / "lab.log", "api": str(plan_server)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _save(shot: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)


def test_widget_in_jupyterlab(lab: dict, tmp_path: Path) -> None:
    base, token = lab["base"], lab["token"]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 1600})
            context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
            page = context.new_page()
            page.goto(f"{base}/lab/tree/widget.ipynb?token={token}")
            # The notebook is open and its kernel is ready.
            page.wait_for_function(
                "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
                " return !!k && k.status === 'idle'; }",
                timeout=RUN_TIMEOUT_MS,
            )
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

            # --plan --share: the card in monospace and the share link.
            card = page.locator("pre.neurarch-card", has_text="BrowserNet")
            card.wait_for(timeout=RUN_TIMEOUT_MS)
            text = card.inner_text()
            assert "| Runs" in text and "| Blockers" in text and text.startswith("+---")
            font = card.evaluate("el => getComputedStyle(el).fontFamily")
            assert "mono" in font.lower() or "consol" in font.lower() or "menlo" in font.lower(), font
            widget = page.locator(".neurarch-widget", has=card)
            link = widget.locator("a.neurarch-share-link")
            href = link.get_attribute("href")
            assert href and href.startswith(lab["api"] + "/p/"), href
            assert link.inner_text() == href
            assert widget.locator(".neurarch-warnings").is_visible()
            shot = tmp_path / "notebook-widget.png"
            widget.screenshot(path=str(shot))
            _save(shot)

            # The copy button puts the link on the clipboard.
            widget.locator("button.neurarch-copy").click()
            page.wait_for_function("() => [...document.querySelectorAll('button.neurarch-copy')].some(b => b.textContent === 'Copied')", timeout=10_000)
            assert page.evaluate("() => navigator.clipboard.readText()") == href

            # Without a plan: the summary, the layer table and a button naming the host; a click plans.
            host = lab["api"].split("://", 1)[1]
            button = page.locator("button.neurarch-plan-button", has_text="Get the plan")
            button.wait_for(timeout=RUN_TIMEOUT_MS)
            label = button.inner_text()
            assert host in label and "no weights" in label, label
            unplanned = page.locator(".neurarch-widget", has=button)
            assert "ButtonNet" in unplanned.locator(".neurarch-name").inner_text()
            table = unplanned.locator("table.neurarch-layers")
            assert not table.is_visible()  # collapsed until its title is clicked
            unplanned.get_by_text("Layers (4)").click()
            table.wait_for(state="visible", timeout=10_000)
            assert "conv2d" in table.inner_text() and "8x30x30" in table.inner_text()
            shot1 = tmp_path / "notebook-widget-no-plan.png"
            unplanned.screenshot(path=str(shot1))
            _save(shot1)
            button.click()
            planned = page.locator("pre.neurarch-card", has_text="ButtonNet")
            planned.wait_for(timeout=60_000)
            assert "| Runs" in planned.inner_text()
            shot2 = tmp_path / "notebook-widget-button.png"
            page.locator(".neurarch-widget", has=planned).screenshot(path=str(shot2))
            _save(shot2)
            page.screenshot(path=str(tmp_path / "notebook-page.png"))
            _save(tmp_path / "notebook-page.png")
        finally:
            browser.close()
