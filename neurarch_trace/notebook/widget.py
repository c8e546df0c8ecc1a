"""The notebook view of a :class:`~neurarch_trace.notebook.result.NeurarchResult`, in plain ipywidgets.

Only stock widgets (``HTML``, ``Button``, ``Checkbox``, ``Accordion``, ``HBox``/``VBox``) are used, so
the view renders wherever ipywidgets 8 does (JupyterLab, Notebook 7, VS Code, Colab) without a
front-end extension, and nbclient can save its state. Styles are inline and use JupyterLab's CSS
variables with fallbacks; nothing is loaded from a CDN. The one piece of browser code is the copy
button's ``onclick`` (clipboard API, with a ``document.execCommand("copy")`` fallback).

States the view shows (:meth:`NeurarchWidget.refresh`):

* no plan: a summary (name, layers, parameters, FLOPs, input and output shapes), the collapsible
  per-layer table, and a button whose label says what is sent and to which host;
* working: the button disabled and a spinner line naming the host, while a thread waits for the
  service (the kernel stays free);
* planned: the card exactly as the service rendered it, in monospace; the share link with a copy
  button; the plan's blockers and warnings, listed;
* failed: the plan service's failure as one line (the traceback only with ``--verbose``); the graph
  file is untouched and the button offers to try again.

:func:`static_html` renders the same facts as one HTML string with no script, for the result's
``_repr_html_`` (terminal-less fallbacks: nbconvert HTML, GitHub). This module imports ipywidgets
only when a :class:`NeurarchWidget` is built.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional

from neurarch_trace.notebook.result import MAX_TABLE_ROWS, _count, _flops, _plural, escape, shape_text

if TYPE_CHECKING:  # pragma: no cover
    from neurarch_trace.notebook.result import NeurarchResult

__all__ = ["NeurarchWidget", "static_html", "card_html", "table_html", "COPY_BUTTON_LABEL"]

COPY_BUTTON_LABEL = "Copy link"

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
    "white-space: pre; overflow-x: auto; width: fit-content; max-width: 100%; box-sizing: border-box; background: var(--jp-layout-color2, #f5f5f5); "
    "color: var(--jp-content-font-color1, inherit); border-radius: 3px;"
)
_TH = "text-align: left; padding: 2px 10px 2px 0; border-bottom: 1px solid var(--jp-border-color1, #bbb);"
_TD = "text-align: left; padding: 1px 10px 1px 0; border-bottom: 1px solid var(--jp-border-color3, #eee);"
_TDR = _TD.replace("text-align: left", "text-align: right")

# Copies data-url to the clipboard; execCommand fallback where the clipboard API is refused.
_COPY_JS = (
    "(function(b){var u=b.getAttribute('data-url');"
    "var say=function(t){b.textContent=t;setTimeout(function(){b.textContent='" + COPY_BUTTON_LABEL + "';},1500);};"
    "var old=function(){var t=document.createElement('textarea');t.value=u;t.style.position='fixed';"
    "t.style.opacity='0';document.body.appendChild(t);t.select();var ok=false;"
    "try{ok=document.execCommand('copy');}catch(e){}document.body.removeChild(t);"
    "say(ok?'Copied':'Select the link and copy it');};"
    "if(navigator.clipboard&&window.isSecureContext){navigator.clipboard.writeText(u)"
    ".then(function(){say('Copied');},old);}else{old();}})(this)"
)

_SPINNER = (
    '<svg width="14" height="14" viewBox="0 0 50 50" style="vertical-align: -2px; margin-right: 4px;" '
    'aria-hidden="true"><circle cx="25" cy="25" r="20" fill="none" stroke="currentColor" stroke-width="6" '
    'stroke-dasharray="80 200" stroke-linecap="round"><animateTransform attributeName="transform" '
    'type="rotate" from="0 25 25" to="360 25 25" dur="0.9s" repeatCount="indefinite"/></circle></svg>'
)


# ------------------------------------------------------------------------------- HTML pieces


def summary_html(result: "NeurarchResult") -> str:
    """Name, layers, parameters, FLOPs at the traced batch; inputs (as traced) and the output."""
    s = result.summary
    facts = [_plural(s["layers"], "layer"), f"{_count(s['params'])} params"]
    if s["flops"] is not None:
        facts.append(_flops(s["flops"]) + (f" at batch {s['batchSize']}" if s["batchSize"] is not None else ""))
    head = f'<div><b class="neurarch-name">{escape(result.name)}</b> &middot; {" &middot; ".join(escape(f) for f in facts)}</div>'
    shapes = [
        f"Input <code>{escape(i.get('name'))}</code> {escape(shape_text(i.get('shape')))} {escape(i.get('dtype', ''))}"
        for i in s["inputs"]
    ]
    if s["outputShape"] is not None:
        shapes.append(f"Output {escape(shape_text(s['outputShape']))} per sample")
    body = f'<div style="{_MUTED}">{" &middot; ".join(shapes)}</div>' if shapes else ""
    if s["uncountedOps"]:
        body += (
            f'<div style="{_MUTED}">FLOPs leave out {escape(", ".join(s["uncountedOps"][:5]))}'
            f'{" and more" if len(s["uncountedOps"]) > 5 else ""} (no formula)</div>'
        )
    return head + body


def table_html(result: "NeurarchResult") -> str:
    """The per-layer table: name, type, output shape (per sample), parameters owned."""
    rows = result.layer_rows()
    out = [
        '<table class="neurarch-layers" style="border-collapse: collapse; font-size: inherit;">',
        f'<thead><tr><th style="{_TH}">Layer</th><th style="{_TH}">Type</th>'
        f'<th style="{_TH}">Output shape (per sample)</th><th style="{_TH} text-align: right;">Parameters</th></tr></thead><tbody>',
    ]
    for row in rows[:MAX_TABLE_ROWS]:
        params = row["params"]
        if row["sharedWith"]:
            ptext = f"shared with {row['sharedWith']}"
        else:
            ptext = f"{params:,}" if isinstance(params, int) else "-"
        out.append(
            f'<tr><td style="{_TD}"><code>{escape(row["name"])}</code></td><td style="{_TD}">{escape(row["type"])}</td>'
            f'<td style="{_TD}">{escape(shape_text(row["outputShape"]))}</td><td style="{_TDR}">{escape(ptext)}</td></tr>'
        )
    if len(rows) > MAX_TABLE_ROWS:
        out.append(
            f'<tr><td colspan="4" style="{_TD} {_MUTED}">and {len(rows) - MAX_TABLE_ROWS:,} more layers '
            "(all of them are in the .neurarch.json)</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def card_html(card: str) -> str:
    """The card verbatim in a monospace block (escaped, never reflowed)."""
    return f'<pre class="neurarch-card" style="{_CARD}">{escape(card.rstrip(chr(10)))}</pre>'


def link_html(url: str, *, copy_button: bool) -> str:
    """The share link, clickable, with an optional copy button."""
    u = escape(url)
    text = (
        f'<b>Share:</b> <a class="neurarch-share-link" href="{u}" target="_blank" rel="noopener noreferrer" '
        f'style="color: var(--jp-content-link-color, #1a73e8); text-decoration: underline;">{u}</a>'
    )
    if copy_button:
        text += (
            f' <button type="button" class="jupyter-widgets jupyter-button widget-button neurarch-copy" '
            f'style="height: auto; padding: 0 8px; margin-left: 6px;" data-url="{u}" title="Copy the share link" '
            f'onclick="{escape(_COPY_JS)}">{COPY_BUTTON_LABEL}</button>'
        )
    return f'<div class="neurarch-link">{text}</div>'


def issues_html(result: "NeurarchResult") -> str:
    """The plan's blockers (red) and warnings (amber), each listed; empty before a plan."""
    if result.plan is None:
        return ""
    parts = []
    blockers, warnings = result.blockers, result.warnings
    if blockers:
        items = "".join(f"<li>{escape(b)}</li>" for b in blockers)
        parts.append(f'<div class="neurarch-blockers" style="{_ERROR}"><b>Blockers ({len(blockers)})</b><ul style="margin: 2px 0;">{items}</ul></div>')
    elif result.blocked:
        parts.append(f'<div class="neurarch-blockers" style="{_ERROR}"><b>Blocked:</b> the plan says the graph would not run</div>')
    else:
        parts.append('<div class="neurarch-blockers"><b>Blockers:</b> none</div>')
    if warnings:
        items = "".join(f"<li>{escape(w)}</li>" for w in warnings)
        parts.append(f'<div class="neurarch-warnings" style="{_WARN}"><b>Warnings ({len(warnings)})</b><ul style="margin: 2px 0;">{items}</ul></div>')
    else:
        parts.append('<div class="neurarch-warnings"><b>Warnings:</b> none</div>')
    return "".join(parts)


