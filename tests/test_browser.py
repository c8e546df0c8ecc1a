"""Real-browser tests: a Jupyter server on loopback (JupyterLab and Notebook 7), headless Chromium
(Debian's) driven by Playwright, a real kernel, and the plan service running in this process.

Each test opens a notebook, runs every cell and checks what the page shows:

* JupyterLab and Notebook 7: the widget's picture (one element per component once every block is
  open, residual and concatenation edges, hover facts, a pinned panel), the layer table, the card
  in monospace and the share link (its copy button puts it on the clipboard), and the plan button,
  which names the host and, once clicked, shows the card; no console errors;
* JupyterLab with the anywidget extension disabled (a front end that cannot run the widget): the
  outputs are the card, the link and the layer table, never an empty box.

Screenshots are copied to ``tests/artifacts/`` (ignored by git). Needs ``jupyterlab``, ``notebook``,
``anywidget`` and ``playwright`` (PyPI) and ``/usr/bin/chromium`` (Debian's ``chromium`` package;
Playwright's own browser download is not used); skipped, saying which, when one is missing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("NEURARCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
START_TIMEOUT_S = 90
RUN_TIMEOUT_MS = 240_000

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install jupyterlab)")
pytest.importorskip("notebook", reason="notebook 7 is not installed (pip install notebook)")
pytest.importorskip("anywidget")
pytest.importorskip("uvicorn")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} not found (apt-get install -y chromium)", allow_module_level=True)

MODEL = '''
class BrowserNet(nn.Module):
    """A stem, a residual block, a concatenation and a head: every kind of edge the picture draws."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.side = nn.Conv2d(8, 4, 1)
        self.head = nn.Linear(12 * 16 * 16, 10)

    def forward(self, x):
        x = self.stem(x)
        y = self.block(x) + x
        z = torch.cat([y, self.side(y)], 1)
        return self.head(z.flatten(1))
