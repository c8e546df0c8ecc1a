"""Vision Transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words", 2020), written for this
repository: a patch-embedding convolution, a class token and learned position embeddings read
directly in ``forward``, pre-norm encoder blocks, and a linear classifier.

    neurarch-trace examples/models/vit.py:ViT_B_16 --input 1,3,224,224

ViT_B_16() has 86,567,656 parameters with 1000 classes, the count of the paper's ViT-B/16.
"""

from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    """Multi-head self-attention on ``(N, T, dim)``, with a fused QKV projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(n, t, c))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLP(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """Images ``(N, 3, H, W)`` to logits ``(N, num_classes)``."""

    def __init__(self, image: int = 224, patch: int = 16, dim: int = 768, depth: int = 12, heads: int = 12,
                 num_classes: int = 1000) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.blocks(x + self.pos_embed)
        return self.head(self.norm(x)[:, 0])


def ViT_B_16(num_classes: int = 1000) -> VisionTransformer:  # noqa: N802 - the architecture's name
    """ViT-B/16: width 768, 12 blocks, 12 heads, 16x16 patches at 224 px."""
    return VisionTransformer(224, 16, 768, 12, 12, num_classes)


def ViT_Tiny(num_classes: int = 10) -> VisionTransformer:  # noqa: N802
    """A 32 px, 4x4-patch, width-192 model for quick runs."""
    return VisionTransformer(32, 4, 192, 6, 3, num_classes)
