"""The sizing options end to end: ``finetune``, ``context``, ``gpu`` and ``usd_per_hour`` through the
plan client, the ``plan`` command's flags and the reference service over real HTTP."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
import requests  # noqa: E402
from canned_server import CARD, CannedServer, small_graph  # noqa: E402

from neurarch_trace.plan_client import request_plan  # noqa: E402
from neurarch_trace.planner import make_plan  # noqa: E402

DATA = Path(__file__).parent / "data"
PLAN = "/api/v1/plan"
REPO = Path(__file__).resolve().parents[1]
KNOWN = "T4, L4, A10G, L40S, A100-40, A100-80, H100, H200, RTX-4090, RTX-3090, RTX-A6000, L40"


def llama7b() -> dict[str, Any]:
    with gzip.open(DATA / "llama7b_meta2048.neurarch.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


def mlp() -> dict[str, Any]:
    return json.loads((DATA / "mlp.neurarch.json").read_text())


def cli(args: list, cwd: Path, api: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NEURARCH_API", "NEURARCH_API_KEY")}
    env["NEURARCH_API"] = api
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "neurarch_trace", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_service_plans_the_requested_mode_and_hardware(plan_server: str) -> None:
    doc = llama7b()
    body = {"model": doc, "finetune": "qlora", "context": 4096, "gpu": "RTX-4090", "usd_per_hour": 0.4}
    response = requests.post(plan_server + PLAN, json=body, timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    expected = make_plan(doc, finetune="qlora", context=4096, gpu="RTX-4090", usd_per_hour=0.4)
    assert answer["text"] == expected["text"]
    plan = answer["plan"]
    assert (plan["finetune"]["mode"], plan["fit"]["gpu"], plan["serve"]["context"]) == ("qlora", "RTX-4090", 4096)
    assert plan["cost"]["training"]["usdPerHour"] == 0.4


@pytest.mark.parametrize("extra, contains", [
    ({"finetune": "adapter"}, "'finetune' is invalid"),
    ({"context": 0}, "'context' is invalid"),
    ({"context": "4096"}, "'context' is invalid"),
    ({"gpu": 8}, "'gpu' is invalid"),
    ({"usd_per_hour": -1}, "'usd_per_hour' is invalid"),
    ({"usd_per_hour": "1"}, "'usd_per_hour' is invalid"),
    ({"gpu": "B200"}, f"unknown GPU 'B200': known cards are {KNOWN}"),
    ({"gpu": "H100x65"}, "asks for 65 GPUs; a plan uses 1 to 64"),
    ({"usd_per_hour": 2.0}, "usd_per_hour prices the card named by gpu: give gpu too"),
])
def test_bad_sizing_options_are_422_with_one_sentence(plan_server: str, extra: dict, contains: str) -> None:
    response = requests.post(plan_server + PLAN, json={"model": mlp(), **extra}, timeout=30)
    assert response.status_code == 422, response.text
    body = response.json()
    assert list(body) == ["error"] and contains in body["error"] and "\n" not in body["error"]


def test_lora_without_linear_layers_is_a_sentence_not_an_error(plan_server: str) -> None:
    doc = json.loads((DATA / "tiny_cnn.neurarch.json").read_text())
    response = requests.post(plan_server + PLAN, json={"model": doc, "finetune": "lora"}, timeout=30)
    assert response.status_code == 200
    assert "LoRA needs linear layers to adapt" in response.json()["text"]


def test_the_client_sends_the_sizing_fields(canned: CannedServer) -> None:
    canned.answer(200, {"text": CARD})
    request_plan(small_graph(), finetune="lora", context=8192, gpu="H100x8", usd_per_hour=3, api=canned.url)
    request_plan(small_graph(), api=canned.url)
    assert canned.requests[0]["body"] == {"model": small_graph(), "share": False, "finetune": "lora",
                                          "context": 8192, "gpu": "H100x8", "usd_per_hour": 3}
    assert canned.requests[1]["body"] == {"model": small_graph(), "share": False}
    for kwargs in ({"finetune": "adapter"}, {"context": 0}, {"context": True}, {"gpu": ""}, {"gpu": 8},
                   {"usd_per_hour": 0}, {"usd_per_hour": float("nan")}):
        with pytest.raises(ValueError):
            request_plan(small_graph(), api=canned.url, **kwargs)
    assert len(canned.requests) == 2


def test_plan_command_flags_reach_the_service(canned: CannedServer, tmp_path: Path) -> None:
    path = tmp_path / "small.neurarch.json"
    path.write_text(json.dumps(small_graph()))
    canned.answer(200, {"text": CARD})
    done = cli(["plan", path.name, "--finetune", "qlora", "--context", "4096", "--gpu", "RTX-4090",
                "--usd-per-hour", "0.35"], tmp_path, canned.url)
    assert done.returncode == 0, done.stderr
    body = canned.requests[-1]["body"]
    assert (body["finetune"], body["context"], body["gpu"], body["usd_per_hour"]) == ("qlora", 4096, "RTX-4090", 0.35)
    # modes in any case, as the paper spells them, as card names are taken in any case
    done = cli(["plan", path.name, "--finetune", "QLoRA", "--attention", "Eager"], tmp_path, canned.url)
    assert done.returncode == 0, done.stderr
    assert (canned.requests[-1]["body"]["finetune"], canned.requests[-1]["body"]["attention"]) == ("qlora", "eager")


@pytest.mark.parametrize("args, line", [
    (["--finetune", "adapter"], "neurarch-trace: argument --finetune: 'adapter' is not a fine-tuning mode: "
                                "use full, lora or qlora (see neurarch-trace plan --help)"),
    (["--context", "0"], "neurarch-trace: argument --context: 0 is not a positive number of tokens "
                         "(see neurarch-trace plan --help)"),
    (["--usd-per-hour", "0.4"], "neurarch-trace: --usd-per-hour needs --gpu: it prices the card named there"),
    (["--gpu", "L40", "--usd-per-hour", "-1"], "neurarch-trace: argument --usd-per-hour: -1 is not a positive "
                                               "price per GPU-hour (see neurarch-trace plan --help)"),
])
def test_bad_flags_are_one_line(canned: CannedServer, tmp_path: Path, args: list, line: str) -> None:
    path = tmp_path / "small.neurarch.json"
    path.write_text(json.dumps(small_graph()))
    done = cli(["plan", path.name, *args], tmp_path, canned.url)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", line + "\n")
    assert canned.requests == [] and path.exists()


def test_unknown_gpu_is_one_line_naming_the_cards(plan_server: str, tmp_path: Path) -> None:
    path = tmp_path / "mlp.neurarch.json"
    path.write_text(json.dumps(mlp()))
    done = cli(["plan", path.name, "--gpu", "B200"], tmp_path, plan_server)
    assert done.returncode == 1 and done.stdout == ""
    last = done.stderr.splitlines()[-1]
    assert f"unknown GPU 'B200': known cards are {KNOWN}" in last
    assert last.endswith("the graph is still at mlp.neurarch.json") and path.exists()


@pytest.mark.slow  # a command in a fresh interpreter
def test_sizing_flags_need_a_plan(tmp_path: Path) -> None:
    resnet = REPO / "examples" / "models" / "resnet.py"
    done = subprocess.run([sys.executable, "-m", "neurarch_trace", f"{resnet}:ResNet18", "--input", "1,3,32,32",
                           "--gpu", "H100"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1
    assert done.stderr == "neurarch-trace: --gpu needs --plan or --share: it sizes the plan\n"
    assert list(tmp_path.iterdir()) == []
