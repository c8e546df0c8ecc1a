"""The HTML page of a share: the card and a per-layer table. Every string from the graph is escaped.

Self-contained (inline CSS, no script, nothing fetched from elsewhere), served with a
Content-Security-Policy that forbids scripts, so even a graph that smuggled markup past the
escaping could not run any.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any, Optional

from neurarch_trace.planner import units

__all__ = ["CONTENT_SECURITY_POLICY", "render_share_page"]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)

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


def _flops(value: Any, source: Optional[str]) -> str:
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


def render_share_page(share_id: str, created: str, text: str, plan: Mapping[str, Any]) -> str:
    """The whole page as a string."""
    model = plan.get("model", {}) if isinstance(plan, Mapping) else {}
    layers = plan.get("layers", []) if isinstance(plan, Mapping) else []
    name = _e(model.get("name", "graph"))
    return "\n".join([
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        '<meta name="robots" content="noindex,nofollow">',
        f"<title>{name}: neurarch plan</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{name}</h1>",
        f'<p class=muted>Shared plan, created {_e(created)} UTC. '
        f'<a href="{_e(share_id)}.json">Graph and plan as JSON</a>.</p>',
        f"<pre>{_e(text)}</pre>",
        f"<h2>Layers ({len(layers):,})</h2>",
        "<table><thead><tr><th>name</th><th>type</th><th>scope</th><th>input</th><th>output</th>"
        "<th class=n>params</th><th class=n>FLOPs / sample</th></tr></thead><tbody>",
        *_rows(layers),
        "</tbody></table>",
        "</body></html>",
    ])
