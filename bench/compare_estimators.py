"""The plan's memory numbers beside DeepSpeed's ZeRO estimators and accelerate's ``estimate-memory``,
for the same LLaMA-7B and LLaMA-3-70B configs (built on the meta device; no weights, no GPU).

    pip install deepspeed accelerate      # DeepSpeed installs without CUDA (DS_BUILD_OPS=0)
    python bench/compare_estimators.py --out bench/results/estimators.json

What is compared (GB = 10^9 bytes; per GPU where a count of GPUs is given):

* DeepSpeed 0.19: ``estimate_zero2_model_states_mem_needs`` and
  ``estimate_zero3_model_states_mem_needs`` (``deepspeed/runtime/zero/stage_1_and_2.py``,
  ``stage3.py``) without offload, called with the model's parameter count and its largest layer
  (the most parameters one module owns directly, as their ``model_to_params`` counts it). The
  ``*_all_live`` wrappers are not used: on the meta device every parameter's ``data_ptr()`` is 0,
  which their de-duplication of shared parameters would fold into one.
* accelerate: ``estimate-memory``'s own functions on the meta model, as its ``gather_data`` calls
  them (``calculate_maximum_sizes`` and ``estimate_training_usage``; the command itself only looks
  models up on the Hugging Face Hub). Its "Training using Adam" is the largest of its parts
  (model, gradients, optimizer, step), not their sum.
* neurarch-trace: the planner on the graph traced on the meta device at 2048 tokens
  (``tests/data/*_meta2048.neurarch.json.gz``), model states from :mod:`neurarch_trace.planner.strategy`
  (with the 1 GB framework allowance left out, as the others have none), and the whole per-GPU
  peak of the plan's setup, activations included, which neither of the others estimates.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neurarch_trace.planner import make_plan  # noqa: E402
from neurarch_trace.planner.analysis import analyse  # noqa: E402
from neurarch_trace.planner.blocks import find_blocks  # noqa: E402
from neurarch_trace.planner.finetune import tuning  # noqa: E402
from neurarch_trace.planner.memory import FRAMEWORK_ALLOWANCE_BYTES  # noqa: E402
from neurarch_trace.planner.strategy import footprint  # noqa: E402

CONFIGS = {
    "LLaMA-7B": ("llama7b_meta2048", {}),
    "LLaMA-3-70B": ("llama3_70b_meta2048", dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                                num_attention_heads=64, num_key_value_heads=8, vocab_size=128256)),
}
GPUS = 8


def meta_model(config: dict):
    import transformers

    with torch.device("meta"):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))


def deepspeed_numbers(total: int, largest: int) -> dict:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    _, z2_one = estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=1, cpu_offload=False)
    _, z2 = estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=GPUS, cpu_offload=False)
    _, z3, _ = estimate_zero3_model_states_mem_needs(total, largest, num_gpus_per_node=GPUS, cpu_offload=False,
                                                      cpu_offload_params=False)
    return {"zero2_1gpu": z2_one / 1e9, f"zero2_{GPUS}gpu": z2 / 1e9, f"zero3_{GPUS}gpu": z3 / 1e9}


def accelerate_numbers(model) -> dict:
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, _largest = calculate_maximum_sizes(model)  # bytes at the model's dtype (float32)
    training = estimate_training_usage(total, "bfloat16")
    return {"bf16_weights": total / 2 / 1e9, "int4_weights": total / 8 / 1e9,
            "training_adam_bf16": max(training.values()) / 1e9,
            "training_parts": {k: v / 1e9 for k, v in training.items()}}


def ours(graph: dict) -> dict:
    a = analyse(graph)
    step = tuning(a, find_blocks(a.graph, a.counts))
    allowance = FRAMEWORK_ALLOWANCE_BYTES

    def states(strategy: str, n: int) -> float:
        setup = footprint(step.states, step.acts, strategy, n)
        return (setup.static_bytes - allowance - step.states.buffers) / 1e9

    plan = make_plan(graph)["plan"]
    return {
        "bf16_weights": plan["serve"]["options"][0]["weightsGb"],
        "int4_weights": plan["serve"]["options"][2]["weightsGb"],
        "single_gpu_states": states("single", 1),
        f"zero2_{GPUS}gpu": states("zero2", GPUS),
        f"zero3_{GPUS}gpu": states("zero3", GPUS),
        "plan": {"gpu": plan["fit"]["gpu"], "gpus": plan["fit"]["gpus"], "strategy": plan["fit"]["strategy"],
                 "peakGb": plan["fit"]["peakGb"], "batch": plan["fit"]["batch"]},
    }


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "estimators.json"))
    args = parser.parse_args(argv)
    results = {}
    for label, (data, config) in CONFIGS.items():
        model = meta_model(config)
        total = sum(p.numel() for p in model.parameters())
        largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
        with gzip.open(ROOT / "tests" / "data" / f"{data}.neurarch.json.gz", "rt", encoding="utf-8") as f:
            graph = json.load(f)
        results[label] = {"params": total, "largestLayer": largest, "deepspeed": deepspeed_numbers(total, largest),
                          "accelerate": accelerate_numbers(model), "neurarch": ours(graph)}
        print(label, json.dumps(results[label], indent=1))
    versions = {"torch": torch.__version__}
    for name in ("deepspeed", "accelerate", "transformers"):
        versions[name] = __import__(name).__version__
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"versions": versions, "gpus": GPUS, "models": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
