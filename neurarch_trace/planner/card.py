"""Rendering: the plan (pure data) as the plain-text card of ``shared/spec/plan-api.md``.

At most :data:`WIDTH` (68) columns, boxed with ``+``, ``-`` and ``|``; a header box (name and
target, then layers, parameters and FLOPs), a box of labelled rows (Runs, Fine-tune when LoRA or
QLoRA was asked for, GPU fit, Training cost, Serving for token models, Blockers, Warnings) and,
with a base, a diff box. GPU fit and Training cost name a cluster (``2x H100``) and its strategy
when one card does not hold the step. A value longer than its column wraps onto
continuation rows under the value column. Every number shown is read from the plan.

Widths are display columns, not code points: a CJK character or an emoji takes two columns in a
terminal, a combining mark none (:func:`display_width`, from the Unicode East Asian Width
property, UAX #11, which terminals' own ``wcwidth`` tables follow). The standard library's
``unicodedata`` is enough for that rule and keeps the torch-free planner free of dependencies;
the tests check the result against the ``wcwidth`` package. So names in any script keep the box's
right border in place. (Emoji sequences joined by U+200D are shown as their parts: the joiner is
a format character, blanked with the other non-printables.)
"""

from __future__ import annotations

import unicodedata
from typing import Any, List, Mapping, Optional

import neurarch_trace.text as units
from neurarch_trace.planner.gpus import MAX_GPUS
from neurarch_trace.text import plural, printable

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


