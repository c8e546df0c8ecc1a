"""The notebook view of a result, an anywidget: one ES module front end (``extension/``, built into
``neurarch_trace/static/neurarch-widget.js``), so it renders in JupyterLab, Notebook 7, VS Code and
Colab with no lab extension to install, and nothing is loaded from a CDN.

The contract with the front end is the synced traits below plus two custom messages:

* ``{"type": "ready"}`` from the front end's ``initialize``: a widget manager here runs our module.
  Until then the result is displayed as its text and HTML fallback only (with a display id); on the
  first ``ready`` every such display is updated to carry the widget view too, and later results
  show the widget view at once. So a kernel with no widget front end (nbclient executing a
  notebook, a front end whose scripts are blocked) leaves outputs that nbconvert and GitHub render
  as the card, link and table, never an empty widget box.
* ``{"type": "plan", "id", "share", "host"}`` from the plan button. It is always answered with
  ``{"type": "answer", "id", "ok", "error", "reported"}`` carrying the same id (quak's pattern), also
  when the request fails or is refused, so the page never waits forever; ``reported`` says the
  outcome is also in the traits (``error``, ``note``). The request runs on a thread, so the kernel
  stays free. If ``NEURARCH_API`` changed since the button was drawn (``host`` differs), nothing is
  sent: the button is relabelled and ``note`` says so.

Traits: ``graph`` (the graph, without the fields the view does not read), ``card``, ``url``,
``planned``, ``blockers``, ``warnings``, ``blocked``, ``error``, ``share_error``, ``traceback``,
``path``, ``host``, ``labels`` and ``notices`` (the button's words; :func:`~neurarch_trace.notebook.render.labels`),
``working``, ``note``, ``text`` (the plain-text rendering, shown if the view fails to draw).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anywidget
import traitlets as t

from neurarch_trace.notebook.render import labels, result_text, static_html

__all__ = ["BUNDLE", "NeurarchWidget", "front_end_seen", "trim_graph"]

#: The built front end (``npm run build`` in ``extension/``), shipped as package data.
BUNDLE = Path(__file__).resolve().parent.parent / "static" / "neurarch-widget.js"

_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# Component fields the view reads; the rest (positions, input/output id lists) stays out of the
# synced state, which nbclient and JupyterLab may save into the notebook.
_KEEP = ("id", "name", "type", "scope", "params", "inputShape", "outputShape")
_KEEP_MEASURED = ("params", "flops", "sharedWith", "inputShapes", "savedBytes", "uncounted", "dtype")

_state = {"front_end_seen": False}


def front_end_seen() -> bool:
    """Whether a front end in this kernel has run the widget module (sent ``ready``)."""
    return _state["front_end_seen"]


def trim_graph(graph: dict) -> dict:
    """The graph with only what the view reads: ``name``, ``measured`` and, per component,
    :data:`_KEEP` and the ``measured`` fields in :data:`_KEEP_MEASURED`; connections as
    ``{"from", "to"}``. A valid document for the front end's reader (``extension/src/graph.js``)."""
    components = []
    for comp in graph.get("components", []):
        slim = {k: comp[k] for k in _KEEP if k in comp}
        measured = comp.get("measured") or {}
        slim["measured"] = {k: measured[k] for k in _KEEP_MEASURED if k in measured}
        components.append(slim)
    connections = [{"from": c.get("from"), "to": c.get("to")} for c in graph.get("connections", [])]
    return {"name": graph.get("name"), "measured": graph.get("measured") or {}, "components": components,
            "connections": connections}


