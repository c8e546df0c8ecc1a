"""A notebook result as plain text and as script-free HTML: what a terminal IPython, nbconvert HTML,
GitHub's notebook preview, or any front end without the widget shows.

The HTML carries the same facts as the widget's view (``extension/src``): the summary, the
training memory the trace measured, the card as the plan service rendered it, the share link,
blockers and warnings, and the layer table with its totals row. It has no script, no external
resource and no event handler; every string from the graph, the card or the service is escaped.
Styles are inline and use JupyterLab's CSS variables with fallbacks.

The layer rows follow the same rules as ``extension/src/rows.js``: parameters are the ones the call
owns; a repeated call of a module whose first call owns parameters says ``shared with <first call>``
(a parameter-free ReLU called twice says nothing); an ``lmHead`` whose weight is an input
embedding's says ``tied to <embedding>``; FLOPs and saved bytes are per sample, like the shapes.

Functions take the result object (:class:`~neurarch_trace.notebook.result.NeurarchResult`) by duck
typing, so this module imports nothing of the notebook package, IPython, ipywidgets, torch or the
planner; numbers are written by :mod:`neurarch_trace.text`, as on the card.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from typing import Any

from neurarch_trace.text import count, flops, plural, shape_text

__all__ = [
    "MAX_TABLE_ROWS", "byte_size", "escape", "labels", "layer_rows", "memory_rows", "params_note",
    "result_text", "static_html", "summary_lines", "table_html", "tied_embedding", "totals",
]

#: Rows of the static layer table at most; the rest is counted in a last line (the widget pages on).
MAX_TABLE_ROWS = 500

_BYTE_PREFIXES = ["", "K", "M", "G", "T", "P", "E"]

_MUTED = "color: var(--jp-ui-font-color2, #666);"
_ERROR = "color: var(--jp-error-color1, #c62828);"
_WARN = "color: var(--jp-warn-color1, #a15c00);"
_BOX = (
    "font-family: var(--jp-ui-font-family, system-ui, sans-serif); "
    "font-size: var(--jp-ui-font-size1, 13px); color: var(--jp-ui-font-color1, inherit); line-height: 1.45;"
)
_CARD = (
    "font-family: var(--jp-code-font-family, ui-monospace, SFMono-Regular, Menlo, Consolas, monospace); "
    "font-size: var(--jp-code-font-size, 13px); line-height: 1.3; margin: 4px 0; padding: 6px 8px; "
    "white-space: pre; overflow-x: auto; width: fit-content; max-width: 100%; box-sizing: border-box; "
    "background: var(--jp-layout-color2, #f5f5f5); color: var(--jp-content-font-color1, inherit); border-radius: 3px;"
)
_TH = "text-align: left; padding: 2px 10px 2px 0; border-bottom: 1px solid var(--jp-border-color1, #bbb);"
_TR = "border-bottom: 1px solid var(--jp-border-color3, #eee);"
_TD = "text-align: left; padding: 1px 10px 1px 0;"
_TDR = "padding: 1px 10px 1px 0; text-align: right;"
_THR = _TH.replace("text-align: left", "text-align: right")


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def byte_size(num_bytes: float) -> str:
    """Bytes with an SI prefix, 10^3 steps: ``512 B``, ``1.2 MB``, ``3.4 GB`` (per-layer sizes, where
    :func:`neurarch_trace.text.gb` would print ``0.00 GB``). Written as ``extension/src/format.js``
    writes them."""
    magnitude, index = abs(num_bytes), 0
    if magnitude < 1000:
        return f"{num_bytes:,.0f} B"
    while magnitude >= 999.95 and index < len(_BYTE_PREFIXES) - 1:
        magnitude /= 1000
        index += 1
    return f"{'-' if num_bytes < 0 else ''}{magnitude:.1f} {_BYTE_PREFIXES[index]}B"


# ----------------------------------------------------------------------------------- rows


def tied_embedding(graph: dict, head: dict) -> dict | None:
    """The embedding component an ``lmHead``'s weight is tied to: the first embedding of the same
    vocabulary and width that owns at least vocab x width parameters (the graph records that the
    head is tied, ``params.weightTied``, not to what)."""
    p = head.get("params") or {}
    vocab, dim = p.get("vocabSize"), p.get("embedDim")
    if not isinstance(vocab, int) or not isinstance(dim, int):
        return None
    for comp in graph.get("components", []):
        cp = comp.get("params") or {}
        owned = _num((comp.get("measured") or {}).get("params")) or 0
        if comp.get("type") == "embedding" and cp.get("vocabSize") == vocab and cp.get("embeddingDim") == dim \
                and owned >= vocab * dim:
            return comp
    return None


def params_note(graph: dict, comp: dict, by_id: dict | None = None) -> str | None:
    """Where a layer's parameters live when another layer owns them: ``tied to <embedding>`` for a
    weight-tied ``lmHead``, ``shared with <first call>`` for a repeated call whose first call owns
    parameters; None otherwise (a parameter-free module called twice owns nothing to share)."""
    if comp.get("type") == "lmHead" and (comp.get("params") or {}).get("weightTied"):
        embedding = tied_embedding(graph, comp)
        return f"tied to {embedding.get('name') if embedding else 'the input embedding'}"
    shared = (comp.get("measured") or {}).get("sharedWith")
    if not shared:
        return None
    if by_id is None:
        by_id = {c.get("id"): c for c in graph.get("components", [])}
    first = by_id.get(shared)
    if first is not None and (_num((first.get("measured") or {}).get("params")) or 0) > 0:
        return f"shared with {first.get('name', shared)}"
    return None


def _batch(graph: dict) -> int:
    b = (graph.get("measured") or {}).get("batchSize")
    return b if isinstance(b, int) and b > 0 else 1


def layer_rows(graph: dict) -> list[dict[str, Any]]:
    """One row per layer (components other than inputs and outputs), in graph order:
    ``{"id", "name", "type", "scope", "inputShapes", "outputShape", "params", "note", "flops",
    "saved", "sharedWith"}``. Shapes are batchless; ``inputShapes`` lists every operand of a merge
    (``measured.inputShapes``), else the first input; ``params`` the learnable parameters the call
    owns (None when not measured); ``note`` see :func:`params_note`; ``flops`` and ``saved``
    (``measured.savedBytes``, bytes kept for backward) per sample, None when not measured;
    ``sharedWith`` the name of the first call of a repeated module."""
    comps = graph.get("components", [])
    by_id = {c.get("id"): c for c in comps}
    batch = _batch(graph)
    rows = []
    for comp in comps:
        if comp.get("type") in ("input", "output"):
            continue
        measured = comp.get("measured") or {}
        shapes = measured.get("inputShapes")
        if not (isinstance(shapes, list) and shapes):
            shapes = [comp["inputShape"]] if isinstance(comp.get("inputShape"), list) else []
        layer_flops, saved = _num(measured.get("flops")), _num(measured.get("savedBytes"))
        shared = measured.get("sharedWith")
        rows.append({
            "id": comp.get("id"),
            "name": comp.get("name", comp.get("id")),
            "type": comp.get("type", "?"),
            "scope": comp.get("scope") or "",
            "inputShapes": shapes,
            "outputShape": comp.get("outputShape"),
            "params": _num(measured.get("params")),
            "note": params_note(graph, comp, by_id),
            "flops": None if layer_flops is None else layer_flops / batch,
            "saved": None if saved is None else saved / batch,
            "sharedWith": (by_id.get(shared) or {}).get("name", shared) if shared else None,
        })
    return rows


def totals(graph: dict, rows: list | None = None) -> dict[str, Any]:
    """The totals row: ``params`` (unique, from ``measured.params``), ``trainable`` and ``frozen``
    (``measured.trainableParams``/``frozenParams``, None when absent), ``flops`` per sample of the
    whole forward (functional code included), ``saved`` bytes per sample (None when no layer has
    ``savedBytes``)."""
    rows = layer_rows(graph) if rows is None else rows
    measured = graph.get("measured") or {}
    total_flops = _num(measured.get("flops"))
    has_saved = any(r["saved"] is not None for r in rows)
    params = _num(measured.get("params"))
    return {
        "layers": len(rows),
        "params": params if params is not None else sum(r["params"] or 0 for r in rows),
        "trainable": _num(measured.get("trainableParams")),
        "frozen": _num(measured.get("frozenParams")),
        "flops": total_flops / _batch(graph) if total_flops is not None else sum(r["flops"] or 0 for r in rows),
        "saved": sum(r["saved"] or 0 for r in rows) if has_saved else None,
    }


def _words(key: str) -> str:
    """``peakPhase`` -> ``peak phase`` (as ``extension/src/summary.js`` writes keys)."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key).lower()


