"""Training cost: time and dollars for a unit of training on one card.

::

    train FLOPs = BACKWARD_FACTOR x forward FLOPs per sample x samples
    seconds     = train FLOPs / (peak dense 16-bit TFLOPS x 10^12 x MFU)
    dollars     = seconds / 3600 x USD per GPU-hour

The unit of training follows the input (:mod:`neurarch_trace.planner.workload`): an epoch of
ImageNet-1k for images of 64 px and up, an epoch of CIFAR-10 for smaller images, a billion tokens
for token inputs, a million samples otherwise.

On N GPUs (:func:`cluster_cost`) the same FLOPs are spread over N cards::

    GPU-hours = train FLOPs / (peak dense 16-bit TFLOPS x 10^12 x MFU) / 3600
    hours     = GPU-hours / N
    dollars   = GPU-hours x USD per GPU-hour

with the same MFU on N GPUs as on one (:data:`CLUSTER_SCALING`), and ``train FLOPs`` given by the
training mode (3 x forward for full training, 4 x with activation checkpointing; 2 x for LoRA's
frozen base: :mod:`neurarch_trace.planner.finetune`).

Given the batch per GPU and the operators the rehearsed step dispatches, each step takes the longer
of its compute and its eager dispatch (:mod:`neurarch_trace.planner.steptime`)::

    GPU-hours = samples / batch per GPU x max(compute, dispatch) per step / 3600

which is the formula above whenever compute takes longer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neurarch_trace.contract import CONV_TYPES  # the layer types whose FLOPs count as convolution work
from neurarch_trace.planner.gpus import Gpu
from neurarch_trace.planner.steptime import StepTime, step_time
from neurarch_trace.planner.workload import Workload

__all__ = [
    "BACKWARD_FACTOR",
    "CIFAR10_TRAIN_IMAGES",
    "IMAGENET_1K_TRAIN_IMAGES",
    "IMAGENET_MIN_PX",
    "MFU",
    "CONV_MFU",
    "utilisation",
    "TrainingCost",
    "Unit",
    "ClusterCost",
    "cluster_cost",
    "training_cost",
    "training_unit",
]

#: Forward + backward = 3 x forward FLOPs: the backward of a matmul or conv computes the gradients
#: of both its input and its weights, two products the size of the forward one (Kaplan et al.
#: 2020, "Scaling Laws for Neural Language Models", section 2.1: C = 6N per token = 3 x 2N).
BACKWARD_FACTOR = 3
#: Model-FLOPs utilisation assumed on every card: the fraction of the datasheet peak a training
#: step sustains. PaLM (Chowdhery et al. 2022, table 3) reports 46.2% for a 540B model tuned at
#: scale; a single-GPU PyTorch job rarely does better, so 40% is the plan's stated assumption.
MFU = 0.40
#: Multi-GPU runs are assumed to keep the single-GPU MFU: GPU-hours do not grow with N (scaling
#: efficiency 1.0). The MFU above is itself a cluster figure, communication included: PaLM's 46.2%
#: on 6,144 TPU v4 chips, and Megatron-LM's 52% of peak on 3,072 A100 GPUs with NVLink and
#: InfiniBand (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
#: Clusters Using Megatron-LM", abstract); ZeRO-3 moves 1.5x DDP's data per step (Rajbhandari et
#: al. 2020, section 7.2.2), which overlaps with compute on such links. Cards without NVLink (T4,
#: L4, A10G, L40S and the GeForce and workstation cards) talk over PCIe, where it does not overlap
#: as well: there the plan's time is a lower bound.
CLUSTER_SCALING = 1.0
#: Convolutional networks sustain about half that: NVIDIA's DeepLearningExamples ResNet-50 v1.5
#: (PyTorch, README "Training performance", pytorch-21.03 container) trains at 2,470 img/s on one
#: A100 80GB with mixed precision: 2,470 x 3 x 8.2 GFLOPs (4.1 GMACs at 224 px) = 61 TFLOP/s of
#: the A100's 312, 19.5%; on one V100 16GB, 1,200 img/s = 30 of 125 TFLOP/s, 23.6%. 20% is used
#: when convolutions carry most of a model's FLOPs.
CONV_MFU = 0.20
#: ILSVRC-2012 training set (Russakovsky et al. 2015, "ImageNet Large Scale Visual Recognition
#: Challenge", table 2): 1,281,167 images.
IMAGENET_1K_TRAIN_IMAGES = 1_281_167
#: CIFAR-10 training set (Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny
#: Images"): 50,000 images.
CIFAR10_TRAIN_IMAGES = 50_000
#: Smallest image side, in pixels, quoted against ImageNet-1k rather than CIFAR-10 (the issue's
#: rule: "images of 64 px and up"; downsampled ImageNet variants start at 64 x 64).
IMAGENET_MIN_PX = 64
#: Units for token and other inputs.
TOKENS_PER_UNIT = 1_000_000_000
SAMPLES_PER_UNIT = 1_000_000


@dataclass(frozen=True)
class Unit:
    """What a cost is quoted per: ``key`` (machine-readable), ``phrase`` (how the card says it)
    and ``samples`` (samples it takes; fractional for tokens when seq_len does not divide 10^9)."""

    key: str
    phrase: str
    samples: float


@dataclass(frozen=True)
class TrainingCost:
    """``flops`` to train one unit, ``seconds`` on ``gpu`` at :data:`MFU`, and ``usd``."""

    unit: Unit
    gpu: Gpu
    flops: float
    seconds: float
    usd: float
    mfu: float


def training_unit(work: Workload) -> Unit:
    """The unit a cost is quoted per for this workload."""
    px = work.image_px
    if px is not None and px >= IMAGENET_MIN_PX:
        return Unit("imagenet-1k-epoch", "per epoch of ImageNet-1k", float(IMAGENET_1K_TRAIN_IMAGES))
    if px is not None:
        return Unit("cifar-10-epoch", "per epoch of CIFAR-10", float(CIFAR10_TRAIN_IMAGES))
    if work.kind == "tokens" and work.seq_len:
        return Unit("billion-tokens", "per billion tokens", TOKENS_PER_UNIT / work.seq_len)
    return Unit("million-samples", "per million samples", float(SAMPLES_PER_UNIT))


def utilisation(layers: list[Any], flops_by_kind: Any = None) -> float:
    """The MFU to assume: :data:`CONV_MFU` when convolutions carry more than half the FLOPs (a
    ViT's single patch embedding does not), else :data:`MFU`. The FLOPs by kind are the tracer's
    whole-model count per aten operation (``measured.flopsByKind``), the same at any ``--depth``;
    without them, the layers' counts (``.node.type``, ``.flops``) by layer type."""
    if isinstance(flops_by_kind, dict):
        values = {k: v for k, v in flops_by_kind.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}
        total = sum(values.values())
        if total:
            return CONV_MFU if values.get("convolution", 0) * 2 > total else MFU
    total = sum(layer.flops for layer in layers if layer.flops)
    conv = sum(layer.flops for layer in layers if layer.flops and layer.node.type in CONV_TYPES)
    return CONV_MFU if total and conv * 2 > total else MFU


def training_cost(flops_per_sample: float, unit: Unit, gpu: Gpu | None, mfu: float = MFU) -> TrainingCost | None:
    """The cost of one ``unit`` of training on ``gpu``; ``None`` without a card."""
    if gpu is None:
        return None
    flops = BACKWARD_FACTOR * flops_per_sample * unit.samples
    seconds = flops / (gpu.peak_tflops * 1e12 * mfu)
    return TrainingCost(unit=unit, gpu=gpu, flops=flops, seconds=seconds,
                        usd=seconds / 3600 * gpu.usd_per_hour, mfu=mfu)


@dataclass(frozen=True)
class ClusterCost:
    """One ``unit`` of training on ``gpus`` x ``gpu``: ``flops`` (training FLOPs, recompute
    included), ``gpu_seconds`` (summed over the GPUs), ``seconds`` (wall clock), ``usd`` (``None``
    when the card has no price), the ``flops_factor`` (training FLOPs per forward FLOP) and the
    ``step`` it was timed by (``None``: no batch given, compute alone)."""

    unit: Unit
    gpu: Gpu
    gpus: int
    flops: float
    gpu_seconds: float
    seconds: float
    usd: float | None
    mfu: float
    flops_factor: float
    step: StepTime | None = None


def cluster_cost(train_flops_per_sample: float, unit: Unit, gpu: Gpu, gpus: int = 1, mfu: float = MFU,
                 forward_flops_per_sample: float | None = None, batch: int | None = None,
                 operators: int | None = None) -> ClusterCost:
    """The cost of one ``unit`` on ``gpus`` cards of ``gpu``, at ``mfu`` x :data:`CLUSTER_SCALING`
    of each card's peak; ``train_flops_per_sample`` counts forward, backward and any recompute.
    ``forward_flops_per_sample`` only sets the reported ``flops_factor``. With ``batch`` (samples
    per GPU per step), in steps that each take the longer of their compute and the dispatch of
    ``operators`` (:func:`~neurarch_trace.planner.steptime.step_time`; ``None``: compute alone)."""
    flops = train_flops_per_sample * unit.samples
    gpu_seconds = flops / (gpu.peak_tflops * 1e12 * mfu * CLUSTER_SCALING)
    step = None
    if batch is not None:
        step = step_time(train_flops_per_sample, batch, gpu, mfu, operators, CLUSTER_SCALING)
        gpu_seconds = unit.samples / batch * step.seconds
    usd = None if gpu.usd_per_hour is None else gpu_seconds / 3600 * gpu.usd_per_hour
    factor = train_flops_per_sample / forward_flops_per_sample if forward_flops_per_sample else float(BACKWARD_FACTOR)
    return ClusterCost(unit=unit, gpu=gpu, gpus=gpus, flops=flops, gpu_seconds=gpu_seconds,
                       seconds=gpu_seconds / gpus, usd=usd, mfu=mfu, flops_factor=factor, step=step)
