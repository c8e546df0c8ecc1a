"""What the front ends share: the plan options defined once (the command line's argparse parser and
the magic's ``magic_arguments`` are built from the same definitions), the consent notice, the blocker
verdict, the text helpers."""

from __future__ import annotations

import argparse
from typing import Any, Dict, List

import pytest

from neurarch_trace import text
from neurarch_trace.cli import build_parser, build_plan_parser
from neurarch_trace.errors import NeurarchError
from neurarch_trace.plan_client import plan_blocked
from neurarch_trace.plan_options import (
    NOTEBOOK_PLAN_OPTIONS,
    PLAN_OPTIONS,
    REPLAN_SHARE,
    SHARE,
    Option,
    PlanChoices,
    button_label,
    consent_notice,
)

_FIELDS = ("option_strings", "dest", "default", "choices", "type", "help", "metavar", "nargs", "const")


def _actions(parser: argparse.ArgumentParser) -> Dict[str, Dict[str, Any]]:
    return {a.option_strings[0]: {f: getattr(a, f) for f in _FIELDS} for a in parser._actions if a.option_strings}


def _expected(option: Option) -> Dict[str, Any]:
    scratch = argparse.ArgumentParser()
    action = scratch.add_argument(*option.flags, **dict(option.kwargs))
    return {f: getattr(action, f) for f in _FIELDS}


def test_every_plan_option_on_the_trace_command_as_defined() -> None:
    actions = _actions(build_parser())
    for option in PLAN_OPTIONS:
        assert actions[option.flags[0]] == _expected(option)


def test_every_trace_option_on_the_trace_command_as_defined() -> None:
    from neurarch_trace.trace_options import DEVICES, TRACE_OPTIONS

    actions = _actions(build_parser())
    for option in TRACE_OPTIONS:
        assert actions[option.flags[0]] == _expected(option)
    assert actions["--device"]["choices"] == tuple(DEVICES)  # a device is one entry of DEVICES


def test_the_plan_command_takes_them_but_plan_which_it_implies() -> None:
    actions = _actions(build_plan_parser())
    assert "--plan" not in actions
    for option in PLAN_OPTIONS[1:]:
        if option is SHARE:  # the same flag, its help without "implies --plan"
            assert actions["--share"] == _expected(REPLAN_SHARE)
            assert "implies" not in REPLAN_SHARE.kwargs["help"]
            assert {k: v for k, v in REPLAN_SHARE.kwargs.items() if k != "help"} == \
                {k: v for k, v in SHARE.kwargs.items() if k != "help"}
            continue
        assert actions[option.flags[0]] == _expected(option)


def test_the_magic_is_built_from_the_same_definitions() -> None:
    pytest.importorskip("IPython")
    from IPython.core.magic_arguments import construct_parser

    from neurarch_trace.notebook.magic import NeurarchMagics

    actions = _actions(construct_parser(NeurarchMagics.neurarch))
    assert NOTEBOOK_PLAN_OPTIONS == PLAN_OPTIONS  # the magic takes every plan option
    for option in PLAN_OPTIONS:
        got, want = dict(actions[option.flags[0]]), _expected(option)
        del got["help"], want["help"]  # the magic words some in its own terms (--fail-on-block raises)
        assert got == want
    order = [a for a in actions if a in {o.flags[0] for o in PLAN_OPTIONS}]
    assert order == [o.flags[0] for o in PLAN_OPTIONS]


def test_option_destinations() -> None:
    assert [o.dest for o in PLAN_OPTIONS] == ["plan", "share", "base", "fail_on_block", "seq_len", "attention",
                                               "finetune", "context", "gpu", "usd_per_hour"]


def test_seq_len_type_errors_are_usage_errors() -> None:
    with pytest.raises(SystemExit):
        build_plan_parser().parse_args(["g.neurarch.json", "--seq-len", "0"])


@pytest.mark.parametrize("args, message", [
    ({"base": "old.neurarch.json"}, "--base needs --plan or --share: it is what the plan's diff compares to"),
    ({"seq_len": 128}, "--seq-len needs --plan or --share: it sizes the plan"),
    ({"attention": "eager"}, "--attention needs --plan or --share: it sizes the plan"),
    ({"fail_on_block": True}, "--fail-on-block needs --plan or --share: it reads the plan's verdict"),
])
def test_plan_flags_without_a_plan(args: Dict[str, Any], message: str) -> None:
    with pytest.raises(NeurarchError) as info:
        PlanChoices.from_args(argparse.Namespace(**args)).check_flags()
    assert str(info.value) == message


