"""A Hugging Face ``transformers`` GPT-2 language model, trained elastically on generated text.

The model is ``GPT2LMHeadModel`` built from a small ``GPT2Config`` (2 layers, width 64, randomly
initialised: nothing is downloaded), reading bytes: the tokenizer is ``str.encode`` and the vocabulary
the 256 byte values. The text comes from a small English-like grammar with subject-verb agreement,
generated deterministically here, so there is real structure to learn. The script uses what a real
run would: bf16 autocast (on CPU too), AdamW with linear warmup and cosine decay, gradient clipping and
a held-out perplexity every ``EVAL_EVERY`` steps (in the journal, the ``ebbflow_trainer_eval`` gauge
and the progress report).

Install the ``hf`` extra (``pip install 'ebbflow-trainer[hf]'``; ``make install`` has it) and run it
elastically (see docs/trainer.md, "Running locally"): ``ebbflow-train run examples/hf_lm/train.py``.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable

# Everything is built locally: with the hub offline, anything that would reach for it (a pretrained
# name by mistake, a remote config) fails at once instead of waiting on a network a pod may not have.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch
from ebbflow_trainer import TrainingSpec
from torch.utils.data import TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 256  # bytes
CONTEXT = 64
SEQUENCES = 2048  # training sequences of CONTEXT bytes
HELD_OUT = 128  # evaluation sequences: a separately generated stream of the same grammar
STEPS = 300
WARMUP = 30
EVAL_EVERY = 50
PEAK_LR = 3e-3
FINAL_LR_FRACTION = 0.1

SINGULAR = ["the cat", "a dog", "my sister", "the old man", "our teacher", "a small bird", "the baker"]
PLURAL = ["the cats", "two dogs", "my parents", "the children", "our neighbours", "the bakers"]
VERBS = [("sees", "see"), ("likes", "like"), ("chases", "chase"), ("finds", "find"), ("paints", "paint")]
OBJECTS = ["the ball", "a red apple", "the river", "an old book", "the green door", "some bread", "the moon"]
ENDINGS = ["", " in the garden", " every morning", " after school", " near the house", " again"]


def sentence(rng: random.Random) -> str:
    """One sentence of the grammar: the verb agrees with its subject."""
    plural = rng.random() < 0.4
    subject = rng.choice(PLURAL if plural else SINGULAR)
    verb = rng.choice(VERBS)[1 if plural else 0]
    text = f"{subject} {verb} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}."
    return text[0].upper() + text[1:]


def encode(text: str) -> torch.Tensor:
    """The byte tokenizer."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)


def corpus(sequences: int, seed: int) -> torch.Tensor:
    """``sequences`` rows of CONTEXT bytes cut from one stream of generated sentences."""
    rng = random.Random(seed)
    parts: list[str] = []
    length = 0
    while length < sequences * CONTEXT:
        parts.append(sentence(rng) + (" " if rng.random() < 0.8 else "\n"))
        length += len(parts[-1])
    return encode("".join(parts))[: sequences * CONTEXT].reshape(sequences, CONTEXT)


def make_model() -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=CONTEXT,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=None,  # GPT-2's defaults name token 50256, outside a byte vocabulary
        eos_token_id=None,
    )
    model = GPT2LMHeadModel(config)  # random weights from torch's RNG, seeded by the trainer
    # transformers picks the loss from the class name, which for GPT-2 names none (it warns and uses
    # this one): say it.
    model.loss_type = "ForCausalLM"
    return model


def loss_fn(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    """Mean next-byte cross-entropy: every sequence has CONTEXT bytes, so it is the batch's mean."""
    (sequences,) = batch
    loss: torch.Tensor = model(input_ids=sequences, labels=sequences).loss  # the model shifts labels
    return loss


def held_out_perplexity(held_out: torch.Tensor) -> Callable[[torch.nn.Module], dict[str, float]]:
    """The eval hook: per-byte loss and perplexity on held-out text (run by the trainer under no_grad,
    with the model on the process's device: the held-out text goes there)."""

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        loss = float(loss_fn(model, [held_out.to(next(model.parameters()).device)]))
        return {"loss": loss, "perplexity": math.exp(loss), "bits_per_byte": loss / math.log(2)}

    return evaluate


def warmup_cosine(step: int) -> float:
    """The LR factor of ``step``: linear warmup over WARMUP steps, then cosine down to the floor.

    The schedule spans STEPS; a run given more with ``--steps`` stays at the floor after it.
    """
    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = min(1.0, (step - WARMUP) / max(1, STEPS - WARMUP))
    return FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))


def build() -> TrainingSpec:
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.01)
    return TrainingSpec(
        model=model,
        optimizer=optimizer,
        dataset=TensorDataset(corpus(SEQUENCES, seed=1234)),
        loss_fn=loss_fn,
        steps=STEPS,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine),
        clip_grad_norm=1.0,
        precision="bf16",
        eval_fn=held_out_perplexity(corpus(HELD_OUT, seed=4321)),
        eval_every=EVAL_EVERY,
    )
