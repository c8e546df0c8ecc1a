"""README's GPU table stays the planner's: the predictions committed with the H200 measurements
(``bench/results/gpu_cases_fresh.json``, ``gpu_cases_now.json``) are what the planner predicts
today. A change to the memory model that moves them fails here, and the table must be re-run or
re-reported (``bench/gpu_memory_check.py report``)."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_memory_check  # noqa: E402


@pytest.mark.slow  # seconds: traces on the meta device with a rehearsed step
@pytest.mark.parametrize("results, case_id", [
    ("gpu_cases_fresh.json", "qwen05b-full-ckpt-b16-t1024"),
    ("gpu_cases_fresh.json", "mistral7b-serve-b16-t8192"),
    ("gpu_cases_now.json", "llama7b-lora-b4-t1024"),
    ("gpu_cases_heldout_now.json", "llama1b-full-ckpt-eager-b16-t1024"),
])
def test_committed_gpu_predictions_are_the_planners(results: str, case_id: str) -> None:
    committed = json.loads((ROOT / "bench" / "results" / results).read_text())
    row = next(c for c in committed["cases"] if c["id"] == case_id)
    case = {k: row[k] for k in ("id", "model", "mode", "batch", "tokens", "checkpoint", "traced", "attention")
            if k in row}
    case.setdefault("traced", case["tokens"])
    case.setdefault("attention", "sdpa")
    again = gpu_memory_check.predict([case], committed["gpu"])["cases"][0]
    assert again["predictedGb"] == pytest.approx(row["predictedGb"], rel=1e-9)


def test_the_report_pairs_predictions_with_measurements_by_id() -> None:
    """The committed report: each row's ratio is its prediction over its measurement, the MFU its
    training FLOPs over the step time at the GPU's peak."""
    report = gpu_memory_check.report(json.loads((ROOT / "bench/results/gpu_cases_fresh.json").read_text()),
                                     ROOT / "bench/results/gpu_rows_fresh.jsonl")
    assert report["device"] == "NVIDIA H200" and len(report["rows"]) == 11
    for row in report["rows"]:
        assert row["peakRatio"] == pytest.approx(row["predictedGb"] / row["measuredGb"], rel=1e-12)
        if row["mode"] != "serve":
            assert row["measuredMfu"] == pytest.approx(row["trainFlops"] / (row["stepS"] * 989.4e12), rel=1e-12)
    table = gpu_memory_check.table(report)
    assert "| Mistral-7B | decode | 16 x 8192 | 31.67 GB | 32.54 GB | 0.973x |" in table