def _value_text(key: str, value: Any, unit: str = "") -> str:
    """A value as text; numbers under a key ending in ``Bytes`` (or nested in one) are bytes, ``Flops`` FLOPs."""
    unit = key if key.lower().endswith(("bytes", "flops")) else unit
    if _num(value) is not None:
        if unit.lower().endswith("bytes"):
            return byte_size(value)
        return flops(value) if unit.lower().endswith("flops") else count(value)
    if isinstance(value, list):  # a list of objects (the phase peaks) item by item, as the objects themselves
        glue = " | " if any(isinstance(v, dict) for v in value) else ", "
        return glue.join(_value_text(key, v, unit) for v in value)
    if isinstance(value, dict):
        return " · ".join(f"{_words(k)} {_value_text(k, v, unit)}" for k, v in value.items())
    return str(value)


def memory_rows(graph: dict) -> list[tuple[str, str]]:
    """The training memory the trace measured (``measured.training``), as ``(label, value)`` pairs
    (``bytes`` keys as bytes, nested objects on one line); empty when the graph has none."""
    training = (graph.get("measured") or {}).get("training")
    if not isinstance(training, dict):
        return []
    return [(_words(k), _value_text(k, v)) for k, v in training.items() if v is not None and v != {} and v != []]


# ----------------------------------------------------------------------------------- text


