"""The HTML page of a share: the card and a per-layer table, then the notebook widget's view.

The page itself is the fallback: the card and the layer table as escaped, script-free HTML (every
string from the graph is escaped). One script, the front-end bundle the notebook widget also loads
(``neurarch_trace/static/neurarch-widget.js``, served by this service at ``/p/_static/``), replaces
it with the same picture, table and card as in the notebook, reading the share's JSON from this
origin. The Content-Security-Policy allows that one script only (a per-response nonce), fetches to
this origin only and nothing else, so even a graph that smuggled markup past the escaping could not
run anything.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any

import neurarch_trace.text as units

__all__ = ["BUNDLE_PATH", "BUNDLE_ROUTE", "bundle", "content_security_policy", "render_share_page"]

#: The front end both hosts load (built from ``extension/`` by ``npm run build``).
BUNDLE_PATH = Path(__file__).resolve().parent.parent / "static" / "neurarch-widget.js"
#: Where this service serves it, relative to a share page (``/p/<id>``).
BUNDLE_ROUTE = "_static/neurarch-widget.js"


def content_security_policy(nonce: str) -> str:
    """The share page's policy: scripts only with ``nonce`` (the bundle's tag), fetches only to this
    origin (the share's JSON), inline styles, nothing else."""
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; connect-src 'self'; style-src 'unsafe-inline'; "
        "img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


@functools.lru_cache(maxsize=1)
def bundle() -> tuple[bytes, str]:
    """``(the bundle's bytes, the first 12 hex digits of its SHA-256)``; the digest versions its URL.

    Raises:
        FileNotFoundError: the package was built without the bundle.
    """
    data = BUNDLE_PATH.read_bytes()
    return data, hashlib.sha256(data).hexdigest()[:12]


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:72rem;padding:0 1rem;color:#1b1f24}
pre{font:13px/1.35 ui-monospace,Menlo,Consolas,monospace;background:#f6f8fa;padding:1rem;overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #d0d7de;padding:.3rem .5rem;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,Menlo,Consolas,monospace}
.muted{color:#57606a}
"""


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _shape(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_e(v) for v in value) + "]"
    return ""


def _flops(value: Any, source: str | None) -> str:
    if value is None:
        return "unknown"
    text = units.flops(value) if isinstance(value, (int, float)) else _e(value)
    return text + (" (est.)" if source == "estimated" else "")


def _rows(layers: Iterable[Mapping[str, Any]]) -> list[str]:
    rows = []
    for layer in layers:
        params = layer.get("params")
        params_text = f"{params:,}" if isinstance(params, int) else ""
        rows.append(
            "<tr>"
            f"<td><code>{_e(layer.get('name'))}</code></td>"
            f"<td>{_e(layer.get('type'))}</td>"
            f"<td class=muted>{_e(layer.get('scope') or '')}</td>"
            f"<td>{_shape(layer.get('inputShape'))}</td>"
            f"<td>{_shape(layer.get('outputShape'))}</td>"
            f"<td class=n>{params_text}</td>"
            f"<td class=n>{_flops(layer.get('flops'), layer.get('flopsSource'))}</td>"
            "</tr>"
        )
    return rows


def _script(nonce: str) -> str:
    try:
        _, digest = bundle()
    except OSError:
        return ""  # no bundle in this install: the page stays the static one
    return f'<script type="module" nonce="{_e(nonce)}" src="{BUNDLE_ROUTE}?v={digest}"></script>'


def render_share_page(share_id: str, created: str, text: str, plan: Mapping[str, Any], *, nonce: str) -> str:
    """The whole page as a string; ``nonce`` must be the one in :func:`content_security_policy`."""
    model = plan.get("model", {}) if isinstance(plan, Mapping) else {}
    layers = plan.get("layers", []) if isinstance(plan, Mapping) else []
    name = _e(model.get("name", "graph"))
    return "\n".join([
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        '<meta name="robots" content="noindex,nofollow">',
        f"<title>{name}: neurarch plan</title>",
        f"<style>{_STYLE}</style>",
        _script(nonce),
        "</head><body>",
        f"<h1>{name}</h1>",
        f'<p class=muted>Shared plan, created {_e(created)} UTC. '
        f'<a href="{_e(share_id)}.json">Graph and plan as JSON</a>.</p>',
        f'<div id="neurarch-view" data-neurarch-share="{_e(share_id)}.json">',
        f"<pre>{_e(text)}</pre>",
        f"<h2>Layers ({len(layers):,})</h2>",
        "<table><thead><tr><th>name</th><th>type</th><th>scope</th><th>input</th><th>output</th>"
        "<th class=n>params</th><th class=n>FLOPs / sample</th></tr></thead><tbody>",
        *_rows(layers),
        "</tbody></table>",
        "</div>",
        "</body></html>",
    ])
