"""Rendering: the plan (pure data) as the plain-text card of ``shared/spec/plan-api.md``.

At most :data:`WIDTH` (68) columns, boxed with ``+``, ``-`` and ``|``; a header box (name and
target, then layers, parameters and FLOPs), a box of labelled rows (Runs, GPU fit, Training cost,
Blockers, Warnings) and, with a base, a diff box. A value longer than its column wraps onto
continuation rows under the value column. Every number shown is read from the plan.
"""

from __future__ import annotations

import textwrap
from typing import Any, List, Mapping, Optional

from neurarch_trace.planner import units

__all__ = ["INNER", "LABEL", "WIDTH", "render"]

#: Card width in columns, borders included (the spec: "at most 68 columns wide").
WIDTH = 68
#: Columns between ``"| "`` and ``" |"``.
INNER = WIDTH - 4
#: Columns of the label of a row (``"Training cost   "``), as in the spec's illustration.
LABEL = 16
#: Continuation rows a wrapped value may take at most before it is cut with ``...``.
MAX_VALUE_ROWS = 3

_RULE = "+" + "-" * (WIDTH - 2) + "+"


def _line(text: str) -> str:
    return "| " + text.ljust(INNER)[:INNER] + " |"


def printable(text: str) -> str:
    """``text`` without control characters (terminal escapes, bells): names come from graphs anyone
    can write, and the card is printed to terminals."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def _wrap(text: str, width: int, max_rows: int = MAX_VALUE_ROWS) -> List[str]:
    text = printable(text)
    rows = textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]
    if len(rows) > max_rows:
        rows = rows[:max_rows]
        last = rows[-1]
        rows[-1] = (last[: width - 3] if len(last) > width - 3 else last) + "..."
    return rows


def _row(label: str, value: str, *more: str) -> List[str]:
    """A labelled row; ``more`` are further values, each starting a continuation row."""
    width = INNER - LABEL
    lines: List[str] = []
    for index, text in enumerate((value,) + more):
        for j, chunk in enumerate(_wrap(text, width)):
            head = label if index == 0 and j == 0 else ""
            lines.append(_line(head.ljust(LABEL) + chunk))
    return lines


def _clip(text: str, width: int, keep_end: bool = False) -> str:
    if len(text) <= width:
        return text
    if width <= 3:
        return text[:width]
    return "..." + text[-(width - 3):] if keep_end else text[: width - 3] + "..."


def _title(name: str, target: Optional[str]) -> str:
    """Name left, target right, ending one column short of the border as the spec's illustration
    does (``| ResNet18 ... models/resnet.py  |``)."""
    room = INNER - 1
    name = " ".join(printable(name).split())
    if not target:
        return _line(_clip(name, room))
    target = _clip(" ".join(printable(target).split()), max(room // 2, room - len(name) - 2), keep_end=True)
    name = _clip(name, room - len(target) - 2)
    return _line(name + " " * (room - len(name) - len(target)) + target + " ")


def _article(gpu_id: str) -> str:
    """``a T4`` but ``an A100-80``, ``an H100``, ``an L4``: by how the first letter is spoken."""
    return "an" if gpu_id[:1].upper() in "AEFHILMNORSX" else "a"


def _summary(model: Mapping[str, Any]) -> List[str]:
    layers = model["layers"]
    parts = [f"{layers} layer{'s' if layers != 1 else ''}", f"{units.count(model['params'])} params"]
    flops = units.flops(model["flops"])
    if not model["flopsComplete"]:
        flops = ">=" + flops
    at = model["input"]["describe"]
    parts.append(f"{flops} at {at}" if at else flops)
    lines = [_line(", ".join(parts))]
    params_est = model["paramsSource"] != "measured"
    flops_est = model["flopsSource"] != "measured"
    if params_est and flops_est:
        lines.append(_line("(estimated from layer params and shapes: no measured totals)"))
    elif params_est:
        lines.append(_line("(params estimated from layer params: no measured total)"))
    elif flops_est:
        lines.append(_line("(FLOPs estimated from shapes: no measured total)"))
    return lines


def _source(memory: Optional[Mapping[str, Any]]) -> str:
    """Where the peak comes from: a measured (rehearsed) training step or the layer-output formula."""
    if memory and memory.get("source") == "measured":
        return f"measured: rehearsed step, peak in the {memory.get('peakPhase')}"
    return "estimated from layer outputs (no measured step)"


def _fit_rows(fit: Mapping[str, Any], memory: Optional[Mapping[str, Any]] = None) -> List[str]:
    if fit["fits"]:
        value = (f"{fit['gpu']} {fit['memoryGb']:g} GB at batch {fit['batch']} {fit['precision']} "
                 f"({units.gb(fit['peakGb'] * 1e9)} peak)")
        if fit["borderline"]:
            return _row("GPU fit", value, _source(memory), f"borderline: needs {units.gb(fit['needGb'] * 1e9)} "
                                                            f"with x{fit['headroom']:g} headroom")
        return _row("GPU fit", value, _source(memory))
    largest = fit["largestGpu"]
    return _row("GPU fit", f"nothing fits: needs {units.gb(fit['needGb'] * 1e9)} at batch 1",
                f"(peak x{fit['headroom']:g}; the largest card, {largest['gpu']}, has "
                f"{largest['memoryGb']:g} GB)", _source(memory))


def _cost_rows(model: Mapping[str, Any], training: Optional[Mapping[str, Any]]) -> List[str]:
    if model["flops"] == 0 and not model["flopsComplete"]:
        return _row("Training cost", "unknown: no layer's FLOPs could be counted")
    if training is None:
        return _row("Training cost", "n/a: no single card holds a training step")
    gpu = training["gpu"]
    price = units.usd(training["usd"])
    value = f"{price if price.startswith('<') else '~' + price} {training['per']} on {_article(gpu)} {gpu}"
    detail = (f"{units.duration(training['seconds'])} at {training['mfu']:.0%} of "
              f"{training['peakTflops']:g} TFLOPS {training['precision']}, "
              f"${training['usdPerHour']:.2f}/h")
    return _row("Training cost", value, detail)


def _count_row(label: str, items: List[str]) -> List[str]:
    if not items:
        return _row(label, "none")
    return _row(label, f"{len(items)}: {items[0]}")


def _diff_rows(diff: Mapping[str, Any]) -> List[str]:
    params, flops, peak = diff["params"], diff["flops"], diff["peakGb"]
    rows = _row("Diff vs base", " ".join(str(diff["baseName"]).split()))
    rows += _row("Params", f"{units.signed(units.count(abs(params['delta'])), params['delta'])} "
                           f"({units.count(params['base'])} -> {units.count(params['new'])})")
    rows += _row("FLOPs", f"{units.signed(units.flops(abs(flops['delta'])), flops['delta'])} "
                          f"({units.flops(flops['base'])} -> {units.flops(flops['new'])})")
    rows += _row("Peak memory", f"{units.signed(units.gb(abs(peak['delta']) * 1e9), peak['delta'])} at batch "
                                f"{peak['batch']} ({units.gb(peak['base'] * 1e9)} -> {units.gb(peak['new'] * 1e9)})")
    cost = diff["costUsd"]
    if cost is not None:
        rows += _row("Cost", f"{units.usd_delta(cost['delta'])} {cost['per']} "
                             f"({units.usd(cost['base'])} -> {units.usd(cost['new'])})")
    layers = diff["layers"]
    rows += _row("Layers", f"{len(layers['added'])} added, {len(layers['removed'])} removed, "
                           f"{len(layers['changed'])} changed")
    return rows


def render(plan: Mapping[str, Any]) -> str:
    """The card for ``plan`` (as built by :func:`neurarch_trace.planner.make_plan`)."""
    model = plan["model"]
    lines = [_RULE, _title(model["name"], model.get("target")), *_summary(model), _RULE]
    run = plan["run"]
    lines += _row("Runs", "yes, shapes propagate end to end" if run["legal"] else
                  f"no, see Blockers ({len(run['blockers'])})")
    lines += _fit_rows(plan["fit"], plan.get("memory"))
    lines += _cost_rows(model, plan["cost"]["training"])
    lines += _count_row("Blockers", run["blockers"])
    lines += _count_row("Warnings", plan["warnings"])
    lines.append(_RULE)
    if plan.get("diff"):
        lines += _diff_rows(plan["diff"])
        lines.append(_RULE)
    return "\n".join(lines)