def summary_lines(result: Any) -> list[str]:
    """The summary as plain-text lines: name, counts, inputs, output, measured memory."""
    s = result.summary
    head = f"{result.name}: {plural(s['layers'], 'layer')}, {_count(s['params'])} params"
    if s["flops"] is not None:
        head += f", {_flops(s['flops'])}"
        if s["batchSize"] is not None:
            head += f" at batch {s['batchSize']}"
    lines = [head]
    for item in s["inputs"]:
        lines.append(f"  input  {item.get('name')} {shape_text(item.get('shape'))} {item.get('dtype', '')}".rstrip())
    if s["outputShape"] is not None:
        lines.append(f"  output {shape_text(s['outputShape'])} per sample")
    memory = memory_rows(result.graph)
    if memory:
        lines.append("  training memory (measured by the trace): " + "; ".join(f"{k} {v}" for k, v in memory))
    return lines


def _count(value: Any) -> str:
    return count(value) if _num(value) is not None else "?"


def _flops(value: Any) -> str:
    return flops(value) if _num(value) is not None else "? FLOPs"


def result_text(result: Any) -> str:
    """``str(result)``: the card and the share link once planned, else the summary; then any
    failure, where the graph is, and what was (not) sent."""
    lines: list[str] = []
    if result.card is not None:
        lines.append(result.card.rstrip("\n"))
        if result.url:
            lines.append(f"Share: {result.url}")
    else:
        lines.extend(summary_lines(result))
    if result.share_error:
        lines.append(f"No share link: {result.share_error}")
    if result.error:
        lines.append(f"Plan failed: {result.error}")
        if result.traceback:
            lines.append(result.traceback.rstrip("\n"))
    lines.append(f"Graph: {result.path}" if result.path else "Graph: not saved")
    if result.card is None and not result.error:
        lines.append("Not planned: nothing was sent. Call .request_plan() or pass --plan / --share.")
    return "\n".join(lines)


def labels(result: Any, host: str) -> dict[str, str]:
    """What the plan button says in each state, naming what a click sends and where:
    ``plan`` (no share), ``share`` (with the share box ticked), ``link`` (a card without a link
    yet), ``working`` (the line shown while the request is in flight)."""
    from neurarch_trace.plan_options import button_label

    def label(**state: bool) -> str:
        return button_label(result.graph, has_base=result.base is not None, host=host, **state)

    return {
        "plan": label(share=False, planned=False),
        "share": label(share=True, planned=False),
        "link": label(share=True, planned=True),
        "working": f"Working: sending {result.what_is_sent()} to {host} and waiting for the plan…",
    }


# ----------------------------------------------------------------------------------- HTML