'''

CELLS = [
    "%load_ext neurarch_trace\nimport torch\nfrom torch import nn\n" + MODEL + "\nmodel = BrowserNet()",
    "%neurarch model --input 1,3,16,16 --name SharedNet --plan --share --no-save",
    "r = %neurarch model --input 1,3,16,16 --name ButtonNet --no-save\nr",
]

# Errors the pages log without any widget: Notebook 7.6's keyboard-shortcut settings plugin throws
# "Cannot read properties of undefined (reading 'schema')" from notebook_core.js when cells run
# (reproduced with a notebook of plain `1+1` cells), and a fresh server answers some lookups 404.
_NOISE = ("reading 'schema')", "Failed to load resource: the server responded with a status of 404")


def _real_errors(errors: list[str]) -> list[str]:
    return [e for e in errors if not any(n in e for n in _NOISE)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _component_ids() -> list[str]:
    """The components of BrowserNet's graph, traced here: what the picture must draw."""
    import torch
    from torch import nn

    from neurarch_trace.tracer import trace_model

    scope: dict[str, Any] = {"torch": torch, "nn": nn}
    exec(MODEL, scope)  # noqa: S102 - the test's own model source
    graph = trace_model(scope["BrowserNet"](), (torch.randn(1, 3, 16, 16),), name="BrowserNet")
    return [c["id"] for c in graph["components"]]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from neurarch_trace.notebook.service import start_plan_service

    running = start_plan_service(set_env=False, db_path=tmp_path_factory.mktemp("service") / "shares.sqlite3")
    yield running
    running.stop()


def _start_server(tmp: Path, api: str, *, disabled: tuple[str, ...] = (), cells: list[str] = CELLS) -> dict:
    """A Jupyter server (JupyterLab and Notebook 7) on a free loopback port, with a token, serving
    a fresh copy of the test notebook (``cells``); ``disabled`` names lab extensions turned off."""
    root = tmp / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(src) for src in cells],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
    )
    for name in ("lab.ipynb", "classic.ipynb", "fallback.ipynb"):
        nbformat.write(nb, root / name)
    settings = tmp / "settings"
    for plugin, values in {
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }.items():
        folder = settings / plugin.split("/")[0] / plugin.split("/")[1]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{plugin.split('/')[2]}.jupyterlab-settings").write_text(json.dumps(values))
    config = tmp / "config"
    if disabled:
        (config / "labconfig").mkdir(parents=True)
        page_config = {"disabledExtensions": dict.fromkeys(disabled, True)}
        (config / "labconfig" / "page_config.json").write_text(json.dumps(page_config))
    port = _free_port()
    token = "neurarch-test-token"
    env = dict(os.environ)
    env.update({
        "NEURARCH_API": api, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
    })
    env.pop("NEURARCH_API_KEY", None)
    log = open(tmp / "server.log", "w")  # noqa: SIM115 - closed by the caller's stop()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         "--JupyterNotebookApp.expose_app_in_browser=True",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )
    base = f"http://127.0.0.1:{port}"

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop()
            pytest.fail("the Jupyter server did not start: " + (tmp / "server.log").read_text()[-2000:])
        time.sleep(0.25)
    return {"base": base, "token": token, "api": api, "stop": stop, "log": tmp / "server.log"}


@pytest.fixture
def jupyter(tmp_path: Path, service: Any) -> Iterator[dict]:
    """A fresh server per test: JupyterLab's saved workspace must not reach Notebook 7."""
    server = _start_server(tmp_path, service.url)
    yield server
    server["stop"]()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def _save(page_or_el: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page_or_el.screenshot(path=str(ARTIFACTS / name))


def _open_and_run(browser: Any, server: dict, url: str) -> tuple[Any, list[str]]:
    """A page at ``url`` with every cell run; also the console errors it logs from now on."""
    context = browser.new_context(viewport={"width": 1280, "height": 1400})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server["base"])
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc} {exc.stack}"))
    page.goto(f"{server['base']}{url}?token={server['token']}")
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
        " return !!k && k.status === 'idle'; }",
        timeout=RUN_TIMEOUT_MS,
    )
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    return page, errors


def _widget_checks(page: Any, server: dict, ids: list[str], prefix: str) -> None:
    host = server["api"].split("://", 1)[1]
    # --plan --share: the card in monospace and the share link, in the widget view.
    card = page.locator(".neurarch-widget pre.neurarch-card", has_text="SharedNet")
    card.wait_for(timeout=RUN_TIMEOUT_MS)
    text = card.inner_text()
    assert "| Runs" in text and "| Blockers" in text and text.startswith("+---")
    font = card.evaluate("el => getComputedStyle(el).fontFamily").lower()
    assert any(f in font for f in ("mono", "consol", "menlo")), font
    shared = page.locator(".neurarch-widget", has=page.locator("pre.neurarch-card", has_text="SharedNet"))
    link = shared.locator("a.neurarch-share-link")
    href = link.get_attribute("href")
    assert href and href.startswith(server["api"] + "/p/") and link.inner_text() == href
    assert shared.locator(".neurarch-warnings").is_visible()
    _save(shared, f"{prefix}-widget-shared.png")
    shared.locator("button.neurarch-copy").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('button.neurarch-copy')].some(b => b.textContent === 'Copied')",
        timeout=10_000)
    assert page.evaluate("() => navigator.clipboard.readText()") == href

    # Without a plan: the picture, the table, and a button naming the host.
    button = page.locator("button.neurarch-plan-button", has_text="Get the plan")
    button.wait_for(timeout=RUN_TIMEOUT_MS)
    label = button.inner_text()
    assert host in label and "no weights" in label, label
    view = page.locator(".neurarch-widget", has=page.locator(".neurarch-name", has_text="ButtonNet"))
    assert view.locator("button.neurarch-plan-button").inner_text() == label
    picture = view.locator(".nt-picture")
    t0 = time.monotonic()
    view.locator(".nt-open-all").click()
    page.wait_for_function(f"el => el.dataset.boxes === '{len(ids)}'", arg=picture.element_handle(), timeout=30_000)
    drawn = view.locator("svg [data-node-id]").evaluate_all("els => els.map(e => e.getAttribute('data-node-id'))")
    assert sorted(drawn) == sorted(ids), (drawn, ids)  # one element per component, each once
    assert view.locator(".nt-edge-residual").count() == 2 and view.locator(".nt-edge-concat").count() == 2
    print(f"{prefix}: opened all {len(ids)} boxes in {time.monotonic() - t0:.2f} s "
          f"(layout and drawing {picture.get_attribute('data-render-ms')} ms)")
    conv = view.locator('svg [data-node-id="n1"]')
    conv.hover()
    tip = view.locator(".nt-tip")
    tip.wait_for(state="visible", timeout=5_000)
    assert "conv2d" in tip.inner_text() and "3x16x16" in tip.inner_text() and "224" in tip.inner_text()
    conv.click()
    assert "hyperparameters" in view.locator(".nt-panel").inner_text()
    view.get_by_text("Layers (8)").click()
    table = view.locator("table.neurarch-layers")
    table.wait_for(state="visible", timeout=10_000)
    rows = table.inner_text()
    assert "conv2d" in rows and "8x16x16" in rows and "Total (8 layers)" in rows
    _save(view, f"{prefix}-widget-picture.png")
    button.click()
    planned = view.locator("pre.neurarch-card", has_text="ButtonNet")
    planned.wait_for(timeout=60_000)
    assert "| Runs" in planned.inner_text()
    _save(view, f"{prefix}-widget-button.png")


def test_widget_in_jupyterlab(jupyter: dict, browser: Any) -> None:
    page, errors = _open_and_run(browser, jupyter, "/lab/tree/lab.ipynb")
    _widget_checks(page, jupyter, _component_ids(), "jupyterlab")
    _save(page, "jupyterlab-page.png")
    assert _real_errors(errors) == []


def test_widget_in_notebook7(jupyter: dict, browser: Any) -> None:
    page, errors = _open_and_run(browser, jupyter, "/notebooks/classic.ipynb")
    _widget_checks(page, jupyter, _component_ids(), "notebook7")
    _save(page, "notebook7-page.png")
    assert _real_errors(errors) == []


def test_fallback_when_the_front_end_cannot_run_the_widget(tmp_path: Path, service: Any, browser: Any) -> None:
    server = _start_server(tmp_path, service.url, disabled=("anywidget",))
    try:
        page, _ = _open_and_run(browser, server, "/lab/tree/fallback.ipynb")
        card = page.locator(".jp-OutputArea-output pre.neurarch-card", has_text="SharedNet")
        card.wait_for(timeout=RUN_TIMEOUT_MS)
        output = page.locator(".jp-OutputArea-output", has=page.locator("pre.neurarch-card", has_text="SharedNet"))
        assert output.locator("a.neurarch-share-link").get_attribute("href").startswith(service.url + "/p/")
        unplanned = page.locator(".jp-OutputArea-output", has_text="ButtonNet")
        unplanned.wait_for(timeout=RUN_TIMEOUT_MS)
        assert "Not planned: nothing was sent" in unplanned.inner_text()
        unplanned.get_by_text("Layers (8)").click()
        assert "Total (8 layers)" in unplanned.locator("table.neurarch-layers").inner_text()
        page.wait_for_function(
            "() => { const s = window.jupyterapp.shell.currentWidget.sessionContext.session;"
            " return !s.kernel || s.kernel.status === 'idle'; }", timeout=RUN_TIMEOUT_MS)
        time.sleep(2)  # a front end that ran the widget would have swapped the outputs by now
        assert page.locator(".neurarch-widget").count() == 0
        assert page.locator("pre.neurarch-card").count() == 1
        _save(page, "fallback-page.png")
    finally:
        server["stop"]()


def test_share_page_draws_the_same_view(service: Any, browser: Any) -> None:
    """/p/<id> runs the same bundle under its nonce CSP: the picture, the table and the card, and
    not one console error (a refused script or fetch would log one)."""
    import requests
    import torch
    from torch import nn

    from neurarch_trace.tracer import trace_model

    scope: dict[str, Any] = {"torch": torch, "nn": nn}
    exec(MODEL, scope)  # noqa: S102 - the test's own model source
    graph = trace_model(scope["BrowserNet"](), (torch.randn(1, 3, 16, 16),), name="<b>Shared</b>")
    url = requests.post(service.url + "/api/v1/plan", json={"model": graph, "share": True}, timeout=60).json()["url"]
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type in ("error", "warning") else None)
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.goto(url)
    root = page.locator("[data-neurarch-mounted]")
    root.wait_for(timeout=30_000)
    assert root.locator("pre.neurarch-card").inner_text().startswith("+---")
    assert root.locator("a.neurarch-share-link").get_attribute("href") == url
    assert root.locator(".neurarch-name").inner_text() == "<b>Shared</b>"  # text, never markup
    root.locator(".nt-open-all").click()
    drawn = root.locator("svg [data-node-id]").evaluate_all("els => els.map(e => e.getAttribute('data-node-id'))")
    assert sorted(drawn) == sorted(c["id"] for c in graph["components"])
    assert "Total (8 layers)" in root.locator("table.neurarch-layers").inner_text()
    _save(page, "share-page.png")
    page.close()
    assert errors == []
