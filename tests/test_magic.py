"""``%neurarch`` driven through a real IPython ``InteractiveShell``: argument parsing, namespace
lookups, errors as one line, the result object's text/HTML/widget displays, and the widget's states
(plan button, working, card, error) against the real plan service or a scripted one on loopback."""

from __future__ import annotations

import json
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
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
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


def test_help_documents_every_option(shell: InteractiveShell) -> None:
    doc = shell.find_line_magic("neurarch").__doc__
    options = ("--input", "--plan", "--share", "--base", "--name", "--depth", "-o", "--no-save", "--verbose", "--dtype")
    for option in options:
        assert option in doc, option
    assert "nothing is sent without" in " ".join(doc.split())
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
    ("model --input 1,3,8,8 -o a.json --no-save", "contradict"),
    ("model --input 1,3,8,8 -o nowhere/a.neurarch.json", "folder"),
    ("model --input 1,3,8,8 --plan --base missing.neurarch.json",
     "--base: graph file missing.neurarch.json does not exist"),
    ("model --input 1,3,8,8 --frobnicate", "unrecognized arguments: --frobnicate"),
    ("model --input 1,3,8,8 --depth x", "invalid int value"),
])
def test_user_errors_are_one_line(shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str,
                                  expected: str) -> None:
    assert expected in usage_error(shell, line, capsys)


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
    assert "<details><summary>Layers (4)</summary>" in html and "<script" not in html and " on" not in html.lower()
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
    assert "Saved for backward" not in r._repr_html_() and "Training memory" not in r._repr_html_()
    for comp in r.graph["components"]:
        if comp["type"] == "conv2d":
            comp["measured"]["savedBytes"] = 2 * 3 * 8 * 8 * 4  # the input, float32, at batch 2
    r.graph["measured"]["training"] = {"peakBytes": 12_345_678, "peakPhase": "backward", "stateBytes": {"params": 4000}}
    html = r._repr_html_()
    assert "Saved for backward / sample" in html and ">768 B</td>" in html  # 3x8x8 floats per sample
    assert "Training memory" in html and "12.3 MB" in html and "backward" in html
    assert "peak bytes 12.3 MB" in str(r) and "state bytes params 4.0 KB" in str(r)


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