def _summary_html(result: Any) -> str:
    s = result.summary
    facts = [plural(s["layers"], "layer"), f"{_count(s['params'])} params"]
    if s["flops"] is not None:
        facts.append(_flops(s["flops"]) + (f" at batch {s['batchSize']}" if s["batchSize"] is not None else ""))
    head = (f'<div><b class="neurarch-name">{escape(result.name)}</b> &middot; '
            f'{" &middot; ".join(escape(f) for f in facts)}</div>')
    shapes = [
        f"Input <code>{escape(i.get('name'))}</code> {escape(shape_text(i.get('shape')))} {escape(i.get('dtype', ''))}"
        for i in s["inputs"]
    ]
    if s["outputShape"] is not None:
        shapes.append(f"Output {escape(shape_text(s['outputShape']))} per sample")
    body = f'<div style="{_MUTED}">{" &middot; ".join(shapes)}</div>' if shapes else ""
    if s["uncountedOps"]:
        more = " and more" if len(s["uncountedOps"]) > 5 else ""
        body += (f'<div style="{_MUTED}">FLOPs leave out {escape(", ".join(s["uncountedOps"][:5]))}{more} '
                 "(no formula)</div>")
    return head + body


def _memory_html(graph: dict) -> str:
    rows = memory_rows(graph)
    if not rows:
        return ""
    items = "".join(f'<tr><td style="{_MUTED} padding-right: 10px;">{escape(k)}</td><td>{escape(v)}</td></tr>'
                    for k, v in rows)
    batch = (graph.get("measured") or {}).get("batchSize")
    batch = batch if isinstance(batch, int) else "?"
    return (f'<div class="neurarch-memory"><b>Training memory</b> <span style="{_MUTED}">rehearsed by the trace at '
            f"batch {batch} (the card sizes its own batch)</span><table>{items}</table></div>")


def _row_html(row: dict, saved: bool) -> str:
    params = f"{row['params']:,.0f}" if row["params"] is not None else "-"
    if row["note"]:
        params += f' <span style="{_MUTED}">{escape(row["note"])}</span>'
    ins = ", ".join(shape_text(s) for s in row["inputShapes"]) or "-"
    cells = [
        f'<td style="{_TD}"><code>{escape(row["name"])}</code></td>',
        f'<td style="{_TD}">{escape(row["type"])}</td>',
        f'<td style="{_TD}">{escape(ins)}</td>',
        f'<td style="{_TD}">{escape(shape_text(row["outputShape"]))}</td>',
        f'<td style="{_TDR}">{params}</td>',
        f'<td style="{_TDR}">{escape("not counted" if row["flops"] is None else flops(row["flops"]))}</td>',
    ]
    if saved:
        cells.append(f'<td style="{_TDR}">{escape("-" if row["saved"] is None else byte_size(row["saved"]))}</td>')
    return f'<tr style="{_TR}">{"".join(cells)}</tr>'


def _totals_html(t: dict, saved: bool) -> str:
    split = ""
    if t["trainable"] is not None and t["frozen"] is not None:
        split = f" (trainable {count(t['trainable'])}, frozen {count(t['frozen'])})"
    cells = [f'<td style="{_TD}"><b>Total ({t["layers"]} layers)</b></td>', f'<td style="{_TD}"></td>' * 3,
             f'<td style="{_TDR}">{escape(format(t["params"], ",.0f") + split)}</td>',
             f'<td style="{_TDR}">{escape(flops(t["flops"]))}</td>']
    if saved:
        cells.append(f'<td style="{_TDR}">{escape("-" if t["saved"] is None else byte_size(t["saved"]))}</td>')
    return f'<tfoot><tr class="neurarch-total">{"".join(cells)}</tr></tfoot>'


