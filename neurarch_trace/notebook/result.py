"""What ``%neurarch`` returns: the traced graph, where it was written, and the plan when one was asked.

    >>> r = %neurarch model --input 1,3,32,32          # in a notebook
    >>> r.graph["measured"]["params"], r.path           # the .neurarch.json dict and its file
    >>> r.request_plan(share=True)                      # explicit: sends the graph, fills r.card, r.url
    >>> print(r)                                        # the card and the share link, as plain text

Display: in a kernel with a widget front end (JupyterLab, Notebook 7, VS Code, Colab) the object shows
as the widget of :mod:`neurarch_trace.notebook.widget`; the same display bundle also carries
``text/plain`` and ``text/html`` renderings of the same facts, which is what a terminal IPython,
nbconvert HTML without widget state, or a notebook viewed on GitHub shows instead.

Privacy: nothing is sent unless :meth:`NeurarchResult.request_plan` is called (by ``--plan``/``--share``,
by the widget's button, or by the user). :meth:`NeurarchResult.send_notice` is the sentence naming
what is sent and where, shown before anything leaves the machine.

This module imports neither IPython nor ipywidgets nor torch at import time.
"""

from __future__ import annotations

import html
import threading
import traceback
from typing import Any, Optional

from neurarch_trace.contract import graph_summary
from neurarch_trace.errors import NeurarchError

__all__ = ["NeurarchResult", "layer_rows", "shape_text", "widget_frontend"]

#: Rows of the per-layer table shown at most (widget and HTML); the rest is counted in a last line.
MAX_TABLE_ROWS = 1000

_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def shape_text(shape: Any) -> str:
    """``[3, 224, 224]`` -> ``3x224x224`` (the card's way of writing shapes); ``-`` for none."""
    if not isinstance(shape, (list, tuple)) or not shape:
        return "-" if not isinstance(shape, (list, tuple)) else "scalar"
    return "x".join(str(d) for d in shape)


def _count(value: Any) -> str:
    from neurarch_trace.text import count

    return count(value) if isinstance(value, (int, float)) else "?"


def _flops(value: Any) -> str:
    from neurarch_trace.text import flops

    return flops(value) if isinstance(value, (int, float)) else "? FLOPs"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def layer_rows(graph: dict) -> list[dict[str, Any]]:
    """One row per layer (components other than inputs and outputs), in graph order:
    ``{"name", "type", "outputShape", "params", "sharedWith"}``; ``outputShape`` is batchless,
    ``params`` the learnable parameters the call owns (None when not measured)."""
    names = {c.get("id"): c.get("name") for c in graph.get("components", [])}
    rows = []
    for comp in graph.get("components", []):
        if comp.get("type") in ("input", "output"):
            continue
        measured = comp.get("measured") or {}
        shared = measured.get("sharedWith")
        rows.append({
            "name": comp.get("name", comp.get("id")),
            "type": comp.get("type", "?"),
            "outputShape": comp.get("outputShape"),
            "params": measured.get("params"),
            "sharedWith": names.get(shared, shared) if shared else None,
        })
    return rows


