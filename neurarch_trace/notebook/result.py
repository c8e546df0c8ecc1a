"""What ``%neurarch`` returns: the traced graph, where it was written, and the plan when one was asked.

    >>> r = %neurarch model --input 1,3,32,32          # in a notebook
    >>> r.graph["measured"]["params"], r.path           # the .neurarch.json dict and its file
    >>> r.request_plan(share=True)                      # explicit: sends the graph, fills r.card, r.url
    >>> r.request_plan(gpu="H100x8", finetune="lora")   # the command line's plan options, by name
    >>> print(r)                                        # the card and the share link, as plain text

Display: in a Jupyter kernel (JupyterLab, Notebook 7, VS Code, Colab) the object shows as the
widget of :mod:`neurarch_trace.notebook.widget`: first as its text and HTML (from
:mod:`neurarch_trace.notebook.render`), then, once the front end shows it runs the widget, with the
widget view beside them. Where no front end runs it (a terminal IPython, nbclient, nbconvert HTML
with or without saved widget state, a notebook viewed on GitHub, blocked scripts) the text and HTML
are what shows: the card, the link and the layer table.

Privacy: nothing is sent unless :meth:`NeurarchResult.request_plan` is called (by ``--plan``/``--share``,
by the widget's button, or by the user). :meth:`NeurarchResult.send_notice` is the sentence naming
what is sent and where, shown before anything leaves the machine.

This module imports neither IPython, anywidget, ipywidgets nor torch at import time, nor the planner.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

from neurarch_trace.contract import graph_summary
from neurarch_trace.errors import NeurarchError
from neurarch_trace.notebook.render import layer_rows, result_text, static_html, summary_lines
from neurarch_trace.text import install_hint, plural

__all__ = ["NeurarchResult", "SIZING_OPTIONS", "layer_rows", "widget_frontend"]

#: The plan's sizing options, as :meth:`NeurarchResult.request_plan` takes them (the command line's
#: ``--seq-len``, ``--attention``, ``--finetune``, ``--context``, ``--gpu``, ``--usd-per-hour``).
SIZING_OPTIONS = ("seq_len", "attention", "finetune", "context", "gpu", "usd_per_hour")


class _Unchanged:
    """The default of :meth:`NeurarchResult.request_plan`'s sizing options: keep the current value."""

    def __repr__(self) -> str:
        return "<unchanged>"


_UNCHANGED: Any = _Unchanged()

