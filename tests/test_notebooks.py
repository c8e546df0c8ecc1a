"""Every notebook in notebooks/ runs headless in a real ``python3`` kernel (nbclient), starts its own
plan service in the kernel, and shows the card, the share link and the layer table.

Each notebook is copied into a temporary folder laid out like the repository (``notebooks/`` next
to a link to ``examples/``), so the graphs and checkpoints it writes stay out of the tree.
``NEURARCH_API`` points where nothing listens: a notebook that planned anywhere but its own
loopback service would fail.

Checks:

* the saved notebooks (what GitHub and a reader see) carry executed outputs whose ``text/html`` is
  the card, the share link and the layer table (no front end ran the widget when they were
  executed, so no output is a widget view waiting for a widget manager);
* the notebooks run again now, without an error, with nbclient saving the widget state, and the
  plan service is still up after the last cell ("Run All" never stops it): a click on the last
  result's plan button, made after the last cell, gets its card;
* that executed notebook, widget state and all, exported by nbconvert to HTML, shows the card, the
  link and the table with no network (no widget view is left for the CDN-loaded widget manager).

To refresh the saved outputs after editing a notebook::

    NEURARCH_UPDATE_NOTEBOOKS=1 python -m pytest tests/test_notebooks.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("anywidget")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
CARD_LINE = re.compile(r"^\+-{20,}\+$", re.M)  # the card's box rule
CELL_TIMEOUT_S = 600
UPDATE = os.environ.get("NEURARCH_UPDATE_NOTEBOOKS", "") not in ("", "0")

# Appended to each run: after every cell has run, the service still answers and the last result's
# plan button (pressed from code, as the front end's message would) brings a card.
AFTER_RUN_ALL = '''
import os, requests
assert requests.get(os.environ["NEURARCH_API"] + "/api/v1/health", timeout=10).ok
w = r.widget
w.click()
assert w.wait(60) and r.error is None and r.card, r.error
'''


def _outputs(nb: Any) -> Iterator[dict]:
    for cell in nb.cells:
        if cell.cell_type == "code":
            yield from cell.get("outputs", [])


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "".join(value)


def _texts(nb: Any) -> str:
    """Every text an output carries: streams, text/plain and text/html."""
    parts = []
    for out in _outputs(nb):
        if out.get("output_type") == "stream":
            parts.append(_text(out.get("text", "")))
        for mime in ("text/plain", "text/html"):
            value = out.get("data", {}).get(mime)
            if value:
                parts.append(_text(value))
    return "\n".join(parts)


def _check_outputs(nb: Any, name: str) -> None:
    errors = [o for o in _outputs(nb) if o.get("output_type") == "error"]
    assert not errors, f"{name}: an error output: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    texts = _texts(nb)
    assert CARD_LINE.search(texts), f"{name}: no card in the text outputs"
    assert "| Runs" in texts and "| Blockers" in texts, f"{name}: the card rows are missing"
    assert re.search(r"Share: https?://127\.0\.0\.1:\d+/p/\S+", texts), f"{name}: no loopback share link"
    html = "\n".join(_text(o["data"]["text/html"]) for o in _outputs(nb) if "text/html" in o.get("data", {}))
    assert '<pre class="neurarch-card"' in html and 'class="neurarch-share-link"' in html, f"{name}: no card in HTML"
    assert '<table class="neurarch-layers"' in html and "Total (" in html, f"{name}: no layer table in HTML"
    for cell in nb.cells:  # each planning line shows its own card (the hf: target's too)
        planning = [ln for ln in cell.source.splitlines() if "%neurarch" in ln and re.search(r"--(plan|share)\b", ln)]
        if cell.cell_type == "code" and planning:
            one = _texts(nbformat.v4.new_notebook(cells=[cell]))
            assert CARD_LINE.search(one) and "| Runs" in one, f"{name}: no card under {planning[0]!r}"
    ours = [o for o in _outputs(nb) if "neurarch-" in _text(o.get("data", {}).get("text/html", ""))]
    assert not [o for o in ours if WIDGET_VIEW in o["data"]], \
        f"{name}: a widget view no front end ever ran (nbconvert would show it empty)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_saved_notebook_shows_card_link_and_table(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    _check_outputs(nb, path.name)
    assert "widgets" not in nb.metadata  # saved without widget state: no bundle copies in the file
    sources = "\n".join(c.source for c in nb.cells)
    assert "OWNER" not in sources  # no placeholder to install from
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "start_plan_service(" in code and ".stop(" not in code and ".terminate(" not in code


def test_the_expected_notebooks_exist() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {"quickstart.ipynb", "huggingface.ipynb", "colab.ipynb"} <= names


def _execute(path: Path, tmp_path: Path) -> Any:
    work = tmp_path / "notebooks"
    work.mkdir()
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(AFTER_RUN_ALL))
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(work)}},
        store_widget_state=True,
    )
    client.execute()
    nb.cells.pop()
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_exports(path: Path, tmp_path: Path, refused_port: int,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURARCH_API", f"http://127.0.0.1:{refused_port}")  # nothing may be planned here
    monkeypatch.delenv("NEURARCH_API_KEY", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the Hugging Face notebook builds from configs only
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    nb = _execute(path, tmp_path)
    _check_outputs(nb, path.name)
    work = tmp_path / "notebooks"
    written = sorted(p.name for p in work.glob("*.neurarch.json"))
    assert written, f"{path.name} wrote no .neurarch.json"
    for name in written:
        graph = json.loads((work / name).read_text())
        assert graph["components"] and graph["connections"]

    # The widget state nbclient saved holds the anywidget models, with the bundle and the graph...
    state = nb.metadata["widgets"][WIDGET_STATE]["state"]
    models = [m["state"] for m in state.values() if m["model_name"] == "AnyModel"]
    assert models and all("data-neurarch-share" in m["_esm"] and m["graph"]["components"] for m in models)
    # ... and nbconvert, with that state, still shows the card, the link and the table: no output is a
    # widget view, so no part of the page depends on the widget manager it loads from a CDN.
    exporter = pytest.importorskip("nbconvert").HTMLExporter()
    html, _ = exporter.from_notebook_node(nb)
    assert '<pre class="neurarch-card"' in html and "| Runs" in html
    assert re.search(r'<a class="neurarch-share-link" href="http://127\.0\.0\.1:\d+/p/[^"]+"', html)
    assert '<table class="neurarch-layers"' in html
    others = sum(1 for o in _outputs(nb) if WIDGET_VIEW in o.get("data", {}))  # e.g. transformers' progress bars
    assert html.count(f'<script type="{WIDGET_VIEW}">') == others

    if UPDATE:
        nb.metadata.pop("widgets", None)
        nbformat.write(nb, path)
        shutil.rmtree(work, ignore_errors=True)


def test_html_export_without_widget_state_shows_card_and_link() -> None:
    """GitHub and nbconvert on the saved files: the result's own HTML, the card in a <pre>."""
    exporter = pytest.importorskip("nbconvert").HTMLExporter()
    for path in NOTEBOOKS:
        html, _ = exporter.from_notebook_node(nbformat.read(path, as_version=4))
        assert '<pre class="neurarch-card"' in html and "| Runs" in html, path.name
        assert re.search(r'<a class="neurarch-share-link" href="https?://[^"]+/p/[^"]+"', html), path.name
        assert "<script" not in html.split('<pre class="neurarch-card"', 1)[1].split("</div>", 1)[0]