def error_html(result: "NeurarchResult") -> str:
    """The last failure as one line, plus the traceback (folded) when it was kept."""
    if not result.error and not result.share_error:
        return ""
    out = ""
    if result.error:
        out += f'<div class="neurarch-error" style="{_ERROR}"><b>Plan failed:</b> {escape(result.error)}</div>'
        if result.traceback:
            out += (
                f'<details><summary style="{_MUTED}">traceback</summary>'
                f'<pre style="{_CARD}">{escape(result.traceback)}</pre></details>'
            )
    if result.share_error:
        out += f'<div class="neurarch-share-error" style="{_WARN}"><b>No share link:</b> {escape(result.share_error)}</div>'
    return out


def path_html(result: "NeurarchResult") -> str:
    if result.path:
        return f'<div style="{_MUTED}">Graph written to <code>{escape(result.path)}</code></div>'
    return f'<div style="{_MUTED}">Graph not saved</div>'


def static_html(result: "NeurarchResult") -> str:
    """Everything the widget shows, as one script-free HTML fragment (collapsible table with
    ``<details>``), for front ends where widgets do not render."""
    parts = [f'<div class="neurarch-result" style="{_BOX}">']
    if result.card is not None:
        parts.append(card_html(result.card))
        if result.url:
            parts.append(link_html(result.url, copy_button=False))
        parts.append(issues_html(result))
    else:
        parts.append(summary_html(result))
    parts.append(error_html(result))
    n = len(result.layer_rows())
    parts.append(
        f'<details><summary>Layers ({n})</summary>{table_html(result)}</details>'
    )
    parts.append(path_html(result))
    if result.card is None and not result.error:
        parts.append(
            f'<div style="{_MUTED}">Not planned: nothing was sent. Run <code>%neurarch ... --plan</code> '
            "or call <code>.request_plan()</code>.</div>"
        )
    parts.append("</div>")
    return "".join(parts)