def widget_frontend() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Notebook 7, VS Code, Colab, nbclient), where a
    widget view can be sent; False in a terminal IPython, a plain ``InteractiveShell`` or Python."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class NeurarchResult:
    """A traced graph, where it was written, and the plan when one came back.

    Attributes:
        graph: the ``.neurarch.json`` graph (dict).
        path: where the graph was written, or None when not saved.
        card: the card text exactly as the plan service rendered it, or None before a plan.
        url: the public share link, or None.
        plan: the machine-readable plan (``plan.run.blockers``, ``plan.warnings``, ...), or None.
        error: one line saying why the last plan request failed, or None.
        share_error: why no share link came back although one was asked, or None.
        traceback: the failure's traceback text, kept only when ``verbose``.
        source: the ``source`` block sent with a plan request (target as typed, inputs).
        base: a second graph the plan compares with (``--base``), or None.
        verbose: keep and show tracebacks of failures.
    """

    def __init__(
        self,
        graph: dict,
        *,
        path: Optional[str] = None,
        source: Optional[dict] = None,
        base: Optional[dict] = None,
        verbose: bool = False,
    ) -> None:
        self.graph = graph
        self.path = path
        self.source = source
        self.base = base
        self.verbose = verbose
        self.card: Optional[str] = None
        self.url: Optional[str] = None
        self.plan: Optional[dict] = None
        self.error: Optional[str] = None
        self.share_error: Optional[str] = None
        self.traceback: Optional[str] = None
        self.response: Any = None
        self._widget: Any = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ facts

    @property
    def name(self) -> str:
        return str(self.graph.get("name") or "model")

    @property
    def summary(self) -> dict[str, Any]:
        """:func:`neurarch_trace.graph.graph_summary` plus ``inputs`` (name, shape with batch,
        dtype, as traced) from the graph's ``measured`` block."""
        facts = graph_summary(self.graph)
        measured = self.graph.get("measured") or {}
        facts["inputs"] = list(measured.get("inputs") or [])
        facts["uncountedOps"] = list(measured.get("uncountedOps") or [])
        return facts

    @property
    def blockers(self) -> list[str]:
        """``plan.run.blockers`` (empty before a plan or when none)."""
        run = (self.plan or {}).get("run")
        found = run.get("blockers") if isinstance(run, dict) else None
        return [str(b) for b in found] if isinstance(found, list) else []

    @property
    def warnings(self) -> list[str]:
        """``plan.warnings`` (empty before a plan or when none)."""
        found = (self.plan or {}).get("warnings")
        return [str(w) for w in found] if isinstance(found, list) else []

    @property
    def blocked(self) -> Optional[bool]:
        """True when the plan reports a blocker, False when it reports none, None before a plan."""
        if self.plan is None:
            return None
        run = self.plan.get("run")
        if isinstance(run, dict) and run.get("legal") is False:
            return True
        return bool(self.blockers)

    def layer_rows(self) -> list[dict[str, Any]]:
        """See :func:`layer_rows`."""
        return layer_rows(self.graph)

    # ---------------------------------------------------------------------------- privacy

    def what_is_sent(self) -> str:
        """``the graph (68 layers; shapes and hyperparameters, no weights)`` (+ the base graph)."""
        what = f"the graph ({_plural(self.summary['layers'], 'layer')}; shapes and hyperparameters, no weights)"
        if self.base is not None:
            what += f" and the base graph ({_plural(graph_summary(self.base)['layers'], 'layer')})"
        return what

    @staticmethod
    def service_host() -> str:
        """``host[:port]`` of the plan service a request would go to now (``NEURARCH_API``)."""
        from neurarch_trace.plan_client import api_host

        return api_host()

    def send_notice(self, share: bool) -> str:
        """The sentence printed before anything is sent: what, where, and what ``share`` means."""
        purpose = (
            "for the plan and a public share link (anyone with the link can open it)"
            if share else "for the plan; nothing is stored (add --share for a public link)"
        )
        return f"Sending {self.what_is_sent()} to {self.service_host()} {purpose}."

    # ---------------------------------------------------------------------------- planning

    def request_plan(self, share: bool = False, *, api: Optional[str] = None) -> "NeurarchResult":
        """Send the graph to the plan service (``NEURARCH_API``, default www.neurarch.com) and keep
        the answer in ``card``, ``url``, ``plan``, ``share_error``.

        Calling this is the consent: it sends :meth:`what_is_sent`, and with ``share`` the service
        stores the graph and card at a public, unguessable URL. A failure never raises: ``error``
        holds one line saying what happened (the graph file stays where it is), and ``traceback``
        the details when ``verbose``. Returns ``self``. Safe to call from a thread.
        """
        from neurarch_trace.plan_client import request_plan

        with self._lock:
            self.error = None
            self.traceback = None
            try:
                answer = request_plan(self.graph, share=share, base=self.base, source=self.source, api=api)
            except NeurarchError as err:
                self._fail(str(err), err)
                return self
            except Exception as err:  # noqa: BLE001 - a fault of ours still ends as one line
                self._fail(f"internal error: {type(err).__name__}: {err} (run again with --verbose and report it)", err)
                return self
            self.response = answer
            self.card = answer.text
            self.plan = answer.plan
            self.url = answer.url
            self.share_error = answer.share_error if share else None
            return self

    def _fail(self, line: str, err: BaseException) -> None:
        still = f"; the graph is still at {self.path}" if self.path else ""
        self.error = f"{line}{still}"
        if self.verbose:
            self.traceback = "".join(traceback.format_exception(type(err), err, err.__traceback__))

    # ---------------------------------------------------------------------------- display

    @property
    def widget(self) -> Any:
        """The ipywidgets view of this result (built once; needs ipywidgets)."""
        if self._widget is None:
            from neurarch_trace.notebook.widget import NeurarchWidget

            self._widget = NeurarchWidget(self)
        return self._widget

    def summary_lines(self) -> list[str]:
        """The summary as plain-text lines: name, counts, inputs, output."""
        s = self.summary
        head = f"{self.name}: {_plural(s['layers'], 'layer')}, {_count(s['params'])} params"
        if s["flops"] is not None:
            head += f", {_flops(s['flops'])}"
            if s["batchSize"] is not None:
                head += f" at batch {s['batchSize']}"
        lines = [head]
        for item in s["inputs"]:
            lines.append(f"  input  {item.get('name')} {shape_text(item.get('shape'))} {item.get('dtype', '')}".rstrip())
        if s["outputShape"] is not None:
            lines.append(f"  output {shape_text(s['outputShape'])} per sample")
        return lines

    def __str__(self) -> str:
        lines: list[str] = []
        if self.card is not None:
            lines.append(self.card.rstrip("\n"))
            if self.url:
                lines.append(f"Share: {self.url}")
        else:
            lines.extend(self.summary_lines())
        if self.share_error:
            lines.append(f"No share link: {self.share_error}")
        if self.error:
            lines.append(f"Plan failed: {self.error}")
            if self.traceback:
                lines.append(self.traceback.rstrip("\n"))
        lines.append(f"Graph: {self.path}" if self.path else "Graph: not saved")
        if self.card is None and not self.error:
            lines.append("Not planned: nothing was sent. Call .request_plan() or pass --plan / --share.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"<NeurarchResult {self.name}: {_plural(s['layers'], 'layer')}, path={self.path!r}, "
            f"card={'yes' if self.card is not None else 'no'}, url={self.url!r}>"
        )

    def _repr_html_(self) -> str:
        """A static HTML rendering (no script, no external resource): the card and the link when
        planned, else the summary and the per-layer table."""
        from neurarch_trace.notebook import widget as _w  # pure-HTML helpers; imports no ipywidgets

        return _w.static_html(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        data = {"text/plain": str(self), "text/html": self._repr_html_()}
        if widget_frontend():
            try:
                view = self.widget._repr_mimebundle_()
            except Exception:  # noqa: BLE001 - no widget: the text and HTML above still show
                view = None
            if view and _WIDGET_VIEW in view:
                data[_WIDGET_VIEW] = view[_WIDGET_VIEW]
        return data


def escape(text: Any) -> str:
    return html.escape(str(text), quote=True)
