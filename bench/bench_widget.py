"""The front end in a real browser: how long the view takes to draw, and how tall the table is.

    python bench/bench_widget.py [--repeat 5] [--json bench/results/widget.json]

Each graph is traced here, shared through the reference plan service on loopback (started in this
process), and its share page (/p/<id>, the same bundle the notebook widget runs) is opened in
headless Chromium (Debian's, driven by Playwright). Measured, median of ``--repeat`` page loads:

* ``mount``: from the start of navigation until the view has replaced the page's static fallback
  (the bundle loaded and parsed, the share's JSON fetched, the scope tree built, the first level of
  blocks laid out by dagre and drawn);
* ``first draw``: the layout and SVG drawing of that first level alone (the view's own clock);
* ``open all``: a click on *Open all*: every block open, or as many levels as stay under the view's
  500-box cap (the layout cost grows faster than the box count), laid out and drawn;
* for ResNet-18, the layer table's height on the page (its scroll box) against the height of all
  its rows (the old widget's flat table was 2,141 px tall).

Graphs: ResNet-18 (examples/models/resnet.py, 68 layers), a stack of 200 five-layer residual
blocks (1,001 layers, nested by scope), a flat ``nn.Sequential`` of 1,000 linears, and one of
4,000. Numbers depend on the machine: they are reported, never asserted.

``--screenshot PATH`` also runs ResNet-18 with ``--plan --share`` in JupyterLab (the browser tests'
server, tests/test_browser.py) and saves the widget as a PNG (README's picture, docs/widget.png).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import requests
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("NEURARCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

sys.path.insert(0, str(ROOT / "examples" / "models"))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2, self.norm = nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16), nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(self.act(self.fc1(x))))


class Deep(nn.Module):
    def __init__(self, n: int = 200) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def graphs() -> list[tuple[str, dict]]:
    from resnet import ResNet18

    from neurarch_trace.tracer import trace_model

    return [
        ("ResNet-18", trace_model(ResNet18(), (torch.randn(1, 3, 224, 224),), name="ResNet18")),
        ("200 residual blocks", trace_model(Deep(), (torch.randn(1, 16),), name="Deep")),
        ("flat 1,000 linears", trace_model(nn.Sequential(*[nn.Linear(8, 8) for _ in range(1000)]),
                                           (torch.randn(1, 8),), name="Flat1000")),
        ("flat 4,000 linears", trace_model(nn.Sequential(*[nn.Linear(8, 8) for _ in range(4000)]),
                                           (torch.randn(1, 8),), name="Flat4000")),
    ]


_MEASURE = """() => {
  const root = document.querySelector('[data-neurarch-mounted]');
  const picture = root.querySelector('.nt-picture');
  const nav = performance.getEntriesByType('navigation')[0];
  const mounted = Number(root.dataset.mountedAt);
  const first = { boxes: Number(picture.dataset.boxes), ms: Number(picture.dataset.renderMs) };
  const t0 = performance.now();
  picture.querySelector('.nt-open-all').click();
  const openMs = performance.now() - t0;
  const scroll = root.querySelector('.nt-table-scroll');
  return { mountMs: mounted - nav.startTime, first, open: { boxes: Number(picture.dataset.boxes), ms: openMs },
           nodes: root.querySelectorAll('svg [data-node-id]').length,
           tableBox: scroll.getBoundingClientRect().height, tableRows: scroll.scrollHeight };
}"""


def measure(browser: Any, url: str, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(url)
        page.wait_for_selector("[data-neurarch-mounted]", timeout=120_000)
        runs.append(page.evaluate(_MEASURE))
        page.close()
    med = statistics.median
    return {
        "mount_ms": round(med(r["mountMs"] for r in runs), 1),
        "first_boxes": runs[0]["first"]["boxes"], "first_draw_ms": round(med(r["first"]["ms"] for r in runs), 1),
        "open_boxes": runs[0]["open"]["boxes"], "open_all_ms": round(med(r["open"]["ms"] for r in runs), 1),
        "table_box_px": round(runs[0]["tableBox"]), "table_rows_px": runs[0]["tableRows"],
    }


_NOTEBOOK = [
    "%load_ext neurarch_trace\nimport sys, torch\n"
    f"sys.path.insert(0, {str(ROOT / 'examples' / 'models')!r})\nfrom resnet import ResNet18\nmodel = ResNet18()",
    "%neurarch model --input 1,3,224,224 --name ResNet18 --plan --share --no-save",
]


def screenshot(api: str, out: Path) -> None:
    """ResNet-18 planned and shared in JupyterLab; the widget saved as ``out``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from playwright.sync_api import sync_playwright
    from test_browser import _open_and_run, _start_server

    server = _start_server(Path(tempfile.mkdtemp()), api, cells=_NOTEBOOK)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page, _ = _open_and_run(browser, server, "/lab/tree/lab.ipynb")
                widget = page.locator(".neurarch-widget", has=page.locator("pre.neurarch-card", has_text="ResNet18"))
                widget.wait_for(timeout=240_000)
                widget.locator('svg [data-scope="layer2.0"] rect').first.click()  # one block open, as a reader would
                canvas = widget.locator(".nt-canvas")
                canvas.evaluate("el => { el.scrollTop = el.querySelector('.nt-cluster[data-scope=\"layer2.0\"]')"
                                ".getBoundingClientRect().top - el.getBoundingClientRect().top + el.scrollTop - 140; }")
                widget.locator('svg [data-node-id]', has_text="conv1").nth(1).hover()  # the hover card
                page.wait_for_timeout(300)
                widget.screenshot(path=str(out))
                print(f"wrote {out}")
            finally:
                browser.close()
    finally:
        server["stop"]()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default=None, metavar="OUT")
    parser.add_argument("--screenshot", default=None, metavar="PNG")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from neurarch_trace.notebook.service import start_plan_service

    service = start_plan_service(set_env=False, db_path=Path(tempfile.mkdtemp()) / "shares.sqlite3")
    results = []
    try:
        shared = []
        for name, graph in graphs():
            answer = requests.post(service.url + "/api/v1/plan", json={"model": graph, "share": True}, timeout=120)
            answer.raise_for_status()
            layers = sum(1 for c in graph["components"] if c["type"] not in ("input", "output"))
            shared.append((name, layers, len(graph["components"]), answer.json()["url"]))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                for name, layers, components, url in shared:
                    row = {"graph": name, "layers": layers, "components": components,
                           **measure(browser, url, args.repeat)}
                    results.append(row)
                    print(json.dumps(row))
            finally:
                browser.close()
        if args.screenshot:
            screenshot(service.url, Path(args.screenshot))
    finally:
        service.stop()
    bundle = (ROOT / "neurarch_trace" / "static" / "neurarch-widget.js").read_bytes()
    import gzip

    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                   "Chromium (Debian)",
        "bundle_bytes": len(bundle), "bundle_gzip_bytes": len(gzip.compress(bundle, 9)), "repeat": args.repeat,
        "results": results,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "results"}))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