def test_choices_read_from_a_front_end_that_lacks_some_options() -> None:
    choices = PlanChoices.from_args(argparse.Namespace(plan=False, share=True, base=None))
    assert choices.sends and choices.flag == "--share"
    assert choices.request_options() == {"share": True, "seq_len": None, "attention": None, "finetune": None,
                                         "context": None, "gpu": None, "usd_per_hour": None}
    assert PlanChoices.from_args(argparse.Namespace()).prepare() is None  # nothing asked: nothing checked


def _graph(layers: int) -> Dict[str, Any]:
    comps: List[Dict[str, Any]] = [{"id": "in", "type": "input"}]
    comps += [{"id": f"l{i}", "type": "relu"} for i in range(layers)]
    return {"name": "g", "components": comps + [{"id": "out", "type": "output"}], "connections": []}


def test_consent_notice_of_the_command_line() -> None:
    assert consent_notice(_graph(62), None, share=False, host="h") == (
        "Sending the graph (62 layers) to h for the plan; add --share for a public link.")
    assert consent_notice(_graph(1), _graph(3), share=True, host="h") == (
        "Sending the graph (1 layer) and the base graph (3 layers) to h for the plan and a public share "
        "link (anyone with the link can open it).")


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("with_base", [False, True])
def test_consent_notice_is_the_notebooks(share: bool, with_base: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # the notebook's result says the same sentence (issue 12 makes it call consent_notice)
    from neurarch_trace.notebook.result import NeurarchResult

    monkeypatch.setenv("NEURARCH_API", "http://127.0.0.1:9")
    base = _graph(3) if with_base else None
    result = NeurarchResult(_graph(4), base=base)
    assert consent_notice(_graph(4), base, share=share, host="127.0.0.1:9", notebook=True) == result.send_notice(share)


@pytest.mark.parametrize("state, share, planned",
                         [("plan", False, False), ("share", True, False), ("link", True, True)])
@pytest.mark.parametrize("with_base", [False, True])
def test_button_label_is_the_widgets(state: str, share: bool, planned: bool, with_base: bool) -> None:
    from neurarch_trace.notebook.render import labels
    from neurarch_trace.notebook.result import NeurarchResult

    result = NeurarchResult(_graph(68), base=_graph(2) if with_base else None)
    label = button_label(_graph(68), has_base=with_base, host="h", share=share, planned=planned)
    assert label == labels(result, "h")[state]
    assert label.endswith(" to h") and ("68 layers" in label)


@pytest.mark.parametrize("plan, blocked", [
    (None, None),
    ({}, None),
    ({"run": {}}, None),
    ({"run": {"legal": True}}, False),
    ({"run": {"blockers": []}}, False),
    ({"run": {"legal": False, "blockers": []}}, True),
    ({"run": {"legal": True, "blockers": ["x"]}}, True),
])
def test_the_blocker_verdict_of_plan_api_md(plan: Any, blocked: Any) -> None:
    assert plan_blocked(plan) is blocked


def test_error_line() -> None:
    assert text.error_line(ValueError("bad\nsecond line")) == "ValueError: bad"
    assert text.error_line(RuntimeError("")) == "RuntimeError"
    assert text.error_line(OSError("  spaced   out  ")) == "OSError: spaced out"
    long = "a" * 170 + ". Then more."
    assert text.error_line(TypeError(long)) == "TypeError: " + "a" * 170 + "."


def test_one_line_printable_plural_wait() -> None:
    assert text.one_line("a\n  b\tc") == "a b c"
    assert text.one_line("x" * 10, 8) == "xxxxx..."
    assert text.printable("ok\x1b[2Jno\x07\n") == "ok [2Jno  "
    assert text.printable("line\nnext\x1b", keep_newlines=True) == "line\nnext "
    assert [text.plural(n, "layer") for n in (0, 1, 2)] == ["0 layers", "1 layer", "2 layers"]
    assert [text.wait_text(s) for s in (1, 45.2, 119, 600, 7199, 7201)] == [
        "1 second", "46 seconds", "119 seconds", "10 minutes", "120 minutes", "3 hours"]
    assert [text.shape_text(s) for s in ([3, 224, 224], [], None)] == ["3x224x224", "scalar", "-"]