def widget_frontend() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Notebook 7, VS Code, Colab, nbclient) with anywidget
    installed, where a widget can be built; False in a terminal IPython, a plain
    ``InteractiveShell`` or Python."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    try:
        import anywidget  # noqa: F401
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
        plan_options: the sizing options a plan sends (:data:`SIZING_OPTIONS`, None where not
            set): those of the magic line, then those of the last :meth:`request_plan`; the
            widget's plan button sends them too.
        verbose: keep and show tracebacks of failures.
    """

    def __init__(
        self,
        graph: dict,
        *,
        path: str | None = None,
        source: dict | None = None,
        base: dict | None = None,
        plan_options: dict | None = None,
        verbose: bool = False,
    ) -> None:
        self.graph = graph
        self.path = path
        self.source = source
        self.base = base
        self.plan_options = {name: None for name in SIZING_OPTIONS}
        if plan_options:
            self.plan_options = _sizing(self.plan_options, plan_options)
        self.verbose = verbose
        self.card: str | None = None
        self.url: str | None = None
        self.plan: dict | None = None
        self.error: str | None = None
        self.share_error: str | None = None
        self.traceback: str | None = None
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
    def blocked(self) -> bool | None:
        """True when the plan reports a blocker, False when it reports none, None before a plan
        (:func:`neurarch_trace.plan_client.plan_blocked`, the verdict ``plan-api.md`` defines)."""
        from neurarch_trace.plan_client import plan_blocked

        return plan_blocked(self.plan)

    def layer_rows(self) -> list[dict[str, Any]]:
        """See :func:`layer_rows`."""
        return layer_rows(self.graph)

    # ---------------------------------------------------------------------------- privacy

    def what_is_sent(self) -> str:
        """``the graph (68 layers; shapes and hyperparameters, no weights)`` (+ the base graph)."""
        from neurarch_trace.plan_options import what_is_sent

        return what_is_sent(self.graph, self.base, detail="; shapes and hyperparameters, no weights")

    @staticmethod
    def service_host() -> str:
        """``host[:port]`` of the plan service a request would go to now (``NEURARCH_API``)."""
        from neurarch_trace.plan_client import api_host

        return api_host()

    def send_notice(self, share: bool) -> str:
        """The sentence printed before anything is sent: what, where, and what ``share`` means
        (:func:`neurarch_trace.plan_options.consent_notice`, shared with the command line)."""
        from neurarch_trace.plan_options import consent_notice

        return consent_notice(self.graph, self.base, share=share, host=self.service_host(), notebook=True)

    # ---------------------------------------------------------------------------- planning

    def request_plan(
        self,
        share: bool = False,
        *,
        seq_len: int | None = _UNCHANGED,
        attention: str | None = _UNCHANGED,
        finetune: str | None = _UNCHANGED,
        context: int | None = _UNCHANGED,
        gpu: str | None = _UNCHANGED,
        usd_per_hour: float | None = _UNCHANGED,
        api: str | None = None,
    ) -> NeurarchResult:
        """Send the graph to the plan service (``NEURARCH_API``, default www.neurarch.com) and keep
        the answer in ``card``, ``url``, ``plan``, ``share_error``.

        The sizing options are the command line's plan options by their Python names (``seq_len``
        for ``--seq-len N`` tokens, ``attention`` ``sdpa``/``flash``/``eager``, ``finetune``
        ``full``/``lora``/``qlora``, ``context`` tokens, ``gpu`` such as ``"H100x8"``,
        ``usd_per_hour`` dollars per GPU-hour of ``gpu``). One not given keeps its value in
        ``plan_options`` (the magic line's, or the last call's); ``None`` drops it (the
        service's default). The values used are kept in ``plan_options``, for the next call and
        the widget's button.

        Calling this is the consent: it sends :meth:`what_is_sent`, and with ``share`` the service
        stores the graph and card at a public, unguessable URL. A failure of the plan never raises:
        ``error`` holds one line saying what happened (the graph file stays where it is), and
        ``traceback`` the details when ``verbose``. Returns ``self``. Safe to call from a thread.

        Raises:
            ValueError: a sizing option out of range (``seq_len=0``, ``finetune="half"``, ...), or
                ``usd_per_hour`` without ``gpu``; nothing is sent and ``plan_options`` is unchanged.
        """
        given = {"seq_len": seq_len, "attention": attention, "finetune": finetune, "context": context,
                 "gpu": gpu, "usd_per_hour": usd_per_hour}
        options = _sizing(self.plan_options, given)
        with self._lock:
            self.plan_options = options
            self.error = None
            self.traceback = None
            try:
                answer = self._send(share, options, api)
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

    def _send(self, share: bool, options: dict, api: str | None) -> Any:
        from neurarch_trace.plan_client import request_plan

        return request_plan(self.graph, share=share, base=self.base, source=self.source, api=api, **options)

    def _fail(self, line: str, err: BaseException) -> None:
        still = f"; the graph is still at {self.path}" if self.path else ""
        self.error = f"{line}{still}"
        if self.verbose:
            self.traceback = "".join(traceback.format_exception(type(err), err, err.__traceback__))

    # ---------------------------------------------------------------------------- display

    @property
    def widget(self) -> Any:
        """The anywidget view of this result (built once; needs ``anywidget``)."""
        if self._widget is None:
            try:
                from neurarch_trace.notebook.widget import NeurarchWidget
            except ImportError as exc:
                raise ImportError(
                    f"the neurarch widget needs anywidget: {install_hint('anywidget', 'notebook')} "
                    "(the result's text and HTML displays work without it)"
                ) from exc
            self._widget = NeurarchWidget(self)
        return self._widget

    def summary_lines(self) -> list[str]:
        """The summary as plain-text lines: name, counts, inputs, output."""
        return summary_lines(self)

    def __str__(self) -> str:
        return result_text(self)

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"<NeurarchResult {self.name}: {plural(s['layers'], 'layer')}, path={self.path!r}, "
            f"card={'yes' if self.card is not None else 'no'}, url={self.url!r}>"
        )

    def _repr_html_(self) -> str:
        """A static HTML rendering (no script, no external resource): the card and the link when
        planned, else the summary; the measured memory and the layer table."""
        return static_html(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        """``text/plain`` and ``text/html``, plus the widget view once a front end in this kernel has
        shown it runs the widget (see :mod:`neurarch_trace.notebook.widget`)."""
        data = {"text/plain": str(self), "text/html": self._repr_html_()}
        if widget_frontend():
            from neurarch_trace.notebook.widget import front_end_seen

            if front_end_seen():
                data.update(self.widget.bundle(view=True)[0])
        return data

    def _ipython_display_(self) -> None:
        """In a kernel, the widget's display (fallback first, the view once the front end runs it);
        elsewhere the text and HTML."""
        from IPython.display import display

        if widget_frontend():
            try:
                self.widget.show()
                return
            except Exception:  # noqa: BLE001 - no widget: the text and HTML still show
                pass
        display({"text/plain": str(self), "text/html": self._repr_html_()}, raw=True)


def _sizing(current: dict, given: dict) -> dict:
    """``current`` with the ``given`` sizing options that are not :data:`_UNCHANGED`, checked as
    the plan client checks them (:func:`~neurarch_trace.plan_client.check_plan_options`).

    Raises:
        ValueError: an unknown option, a value out of range, or ``usd_per_hour`` without ``gpu``.
    """
    from neurarch_trace.plan_client import check_plan_options

    unknown = sorted(set(given) - set(SIZING_OPTIONS))
    if unknown:
        raise ValueError(f"unknown plan option {unknown[0]!r}: use {', '.join(SIZING_OPTIONS)}")
    merged = {**current, **{k: v for k, v in given.items() if v is not _UNCHANGED}}
    check_plan_options(merged)
    if merged["usd_per_hour"] is not None and merged["gpu"] is None:
        raise ValueError("usd_per_hour needs gpu: it prices the card named there")
    return merged