class NeurarchWidget(anywidget.AnyWidget):
    """The interactive view of one :class:`~neurarch_trace.notebook.result.NeurarchResult`.

    Nothing is sent until the plan button is clicked (or :meth:`click` is called); the button's
    label names what is sent and the host (``NEURARCH_API``), read when the view is drawn and
    checked again at the click. Every outcome, failure included, ends the working state.
    """

    _esm = BUNDLE

    graph = t.Dict().tag(sync=True)
    card = t.Unicode(None, allow_none=True).tag(sync=True)
    url = t.Unicode(None, allow_none=True).tag(sync=True)
    planned = t.Bool(False).tag(sync=True)
    blockers = t.List().tag(sync=True)
    warnings = t.List().tag(sync=True)
    blocked = t.Bool(None, allow_none=True).tag(sync=True)
    error = t.Unicode(None, allow_none=True).tag(sync=True)
    share_error = t.Unicode(None, allow_none=True).tag(sync=True)
    traceback = t.Unicode(None, allow_none=True).tag(sync=True)
    path = t.Unicode(None, allow_none=True).tag(sync=True)
    host = t.Unicode("").tag(sync=True)
    labels = t.Dict().tag(sync=True)
    notices = t.Dict().tag(sync=True)
    working = t.Bool(False).tag(sync=True)
    note = t.Unicode(None, allow_none=True).tag(sync=True)
    text = t.Unicode("").tag(sync=True)

    def __init__(self, result: Any, **kwargs: Any) -> None:
        super().__init__(graph=trim_graph(result.graph), **kwargs)
        self.result = result
        self._thread: threading.Thread | None = None
        self._handles: list[Any] = []
        self._promoted = False
        self.on_msg(self._on_message)
        self.refresh()

    # ---------------------------------------------------------------------------- display

    def bundle(self, view: bool) -> tuple[dict, dict]:
        """``(data, metadata)``: the result's text and HTML, plus the widget view when ``view``."""
        data = {"text/plain": result_text(self.result), "text/html": static_html(self.result)}
        metadata: dict = {}
        if view:
            widget_data, widget_metadata = super()._repr_mimebundle_()
            data[_WIDGET_VIEW] = widget_data[_WIDGET_VIEW]
            metadata = widget_metadata or {}
        return data, metadata

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict, dict]:
        return self.bundle(view=True)

    def show(self) -> None:
        """Display the result: with the widget view when a front end here runs the widget, else its
        text and HTML under a display id that :meth:`_promote` updates once one does."""
        from IPython.display import display

        if front_end_seen():
            data, metadata = self.bundle(view=True)
            display(data, raw=True, metadata=metadata)
            return
        data, metadata = self.bundle(view=False)
        handle = display(data, raw=True, metadata=metadata, display_id=True)
        if handle is not None:
            self._handles.append(handle)

    def _promote(self) -> None:
        self._promoted = True
        self._update_displays()

    def _update_displays(self) -> None:
        """Re-send every display of this result made before the front end was known (and after a
        plan, so a saved notebook's fallback shows the card too)."""
        if not self._handles:
            return
        data, metadata = self.bundle(view=self._promoted)
        for handle in self._handles:
            handle.update(data, raw=True, metadata=metadata)

    # ------------------------------------------------------------------------------ state

    def _sharing(self, share: bool) -> bool:
        """A click asks for a share link when the box is ticked, and always once a card is shown
        (the button then only offers the missing link)."""
        return bool(share) or self.result.card is not None

    def button_label(self, share: bool = False, host: str | None = None) -> str:
        """The button's words for the current state (see :func:`~neurarch_trace.notebook.render.labels`)."""
        words = labels(self.result, host or self.result.service_host())
        if self.result.card is not None:
            return words["link"]
        return words["share"] if share else words["plan"]

    def refresh(self) -> None:
        """Copy the result's state into the traits (safe to call from the worker thread)."""
        r = self.result
        host = r.service_host()
        with self.hold_sync():
            self.card = r.card
            self.url = r.url
            self.planned = r.plan is not None or r.card is not None
            self.blockers = r.blockers
            self.warnings = r.warnings
            self.blocked = r.blocked
            self.error = r.error
            self.share_error = r.share_error
            self.traceback = r.traceback
            self.path = r.path
            self.host = host
            self.labels = labels(r, host)
            self.notices = {"plan": r.send_notice(False), "share": r.send_notice(True)}
            self.text = result_text(r)

    # ---------------------------------------------------------------------------- messages

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        if content.get("type") == "ready":
            _state["front_end_seen"] = True
            if not self._promoted:
                self._promote()
        elif content.get("type") == "plan":
            self._plan_request(content)

    def _answer(self, request_id: Any, ok: bool, error: str | None = None, reported: bool = True) -> None:
        self.send({"type": "answer", "id": request_id, "ok": ok, "error": error, "reported": reported})

    def _plan_request(self, content: dict) -> None:
        request_id = content.get("id")
        if self.working:
            self._answer(request_id, False, "a plan request is already running", reported=False)
            return
        host = self.result.service_host()
        shown = content.get("host")
        if shown and shown != host:
            self.note = f"The plan service is now {host} (NEURARCH_API changed); click again to send there."
            self.refresh()
            self._answer(request_id, False, self.note)
            return
        self.note = None
        self.working = True
        share = self._sharing(bool(content.get("share")))
        self._thread = threading.Thread(target=self._work, args=(share, request_id), name="neurarch-plan", daemon=True)
        self._thread.start()

    def _work(self, share: bool, request_id: Any) -> None:
        try:
            self.result.request_plan(share=share)
        except BaseException as exc:  # noqa: BLE001 - the view must never stay "working"
            self.result.error = f"internal error: {type(exc).__name__}: {exc}"
        finally:
            self.working = False
            self.refresh()
            self._update_displays()
            self._answer(request_id, self.result.error is None, self.result.error)

    # ------------------------------------------------------------------------ from Python

    def click(self, share: bool | None = None) -> None:
        """Press the plan button from code, as the front end would (``share``: tick the box)."""
        self._plan_request({"type": "plan", "id": "python", "share": bool(share), "host": self.host})

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a request in flight; True when none is left running."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.working