# ------------------------------------------------------------------------------------ widget


class NeurarchWidget:
    """The interactive view of one result. Holds an ipywidgets ``VBox`` in :attr:`box`; displaying
    this object displays the box.

    The plan button sends nothing until clicked; its label says what is sent and to which host,
    read from ``NEURARCH_API`` when the view is drawn and checked again at the click (if the
    service changed in between, the click only relabels the button). The request runs on a thread,
    so the kernel stays free; every outcome, failure included, ends the working state.
    """

    def __init__(self, result: "NeurarchResult") -> None:
        try:
            import ipywidgets as W
        except ImportError as exc:
            raise ImportError(
                "the neurarch widget needs ipywidgets: pip install 'neurarch-trace[notebook]' "
                "(the result's text and HTML displays work without it)"
            ) from exc

        self.result = result
        self._working = False
        self._thread: Optional[threading.Thread] = None
        self._label_host: Optional[str] = None
        self._note: Optional[str] = None
        self.header = W.HTML()
        self.card = W.HTML()
        self.link = W.HTML()
        self.issues = W.HTML()
        self.status = W.HTML()
        self.share_box = W.Checkbox(
            value=False,
            description="also make a public share link (anyone with the link can open it)",
            indent=False,
            layout=W.Layout(width="auto"),
        )
        self.button = W.Button(button_style="primary", icon="paper-plane", layout=W.Layout(width="auto"))
        self.button.add_class("neurarch-plan-button")
        self.controls = W.HBox([self.button, self.share_box], layout=W.Layout(align_items="center", flex_flow="row wrap"))
        n = len(result.layer_rows())
        self.table = W.Accordion(children=[W.HTML(table_html(result))], selected_index=None)
        self.table.set_title(0, f"Layers ({n})")
        self.footer = W.HTML()
        for part in (self.header, self.card, self.link, self.issues, self.status, self.footer):
            part.layout.margin = "0"
        self.box = W.VBox(
            [self.header, self.card, self.link, self.issues, self.status, self.controls, self.table, self.footer],
            layout=W.Layout(width="100%"),
        )
        self.box.add_class("neurarch-widget")
        self.button.on_click(self._clicked)
        self.share_box.observe(lambda _change: self.refresh(), names="value")
        self.refresh()

    # ------------------------------------------------------------------------------ display

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        return self.box._repr_mimebundle_(**kwargs)

    # ------------------------------------------------------------------------------- state

    @property
    def working(self) -> bool:
        """True while a plan request is in flight."""
        return self._working

    def _sharing(self) -> bool:
        """Whether a click asks for a share link: the checkbox, or always once a card is shown
        (the button is then only offered for the missing link)."""
        return bool(self.share_box.value) or self.result.card is not None

    def button_label(self, host: Optional[str] = None) -> str:
        """What a click sends and where, short enough for one button: ``Get the plan: send the
        graph (68 layers, no weights) to HOST``; the tooltip carries the full notice."""
        host = host or self.result.service_host()
        n = self.result.summary["layers"]
        what = f"the graph ({_plural(n, 'layer')}, no weights)"
        if self.result.base is not None:
            what = f"the graphs ({_plural(n, 'layer')} and the base, no weights)"
        if self.result.card is not None:
            return f"Get a public share link: send {what} to {host}"
        if self.share_box.value:
            return f"Get the plan and a public link: send {what} to {host}"
        return f"Get the plan: send {what} to {host}"

    def refresh(self) -> None:
        """Redraw every part from the result's state (safe to call from the worker thread)."""
        r = self.result
        planned = r.card is not None
        self.header.value = "" if planned else f'<div style="{_BOX}">{summary_html(r)}</div>'
        self.card.value = card_html(r.card) if planned else ""
        self.link.value = f'<div style="{_BOX}">{link_html(r.url, copy_button=True)}</div>' if r.url else ""
        self.issues.value = f'<div style="{_BOX}">{issues_html(r)}</div>' if planned else ""
        self.footer.value = f'<div style="{_BOX}">{path_html(r)}</div>'
        for part in (self.header, self.card, self.link, self.issues):
            part.layout.display = None if part.value else "none"
        host = r.service_host()
        self._label_host = host
        if self._working:
            self.status.value = (
                f'<div class="neurarch-working" style="{_BOX}">{_SPINNER}Working: sending '
                f'{escape(r.what_is_sent())} to {escape(host)} and waiting for the plan&hellip;</div>'
            )
            self.button.description = "Working..."
            self.button.icon = "hourglass-half"
            self.button.disabled = True
            self.share_box.disabled = True
        else:
            note = f'<div style="{_MUTED}">{escape(self._note)}</div>' if self._note else ""
            self.status.value = f'<div style="{_BOX}">{error_html(r)}{note}</div>' if (r.error or r.share_error or note) else ""
            label = self.button_label(host)
            self.button.description = label
            self.button.tooltip = r.send_notice(self._sharing())
            self.button.icon = "paper-plane"
            self.button.disabled = False
            self.share_box.disabled = False
        self.status.layout.display = None if self.status.value else "none"
        # Planned and shared: nothing left to ask for. Planned without a link: offer the link.
        self.controls.layout.display = "none" if (planned and r.url) else None
        self.share_box.layout.display = "none" if planned else None

    # ------------------------------------------------------------------------------ actions

    def _clicked(self, _button: Any = None) -> None:
        if self._working:
            return
        host = self.result.service_host()
        if host != self._label_host:
            self._note = f"The plan service is now {host} (NEURARCH_API changed); click again to send there."
            self.refresh()
            return
        self._note = None
        share = self._sharing()
        self._working = True
        self.refresh()
        self._thread = threading.Thread(target=self._work, args=(share,), name="neurarch-plan", daemon=True)
        self._thread.start()

    def _work(self, share: bool) -> None:
        try:
            self.result.request_plan(share=share)
        except BaseException as exc:  # noqa: BLE001 - the view must never stay "working"
            self.result.error = f"internal error: {type(exc).__name__}: {exc}"
        finally:
            self._working = False
            self.refresh()

    def click(self, share: Optional[bool] = None) -> None:
        """Press the plan button from code (``share`` sets the checkbox first)."""
        if share is not None and self.result.card is None:
            self.share_box.value = bool(share)
        self.button.click()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for a request in flight; True when none is left running."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self._working
