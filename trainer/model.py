"""Policies that map (image, proprio state) to the next K actions (normalised units).

`mlp`: flatten the small image, concatenate the state, a stack of Linear+GELU (CPU recipes).
`transformer`: image patches plus one state token through pre-LN blocks (GPU recipe); the state token's
output is read out as the action chunk. LayerNorm only, never BatchNorm: a batch statistic would make
the gradient depend on how the batch is split into backward chunks and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class ModelArgs:
    """Everything needed to rebuild the network; stored in every checkpoint."""

    kind: str
    width: int
    depth: int
    dropout: float
    patch: int
    heads: int
    image_size: int
    channels: int
    state_dim: int
    chunk_len: int
    action_dim: int


class MLPPolicy(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width_in = a.channels * a.image_size**2 + a.state_dim
        for _ in range(a.depth):
            layers += [nn.Linear(width_in, a.width), nn.GELU(), nn.Dropout(a.dropout)]
            width_in = a.width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width_in, a.chunk_len * a.action_dim)
        self.out_shape = (a.chunk_len, a.action_dim)

    def forward(self, image: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        x = torch.cat([image.flatten(1), state], dim=1)
        return self.head(self.body(x)).view(-1, *self.out_shape)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # SDPA picks the flash/memory-efficient kernel on CUDA: no [s, s] attention matrix is stored.
        att = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(att.transpose(1, 2).reshape(n, s, d))
        return x + self.mlp(self.ln2(x))


class TransformerPolicy(nn.Module):
    def __init__(self, a: ModelArgs, grad_checkpointing: bool = False) -> None:
        super().__init__()
        self.grad_checkpointing = grad_checkpointing
        self.patches = nn.Conv2d(a.channels, a.width, kernel_size=a.patch, stride=a.patch)
        n_tokens = (a.image_size // a.patch) ** 2 + 1
        self.pos = nn.Parameter(torch.zeros(1, n_tokens, a.width))
        self.state_token = nn.Linear(a.state_dim, a.width)
        self.blocks = nn.ModuleList(Block(a.width, a.heads, a.dropout) for _ in range(a.depth))
        self.ln_f = nn.LayerNorm(a.width)
        self.head = nn.Linear(a.width, a.chunk_len * a.action_dim)
        self.out_shape = (a.chunk_len, a.action_dim)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, image: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(image).flatten(2).transpose(1, 2)
        x = torch.cat([self.state_token(state)[:, None], tokens], dim=1) + self.pos
        # With checkpointing only each block's input is kept; its insides are recomputed in backward.
        recompute = self.grad_checkpointing and self.training
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return self.head(self.ln_f(x[:, 0])).view(-1, *self.out_shape)


def build(args: ModelArgs, grad_checkpointing: bool = False) -> nn.Module:
    if args.kind == "mlp":
        return MLPPolicy(args)
    return TransformerPolicy(args, grad_checkpointing)