def char_width(ch: str) -> int:
    """Columns ``ch`` takes in a terminal: 0 for combining marks and format characters (zero-width
    joiner, variation selectors), 2 for wide and fullwidth characters (CJK, most emoji), else 1."""
    if ch.isascii():
        return 1
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Columns ``text`` takes in a terminal (see :func:`char_width`)."""
    return len(text) if text.isascii() else sum(char_width(ch) for ch in text)


def _cut(text: str, width: int) -> str:
    """The longest start of ``text`` at most ``width`` columns wide."""
    if text.isascii():
        return text[:width]
    used = 0
    for index, ch in enumerate(text):
        used += char_width(ch)
        if used > width:
            return text[:index]
    return text


def _pad(text: str, width: int) -> str:
    """``text`` cut or padded with spaces to exactly ``width`` columns."""
    text = _cut(text, width)
    return text + " " * (width - display_width(text))


def _line(text: str) -> str:
    return "| " + _pad(text, INNER) + " |"


def _wrap(text: str, width: int, max_rows: int = MAX_VALUE_ROWS) -> List[str]:
    """Words of ``text`` filled greedily into rows of at most ``width`` columns, as ``textwrap``
    does but by display width; a word longer than a row fills the current row and breaks; past
    ``max_rows`` the last row ends with ``...``."""
    rows: List[str] = []
    row = ""
    for word in printable(text).split():
        while word:
            gap = 1 if row else 0
            room = width - display_width(row) - gap
            if display_width(word) <= room:
                row, word = row + " " * gap + word, ""
                continue
            if display_width(word) > width and room > 0:
                head = _cut(word, room) or ("" if row else word[:1])
                row, word = row + " " * gap + head if head else row, word[len(head):]
            rows.append(row)
            row = ""
    rows.append(row)
    rows = [r for r in rows if r] or [""]
    if len(rows) > max_rows:
        rows = rows[:max_rows]
        rows[-1] = _cut(rows[-1], width - 3) + "..."
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
    if display_width(text) <= width:
        return text
    if width <= 3:
        return _cut(text, width)
    if keep_end:
        return "..." + _cut(text[::-1], width - 3)[::-1]
    return _cut(text, width - 3) + "..."


def _title(name: str, target: Optional[str]) -> str:
    """Name left, target right, ending one column short of the border as the spec's illustration
    does (``| ResNet18 ... models/resnet.py  |``)."""
    room = INNER - 1
    name = " ".join(printable(name).split())
    if not target:
        return _line(_clip(name, room))
    target = _clip(" ".join(printable(target).split()), max(room // 2, room - display_width(name) - 2),
                   keep_end=True)
    name = _clip(name, room - display_width(target) - 2)
    return _line(name + " " * (room - display_width(name) - display_width(target)) + target + " ")


def _article(gpu_id: str) -> str:
    """``a T4`` but ``an A100-80``, ``an H100``, ``an L4``: by how the first letter is spoken."""
    return "an" if gpu_id[:1].upper() in "AEFHILMNORSX" else "a"


def _summary(model: Mapping[str, Any]) -> List[str]:
    layers = model["layers"]
    parts = [plural(layers, "layer"), f"{units.count(model['params'])} params"]
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


_STRATEGY = {"single": "one GPU", "ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3/FSDP"}
_CHECKPOINT = "with activation checkpointing (+1 forward pass)"


def _source(memory: Optional[Mapping[str, Any]]) -> str:
    """Where the peak comes from: a measured (rehearsed) training step or the layer-output formula."""
    if memory and memory.get("source") == "measured":
        checkpointed = memory.get("checkpointed")
        step = ("rehearsed checkpointed step" if checkpointed else "rehearsed step, checkpointing sized from "
                "its layers" if checkpointed is False else "rehearsed step")
        return f"measured: {step}, peak in the {memory.get('peakPhase')}"
    return "estimated from layer outputs (no measured step)"


def _cluster_fit_rows(fit: Mapping[str, Any], memory: Optional[Mapping[str, Any]]) -> List[str]:
    """A setup of several GPUs, or one GPU with activation checkpointing."""
    strategy = fit["strategy"].split("+")[0]
    peak = units.gb(fit["peakGb"] * 1e9)
    if fit["gpus"] > 1:
        rows = [f"{fit['gpus']}x {fit['gpu']} {fit['memoryGb']:g} GB at batch {fit['batch']:,} per GPU "
                f"{fit['precision']}", f"{_STRATEGY.get(strategy, strategy)}, {peak} peak per GPU"]
    else:
        rows = [f"{fit['gpu']} {fit['memoryGb']:g} GB at batch {fit['batch']:,} {fit['precision']} ({peak} peak)"]
    if fit["checkpointing"]:
        rows.append(_CHECKPOINT)
    if fit["borderline"]:
        per = " per GPU" if fit["gpus"] > 1 else ""
        rows.append(f"borderline: needs {units.gb(fit['needGb'] * 1e9)}{per} with x{fit['headroom']:g} headroom")
    return _row("GPU fit", *rows, _source(memory))


def _needs_text(fit: Mapping[str, Any], lead: str) -> List[str]:
    needs = fit.get("needs")
    if not needs:
        return []
    headroom = fit.get("headroom", 1.15)
    if needs["gpus"] is None:
        return [f"no number of {needs['gpu']} holds one sample with ZeRO-3 + checkpointing: "
                f"{units.gb(needs['peakGb'] * 1e9)} per GPU is not divided, "
                f"{units.gb(needs['peakGb'] * headroom * 1e9)} with x{headroom:g} headroom"]
    nodes = f"{needs['gpus'] // 8} nodes of 8, " if needs["gpus"] > 8 else ""
    if needs["gpus"] > MAX_GPUS:  # --gpu NAMExN takes 1 to MAX_GPUS: not a count to ask for
        nodes += f"more than the {MAX_GPUS} a plan sizes; "
    return [f"{lead}ZeRO-3 + checkpointing needs {needs['gpus']}x {needs['gpu']} {needs['memoryGb']:g} GB "
            f"({nodes}{units.gb(needs['peakGb'] * 1e9)} peak per GPU)"]


def _fit_rows(fit: Mapping[str, Any], memory: Optional[Mapping[str, Any]] = None) -> List[str]:
    if fit["fits"] and (fit.get("gpus", 1) > 1 or fit.get("checkpointing")):
        return _cluster_fit_rows(fit, memory)
    if not fit["fits"] and fit.get("requestedGpu"):
        n = fit.get("requestedGpus")
        asked = f"{n}x {fit['requestedGpu']}" if n else fit["requestedGpu"]
        upto = "" if n else " on up to 64 of them"
        return _row("GPU fit", f"{asked} does not hold a training step{upto}", *_needs_text(fit, ""),
                    _source(memory))
    if fit["fits"]:
        value = (f"{fit['gpu']} {fit['memoryGb']:g} GB at batch {fit['batch']:,} {fit['precision']} "
                 f"({units.gb(fit['peakGb'] * 1e9)} peak)")
        if fit["borderline"]:
            return _row("GPU fit", value, _source(memory), f"borderline: needs {units.gb(fit['needGb'] * 1e9)} "
                                                            f"with x{fit['headroom']:g} headroom")
        return _row("GPU fit", value, _source(memory))
    largest = fit["largestGpu"]
    return _row("GPU fit", f"nothing fits: needs {units.gb(fit['needGb'] * 1e9)} at batch 1",
                f"(peak x{fit['headroom']:g}; the largest card, {largest['gpu']}, has "
                f"{largest['memoryGb']:g} GB)", *_needs_text(fit, "nor do 64 GPUs: "), _source(memory))


def _gpu_hours(hours: float) -> str:
    """``<0.01 GPU-h``, ``0.04 GPU-h``, ``30.1 GPU-h``, ``1,234 GPU-h``."""
    if hours < 0.005:
        return "<0.01 GPU-h"
    if hours < 10:
        return f"{hours:.2f} GPU-h"
    return f"{hours:.1f} GPU-h" if hours < 100 else f"{hours:,.0f} GPU-h"


def _hourly(usd: float) -> str:
    """A price per GPU-hour: ``$3.95``, ``$10,000.00``, and two significant digits under a cent
    (``$0.0012``)."""
    return f"${usd:,.2f}" if usd >= 0.01 else f"${usd:.2g}"


def _speed(training: Mapping[str, Any]) -> str:
    """What the time assumes: the utilisation of the card's peak, or, when the step's eager dispatch
    takes longer than its compute (:mod:`.steptime`), the operators that bound it."""
    if training.get("bound") == "dispatch":
        ms = training["stepSeconds"] * 1e3
        per = " per GPU" if training.get("gpus", 1) > 1 else ""  # stepBatch: each GPU's samples per step
        return (f"in {ms:,.0f}" if ms >= 10 else f"in {ms:.2g}") + (
            f" ms steps at batch {training['stepBatch']:,}{per}, bound by {training['operators']:,} eager operators x "
            f"{training['operatorSeconds'] * 1e6:g} us")
    unknown = " (eager dispatch not counted)" if "bound" in training and training["bound"] is None else ""
    return f"at {training['mfu']:.0%} of {training['peakTflops']:g} TFLOPS {training['precision']}{unknown}"


def _cluster_cost_rows(training: Mapping[str, Any]) -> List[str]:
    """Cost on several GPUs, or on a card without a price, or with recompute."""
    gpu, n = training["gpu"], training.get("gpus", 1)
    where = f"{n}x {gpu}" if n > 1 else f"{_article(gpu)} {gpu}"
    speed = _speed(training)
    time = units.duration(training["seconds"]) + (f" on {n} GPUs" if n > 1 else "")
    gpu_hours = _gpu_hours(training["gpuHours"])
    recompute = [f"{training['flopsFactor']:.3g}x forward FLOPs with the recompute"] if training.get("recompute") \
        else []
    if training["usd"] is None:
        wall = f", {time}," if n > 1 else ""
        return _row("Training cost", f"n/a: {gpu} has no list price; give --usd-per-hour",
                    f"{gpu_hours} {training['per']}{wall} {speed}", *recompute)
    price = units.usd(training["usd"])
    value = f"{price if price.startswith('<') else '~' + price} {training['per']} on {where}"
    if n == 1:
        return _row("Training cost", value, f"{time} {speed}, {_hourly(training['usdPerHour'])}/h", *recompute)
    return _row("Training cost", value, f"{time} {speed}",
                f"{gpu_hours} at {_hourly(training['usdPerHour'])}/h per GPU", *recompute)


def _cost_rows(model: Mapping[str, Any], training: Optional[Mapping[str, Any]]) -> List[str]:
    if model["flops"] == 0 and not model["flopsComplete"]:
        return _row("Training cost", "unknown: no layer's FLOPs could be counted")
    if training is None:
        return _row("Training cost", "n/a: nothing holds a training step (see GPU fit)")
    if training.get("gpus", 1) > 1 or training.get("recompute") or training.get("usd") is None:
        return _cluster_cost_rows(training)
    gpu = training["gpu"]
    price = units.usd(training["usd"])
    value = f"{price if price.startswith('<') else '~' + price} {training['per']} on {_article(gpu)} {gpu}"
    detail = f"{units.duration(training['seconds'])} {_speed(training)}, {_hourly(training['usdPerHour'])}/h"
    return _row("Training cost", value, detail)


#: Which QLoRA recipe the card sizes, and what the other one measured. ``get_peft_model`` over a
#: model loaded with ``BitsAndBytesConfig(load_in_4bit=True)`` keeps what is not quantised in 16
#: bits; PEFT's ``prepare_model_for_kbit_training`` (PEFT's QLoRA guide; TRL's ``SFTTrainer`` called it on a k-bit
#: model) upcasts it to float32, and bitsandbytes' ``Linear4bit`` then returns float32 outputs:
#: on an H200, its peak was 1.31x to 1.59x the 16-bit recipe's at the same batch (LLaMA-7B at 4 x
#: 1,024 tokens 45.63 against 28.67 GB, with checkpointing at 16 x 1,024 21.41 against 16.33 GB;
#: Mistral-7B 1.53x; Qwen2-1.5B 1.38x: ``bench/gpu_memory_check.py``, set ``quantized``, 2026-12-04).
QLORA_RECIPE = ("non-4-bit weights sized in 16 bits; prepare_model_for_kbit_training (PEFT) makes them float32: "
                "measured 1.3x to 1.6x the peak")


def _qlora_recipe(finetune: Mapping[str, Any]) -> List[str]:
    """The lines on the two QLoRA recipes: the other one's rehearsed peak on the card's setup
    (``plan.finetune.kbit``), else :data:`QLORA_RECIPE`."""
    kbit = finetune.get("kbit")
    if not kbit:
        return [QLORA_RECIPE]
    how = "with" if kbit.get("checkpointing") else "no"
    lines = ["non-4-bit weights in 16 bits (get_peft_model over the 4-bit load)",
             f"prepare_model_for_kbit_training (PEFT) makes them float32: {units.gb(kbit['peakGb'] * 1e9)} peak "
             f"at batch {kbit['batch']:,}, {how} checkpointing (rehearsed)"]
    # the fit's own rule: the peak times the headroom must fit the card's memory
    if kbit["needGb"] > kbit["memoryGb"]:
        lines.append(f"needs {units.gb(kbit['needGb'] * 1e9)} with x{kbit.get('headroom', 1.15):g} headroom: "
                     f"over {kbit['memoryGb']:g} GB")
        if kbit.get("checkpointedPeakGb") is not None:
            fits = "over" if kbit["checkpointedNeedGb"] > kbit["memoryGb"] else "fits"
            lines.append(f"with checkpointing: {units.gb(kbit['checkpointedPeakGb'] * 1e9)} peak, {fits}")
    return lines


def _finetune_rows(finetune: Optional[Mapping[str, Any]]) -> List[str]:
    if not finetune or finetune.get("asked", "full") == "full":
        return []
    if not finetune["applied"]:
        return _row("Fine-tune", finetune["note"])
    name = "QLoRA" if finetune["mode"] == "qlora" else "LoRA"
    base = "NF4 base" if finetune["mode"] == "qlora" else "16-bit base"
    more = _qlora_recipe(finetune) if finetune["mode"] == "qlora" else []
    step = _STEP.get(finetune.get("activations"))
    return _row("Fine-tune", f"{name} r={finetune['rank']}: {units.count(finetune['trainableParams'])} trainable "
                             f"params ({finetune['trainablePercent']:.2f}%)",
                f"adapters on {plural(finetune['adaptedLayers'], 'linear layer')}, {base} "
                f"{units.gb(finetune['baseGb'] * 1e9)}", *([step] if step else []), *more)


#: How the Fine-tune row says where its activations come from (``plan.finetune.activations``).
_STEP = {"rehearsed": "the step rehearsed as PEFT runs it",  # checkpointed as the setup is
         "rehearsed, checkpointing from full training": "the step rehearsed as PEFT runs it, its checkpointing "
                                                        "sized from full training's step",
         "full training": "activations from full training's step",
         "layer outputs": "activations estimated from layer outputs"}


def _setup(option: Mapping[str, Any]) -> str:
    head = f"{option['gpus']}x {option['gpu']}" if option["gpus"] > 1 else str(option["gpu"])
    return f"{head} {option['memoryGb']:g} GB"


def _serve_rows(model: Mapping[str, Any], serve: Optional[Mapping[str, Any]]) -> List[str]:
    if not serve or model["input"]["kind"] != "tokens":
        return []
    context = f"{serve['context']:,} token{'' if serve['context'] == 1 else 's'}" if serve["context"] else "one sample"
    if not serve["fits"]:
        return _row("Serving", f"nothing holds {context} x batch 1 in {serve['precision']} on up to 64 GPUs",
                    f"weights {units.gb(serve['weightsGb'] * 1e9)}, KV cache {units.gb(serve['kvCacheGb'] * 1e9)}")
    n = serve["gpus"]
    part = serve["gpuShare"]  # on the fullest GPU: 1/n, or a pipeline stage's whole layers
    weights = units.gb(serve["weightsGb"] * 1e9 * part)
    kv = f"{'KV' if n > 1 else 'KV cache'} {units.gb(serve['kvCacheGb'] * 1e9 * part)}"
    parts = f"weights {weights}, {kv}" if serve["layers"] else f"weights {weights}, no KV cache (no decoder)"
    rows = [f"{_setup(serve)} {serve['precision']}, {context} x batch {serve['batch']:,}",
            f"{units.gb(serve['peakGb'] * 1e9)} {'per GPU' if n > 1 else 'peak'}: {parts}"]
    if serve["gpusAsked"]:
        rows.append(f"{n} of the {serve['gpusAsked']} GPUs: the most it splits over")
    tp, stages = serve["tensorParallel"], serve["pipelineStages"]
    if n > 1 and tp is not None:
        split = f"tensor parallel {tp}" + (f" x pipeline {stages}" if stages > 1 else "")
        if serve["heads"]:
            split += f" ({serve['heads']} heads, {serve['kvHeads']} KV)"
        elif tp > 1:
            split += f", if {tp} divides the heads"
        rows.append(split)
    others = [f"{o['precision']} on {_setup(o)}" for o in serve["options"]
              if o["precision"] != serve["precision"] and o["fits"]]
    if others:
        rows.append(", ".join(others))
    return _row("Serving", *rows)


def _count_row(label: str, items: List[str]) -> List[str]:
    if not items:
        return _row(label, "none")
    return _row(label, f"{len(items)}: {items[0]}")


_KINDS = {"image": "images", "tokens": "token sequences", "other": "other inputs", "unknown": "unknown inputs"}


_MODES = {"full": "full training", "lora": "LoRA", "qlora": "QLoRA"}


def _diff_caveats(diff: Mapping[str, Any]) -> List[str]:
    """What makes the base's numbers differ in kind from the card's: its blockers, a fine-tuning
    mode it cannot take, a peak estimated where the other is measured."""
    out = []
    blockers = diff.get("baseBlockers") or 0
    if blockers:
        out.append(f"the base has {blockers} blocker{'s' if blockers != 1 else ''}: sized as drawn")
    modes = diff.get("finetune") or {}
    if modes and modes.get("base") != modes.get("new"):
        out.append(f"the base is sized for {_MODES.get(modes.get('base'), modes.get('base'))}: "
                   f"{_MODES.get(modes.get('new'), modes.get('new'))} does not apply to it")
    sources = diff.get("sources") or {}
    if sources and sources.get("base") != sources.get("new"):
        out.append(f"peaks: the new one {sources.get('new')}, the base's {sources.get('base')}")
    timing = diff.get("costTiming")
    if timing == "compute":
        out.append("cost: both timed by compute alone (one graph has no operator counts: traced without "
                   "the training step, or by an older tool)")
    elif timing:
        out.append(f"cost: both steps' eager operators counted as in {_STEPS.get(timing, timing)}, which both "
                   "graphs rehearsed (a floor for the other step)")
    steps = diff.get("activations") or {}
    if steps and steps.get("base") != steps.get("new") and steps.get("base") != "layer outputs":
        out.append(f"activations: the new one's {_ACTIVATIONS.get(steps.get('new'), steps.get('new'))}, "
                   f"the base's {_ACTIVATIONS.get(steps.get('base'), steps.get('base'))}")
    return out


#: ``plan.diff.costTiming``'s rehearsed steps in the diff box's words.
_STEPS = {"full": "full training", "full+ckpt": "full training with checkpointing", "lora": "the LoRA step",
          "lora+ckpt": "the LoRA step with checkpointing", "qlora": "the QLoRA step",
          "qlora+ckpt": "the QLoRA step with checkpointing"}

#: ``plan.diff.activations`` in the diff box's words.
_ACTIVATIONS = {"rehearsed": "rehearsed", "rehearsed, checkpointing from full training":
                "rehearsed (checkpointing from full training's)", "full training": "from full training's step "
                "(traced without --finetune)", "layer outputs": "estimated from layer outputs"}


def _diff_rows(diff: Mapping[str, Any]) -> List[str]:
    params, flops, peak = diff["params"], diff["flops"], diff["peakGb"]
    rows = _row("Diff vs base", " ".join(str(diff["baseName"]).split()), *_diff_caveats(diff))
    rows += _row("Params", f"{units.signed(units.count(abs(params['delta'])), params['delta'])} "
                           f"({units.count(params['base'])} -> {units.count(params['new'])})")
    if not diff.get("comparable", True):
        kinds = diff.get("kinds") or {}
        new_kind = _KINDS.get(kinds.get("new"), str(kinds.get("new")))
        base_kind = _KINDS.get(kinds.get("base"), str(kinds.get("base")))
        rows += _row("Compared", f"parameters and layers only: the models differ in kind ({new_kind} vs "
                                 f"{base_kind}), so FLOPs, memory and cost per sample do not compare")
    if flops is not None:
        rows += _row("FLOPs", f"{units.signed(units.flops(abs(flops['delta'])), flops['delta'])} "
                              f"({units.flops(flops['base'])} -> {units.flops(flops['new'])})")
    if peak is not None:
        where = ("per GPU " if peak.get("gpus", 1) > 1 else "") + f"at batch {peak['batch']:,}"
        rows += _row("Peak memory", f"{units.signed(units.gb(abs(peak['delta']) * 1e9), peak['delta'])} {where} "
                                    f"({units.gb(peak['base'] * 1e9)} -> {units.gb(peak['new'] * 1e9)})")
    elif diff.get("comparable", True):
        rows += _row("Peak memory", "n/a: no number of GPUs holds one sample")
    cost = diff["costUsd"]
    if cost is not None:
        rows += _row("Cost", f"{units.usd_delta(cost['delta'])} {cost['per']} "
                             f"({units.usd(cost['base'])} -> {units.usd(cost['new'])})")
    elif diff.get("comparable", True):
        rows += _row("Cost", "n/a, as the card's")
    layers = diff["layers"]
    counted = f"{len(layers['added'])} added, {len(layers['removed'])} removed, {len(layers['changed'])} changed"
    prefixes = layers.get("prefixes")
    more = []
    if prefixes:  # the same layers under another outer scope (a task head's model.)
        side = "new" if prefixes["new"] else "base"
        more.append(f"(matched by name without the {side} model's '{prefixes[side]}')")
    if layers.get("depthOnly"):  # one model cut at two depths: nodes differ, the model does not
        more.append("(the same model at another --depth: the same layers, parameters and FLOPs at full depth)")
    rows += _row("Layers", counted, *more)
    return rows


def render(plan: Mapping[str, Any]) -> str:
    """The card for ``plan`` (as built by :func:`neurarch_trace.planner.make_plan`)."""
    model = plan["model"]
    lines = [_RULE, _title(model["name"], model.get("target")), *_summary(model), _RULE]
    run = plan["run"]
    lines += _row("Runs", "yes, shapes propagate end to end" if run["legal"] else
                  f"no, see Blockers ({len(run['blockers'])})")
    lines += _finetune_rows(plan.get("finetune"))
    lines += _fit_rows(plan["fit"], plan.get("memory"))
    if not run["legal"]:  # the fit, cost and serving below size the graph as it stands
        lines += _row("", "sized as drawn: runs once the Blockers are fixed")
    lines += _cost_rows(model, plan["cost"]["training"])
    lines += _serve_rows(model, plan.get("serve"))
    lines += _count_row("Blockers", run["blockers"])
    lines += _count_row("Warnings", plan["warnings"])
    lines.append(_RULE)
    if plan.get("diff"):
        lines += _diff_rows(plan["diff"])
        lines.append(_RULE)
    return "\n".join(lines)