def table_html(graph: dict, rows: Iterable[dict] | None = None) -> str:
    """The layer table: layer, type, input and output shapes (per sample), parameters owned (with
    the shared/tied note), FLOPs per sample, bytes saved for backward per sample when the graph has
    them, and the totals row (trainable and frozen parameters)."""
    rows = layer_rows(graph) if rows is None else list(rows)
    saved = any(r["saved"] is not None for r in rows)
    heads = [("Layer", _TH), ("Type", _TH), ("Input", _TH), ("Output", _TH), ("Parameters", _THR),
             ("FLOPs / sample", _THR)] + ([("Saved for backward / sample", _THR)] if saved else [])
    out = ['<table class="neurarch-layers" style="border-collapse: collapse; font-size: inherit;"><thead><tr>',
           "".join(f'<th style="{style}">{escape(label)}</th>' for label, style in heads), "</tr></thead><tbody>"]
    out.extend(_row_html(row, saved) for row in rows[:MAX_TABLE_ROWS])
    if len(rows) > MAX_TABLE_ROWS:
        out.append(f'<tr><td colspan="{len(heads)}" style="{_TD} {_MUTED}">and {len(rows) - MAX_TABLE_ROWS:,} more '
                   "layers (all of them are in the .neurarch.json)</td></tr>")
    out.append("</tbody>")
    out.append(_totals_html(totals(graph, rows), saved))
    out.append("</table>")
    return "".join(out)


def _card_html(card: str) -> str:
    return f'<pre class="neurarch-card" style="{_CARD}">{escape(card.rstrip(chr(10)))}</pre>'


def _link_html(url: str) -> str:
    u = escape(url)
    return (f'<div class="neurarch-link"><b>Share:</b> <a class="neurarch-share-link" href="{u}" target="_blank" '
            f'rel="noopener noreferrer" style="color: var(--jp-content-link-color, #1a73e8); '
            f'text-decoration: underline;">{u}</a></div>')


def _list_html(cls: str, style: str, title: str, items: list[str]) -> str:
    entries = "".join(f"<li>{escape(i)}</li>" for i in items)
    return f'<div class="{cls}" style="{style}"><b>{escape(title)}</b><ul style="margin: 2px 0;">{entries}</ul></div>'


def _issues_html(result: Any) -> str:
    if result.plan is None:
        return ""
    blockers, warnings = result.blockers, result.warnings
    if blockers:
        out = _list_html("neurarch-blockers", _ERROR, f"Blockers ({len(blockers)})", blockers)
    elif result.blocked:
        out = (f'<div class="neurarch-blockers" style="{_ERROR}"><b>Blocked:</b> '
               "the plan says the graph would not run</div>")
    else:
        out = '<div class="neurarch-blockers"><b>Blockers:</b> none</div>'
    if warnings:
        return out + _list_html("neurarch-warnings", _WARN, f"Warnings ({len(warnings)})", warnings)
    return out + '<div class="neurarch-warnings"><b>Warnings:</b> none</div>'


def _error_html(result: Any) -> str:
    out = ""
    if result.error:
        out += f'<div class="neurarch-error" style="{_ERROR}"><b>Plan failed:</b> {escape(result.error)}</div>'
        if result.traceback:
            out += (f'<details><summary style="{_MUTED}">traceback</summary>'
                    f'<pre style="{_CARD}">{escape(result.traceback)}</pre></details>')
    if result.share_error:
        out += (f'<div class="neurarch-share-error" style="{_WARN}"><b>No share link:</b> '
                f"{escape(result.share_error)}</div>")
    return out


def static_html(result: Any) -> str:
    """Everything the widget shows except the picture, as one script-free HTML fragment: the card,
    link, blockers and warnings once planned (else the summary), the measured training memory, the
    layer table (folded in a ``<details>``), where the graph was written and what was sent."""
    parts = [f'<div class="neurarch-result" style="{_BOX}">']
    if result.card is not None:
        parts.append(_card_html(result.card))
        if result.url:
            parts.append(_link_html(result.url))
        parts.append(_issues_html(result))
    else:
        parts.append(_summary_html(result))
    parts.append(_memory_html(result.graph))
    parts.append(_error_html(result))
    rows = layer_rows(result.graph)
    parts.append(f"<details><summary>Layers ({len(rows)})</summary>{table_html(result.graph, rows)}</details>")
    where = f"Graph written to <code>{escape(result.path)}</code>" if result.path else "Graph not saved"
    parts.append(f'<div style="{_MUTED}">{where}</div>')
    if result.card is None and not result.error:
        parts.append(f'<div style="{_MUTED}">Not planned: nothing was sent. Run <code>%neurarch ... --plan</code> '
                     "or call <code>.request_plan()</code>.</div>")
    parts.append("</div>")
    return "".join(parts)
