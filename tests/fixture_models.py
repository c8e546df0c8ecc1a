"""Edge-case models for the tracer's tests, in one place (as torchinfo keeps its fixtures).

Each class is small but real: the kind of forward that breaks model-summary tools.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import nn


class LSTMTagger(nn.Module):
    """Token ids (N, T) -> tag scores (N, T, tags): embedding, bidirectional LSTM, linear."""

    def __init__(self, vocab: int = 500, emb: int = 32, hidden: int = 48, tags: int = 9, layers: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(2 * hidden, tags)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, (h_n, c_n) = self.lstm(self.embedding(ids))
        return self.classifier(out)


class GRUEncoder(nn.Module):
    """Sequence-first GRU returning its (output, h_n) tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(16, 24, num_layers=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gru(x)


class SeqFirstLSTM(nn.Module):
    """Batch-first input, transposed to the sequence-first layout nn.LSTM defaults to."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(10, 20, num_layers=2)
        self.head = nn.Linear(20, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, (h, c) = self.lstm(x.transpose(0, 1))
        return self.head(h[-1])


class AttentionBlock(nn.Module):
    """nn.MultiheadAttention with a residual add and a LayerNorm."""

    def __init__(self, dim: int = 32, heads: int = 4, batch_first: bool = True) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=batch_first)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.attn(x, x, x)
        return self.norm(x + y)


class CalledTwice(nn.Module):
    """One Linear applied twice: two nodes, parameters owned by the first call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.fc(x)))


class InplaceResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc1(x)
        out += x
        return self.fc2(out)


class CatStack(nn.Module):
    """Two branches merged by torch.cat, then two heads merged by torch.stack."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 4)
        self.b = nn.Linear(8, 6)
        self.h1 = nn.Linear(10, 3)
        self.h2 = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.cat([self.a(x), self.b(x)], dim=-1)
        return torch.stack([self.h1(z), self.h2(z)], dim=1)


class DictOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        feats = self.body(x)
        return {"logits": self.head(feats), "features": feats}


class TwoInput(nn.Module):
    """forward(image, meta): a conv branch and a linear branch joined by torch.cat."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flat = nn.Flatten()
        self.meta = nn.Linear(5, 4)
        self.head = nn.Linear(8, 2)

    def forward(self, image: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        a = self.flat(self.pool(self.conv(image)))
        return self.head(torch.cat([a, self.meta(meta)], dim=1))


class IntegerPath(nn.Module):
    """Integer functional code before the first layer and an integer (argmax) output."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        shifted = (ids.flip(-1) + 1) % 50
        return self.fc(self.emb(shifted)).argmax(-1)


class SmallVocab(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 12)
        self.fc = nn.Linear(12, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(ids).mean(1))


class Scale(nn.Module):
    """A leaf layer the mapping table does not know: one learned scale per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class WithUnknownLeaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.scale = Scale(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(self.fc(x))


class Deep(nn.Module):
    """Three levels: stages -> blocks -> layers, for --depth."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.stage = nn.Sequential(
            nn.Sequential(nn.Linear(16, 16), nn.ReLU()),
            nn.Sequential(nn.Linear(16, 16), nn.ReLU()),
        )
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stage(self.stem(x)))


# --- issue 3: the forwards that break tracers -------------------------------------------------


class TinyViT(nn.Module):
    """Patch embedding, a class token and position embeddings read directly in forward."""

    def __init__(self, dim: int = 32, patch: int = 8, image: int = 32, depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1)
        x = x + self.pos_embed
        x = self.encoder(x)
        return self.head(self.norm(x[:, 0]))


class GatedResidual(nn.Module):
    """A container owning a learned gate it reads in forward: x + gate * block(x)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(8, 8)
        self.gate = nn.Parameter(torch.full((8,), 0.5))
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x + self.gate * self.block(x))


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.body(self.embed(ids))))


class SharedParents(nn.Module):
    """One module registered under two parents, and called from each."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(8, 8)
        self.enc = nn.Sequential(nn.Linear(8, 8), shared)
        self.dec = nn.Sequential(shared, nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(self.enc(x))


class Pair(NamedTuple):
    main: torch.Tensor
    aux: torch.Tensor


@dataclasses.dataclass
class Result:
    logits: torch.Tensor
    hidden: list


class Containers(nn.Module):
    """Layers returning nested tuples, lists, a named tuple and a dataclass."""

    class NestedTuple(nn.Module):
        def forward(self, x: torch.Tensor):  # noqa: ANN201
            return (x * 2, (x + 1, [x - 1]))

    class NamedPair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Parameter(torch.eye(8))

        def forward(self, x: torch.Tensor) -> Pair:
            return Pair(x @ self.fc, x[..., :4])

    def __init__(self) -> None:
        super().__init__()
        self.nested = Containers.NestedTuple()
        self.named = Containers.NamedPair()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> Result:
        a, (b, [c]) = self.nested(x)
        pair = self.named(a + b + c)
        return Result(logits=self.head(pair.main), hidden=[pair.aux])


class PartlyNoGrad(nn.Module):
    """A frozen feature extractor run under torch.no_grad(), then a head under inference_mode."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Linear(8, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            f = torch.relu(self.features(x)) * 2
        h = self.mid(f) + f
        with torch.inference_mode():
            return self.head(h.detach().clone())


class KwargsModel(nn.Module):
    """forward(input_ids, attention_mask=None, token_type_ids=None), like a BERT."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(120, 16)
        self.typ = nn.Embedding(2, 16)
        self.fc = nn.Linear(16, 4)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):  # noqa: ANN001, ANN201
        x = self.tok(input_ids)
        if token_type_ids is not None:
            x = x + self.typ(token_type_ids)
        if attention_mask is not None:
            x = x * attention_mask.unsqueeze(-1)
        return self.fc(x)


class WithScripted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.scripted = torch.jit.script(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)))
        self.post = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.scripted(self.pre(x)))


class ComplexLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4, dtype=torch.complex64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).abs()


class ShadowedMethods(nn.Module):
    """Attributes that shadow nn.Module methods (torchview's report: submodules kept in a plain list
    named ``modules``; here also a config dict named ``parameters`` and flags named ``eval``/``train``).
    ``model(x)`` runs in PyTorch; ``model.modules()`` and ``model.eval()`` raise TypeError."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 4)])
        self.norm = nn.BatchNorm1d(4)
        self.modules = list(self.blocks)
        self.named_modules = "blocks"
        self.parameters = {"width": 8}
        self.named_parameters = None
        self.buffers = []
        self.named_buffers = ()
        self.children = 2
        self.eval = "accuracy"
        self.train = [True]
        self.register_forward_hook = None
        self.register_forward_pre_hook = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.modules:
            x = torch.relu(layer(x))
        return self.norm(x)


class ShadowedChild(nn.Module):
    """A child (not the root) with a shadowed ``named_modules``, which PyTorch's recursive
    iterators call on every submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = ShadowedMethods()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner(x))
