"""A small causal transformer language model on synthetic text (no download).

The "text" comes from a fixed random bigram chain over a small vocabulary, so the model has real
structure to learn: the loss falls from log(vocab) towards the chain's entropy.
Run it elastically (see docs/trainer.md): ``ebbflow-train run examples/tiny_lm/train.py``; sharded
over the workers (FSDP2, each transformer block its own unit): ``examples/tiny_lm/train.py:build_sharded``
(``bench/sharded_lm_elastic.py`` trains it through a join, a leave and a kill).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from ebbflow_trainer import TrainingSpec
from torch.utils.data import TensorDataset

VOCAB = 32
CONTEXT = 32
SEQUENCES = 2048


def synthetic_corpus(seed: int = 1234) -> torch.Tensor:
    """Sequences from a sparse random bigram chain: each token has four likely successors."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(VOCAB, VOCAB, generator=generator) * 3.0
    transitions = torch.softmax(logits, dim=-1)
    tokens = torch.empty(SEQUENCES, CONTEXT + 1, dtype=torch.int64)
    tokens[:, 0] = torch.randint(VOCAB, (SEQUENCES,), generator=generator)
    for position in range(1, CONTEXT + 1):
        tokens[:, position] = torch.multinomial(transitions[tokens[:, position - 1]], 1, generator=generator)[
            :, 0
        ]
    return tokens


class TinyLM(torch.nn.Module):
    def __init__(self, width: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.position = torch.nn.Parameter(torch.zeros(CONTEXT, width))
        layer = torch.nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.1, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, VOCAB)
        self.register_buffer(
            "mask", torch.nn.Transformer.generate_square_subsequent_mask(CONTEXT), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) + self.position[: tokens.shape[1]]
        hidden = self.blocks(hidden, mask=self.mask, is_causal=True)
        logits: torch.Tensor = self.head(hidden)
        return logits


def loss_fn(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    (sequences,) = batch
    logits = model(sequences[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), sequences[:, 1:].reshape(-1))


def build() -> TrainingSpec:
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    return TrainingSpec(
        model=model,
        optimizer=optimizer,
        dataset=TensorDataset(synthetic_corpus()),
        loss_fn=loss_fn,
        steps=300,
    )


def build_sharded() -> TrainingSpec:
    """The same job with parameters, gradients and optimizer state split over the workers."""
    spec = build()
    model = spec.model
    assert isinstance(model, TinyLM)
    spec.sharding = "fsdp"
    spec.shard_modules = list(model.blocks.layers)
    return spec
