"""The training itself, without any process group: a tiny MLP on synthetic data.

Everything here is deterministic and independent of the world size, so that a
data-parallel run that loses a worker half way must end with the same model as
one process doing the same number of steps (up to the order of float sums):

- the global batch of step ``s`` is drawn from a generator seeded with
  ``(seed, s)``: every worker draws the same batch, whatever its rank, and
  takes its shard, rows ``rank::world_size``;
- a worker's gradient is the *sum* over its rows; the allreduce sums the
  shards and the update divides by the global batch size, so the update of a
  step is the same with 3 workers, 2 or 1;
- the optimizer is SGD with momentum written out (``v = mu * v + g``,
  ``p -= lr * v``): its whole state is the flat vector :func:`state_vector`
  returns (parameters and velocity), which a re-formed group broadcasts.

A checkpoint (:func:`save_checkpoint`) holds that vector and the step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

__all__ = [
    "Trainer",
    "TrainingConfig",
    "load_checkpoint",
    "reference_run",
    "save_checkpoint",
]


@dataclass(frozen=True)
class TrainingConfig:
    """The job's hyper-parameters (the same on every worker).

    Attributes:
        features: inputs per sample.
        hidden: width of the two hidden layers.
        batch: samples per step over the whole job (the global batch).
        lr: learning rate.
        momentum: SGD momentum.
        seed: seeds the model's initial weights, the teacher and every batch.
    """

    features: int = 16
    hidden: int = 64
    batch: int = 96
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0


def _mlp(cfg: TrainingConfig, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(cfg.features, cfg.hidden),
        nn.Tanh(),
        nn.Linear(cfg.hidden, cfg.hidden),
        nn.Tanh(),
        nn.Linear(cfg.hidden, 1),
    )


class Trainer:
    """The model, its optimizer state and the step counter of one worker.

    Args:
        cfg: the hyper-parameters.
    """

    def __init__(self, cfg: TrainingConfig) -> None:
        self.cfg = cfg
        self.model = _mlp(cfg, cfg.seed)
        self.teacher = _mlp(cfg, cfg.seed + 1)  # the function to learn
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.params = list(self.model.parameters())
        self.velocity = [torch.zeros_like(p) for p in self.params]
        self.step = 0  # steps applied so far
        self.numel = sum(p.numel() for p in self.params)

    def batch(self, step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``rank::world_size`` of the global batch of ``step``: inputs ``(n, features)``
        and targets ``(n, 1)``."""
        g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
        x = torch.randn(self.cfg.batch, self.cfg.features, generator=g)
        y = self.teacher(x) + 0.01 * torch.randn(self.cfg.batch, 1, generator=g)
        return x[rank::world_size], y[rank::world_size]

    def local_gradient(self, rank: int, world_size: int) -> torch.Tensor:
        """This worker's share of step :attr:`step`: a new flat tensor of ``numel + 1``
        float32, the gradient of the summed squared error over its rows, then that sum.

        A new tensor each time: a collective abandoned on a dead peer may still
        write into its buffer later, so a buffer is never used twice.
        """
        x, y = self.batch(self.step, rank, world_size)
        self.model.zero_grad(set_to_none=True)
        loss = ((self.model(x) - y) ** 2).sum()
        loss.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        return torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])

    @torch.no_grad()
    def apply(self, summed: torch.Tensor) -> float:
        """Applies one step from the sum over the job of :meth:`local_gradient`; returns
        the step's mean loss over the global batch."""
        n = self.cfg.batch
        offset = 0
        for p, v in zip(self.params, self.velocity, strict=True):
            g = summed[offset : offset + p.numel()].view_as(p) / n
            offset += p.numel()
            v.mul_(self.cfg.momentum).add_(g)
            p.sub_(self.cfg.lr * v)
        self.step += 1
        return float(summed[-1]) / n

    def state_vector(self) -> torch.Tensor:
        """A new flat float32 tensor of the parameters then the velocity (``2 * numel``)."""
        return torch.cat([t.detach().reshape(-1) for t in self.params + self.velocity])

    @torch.no_grad()
    def load_state_vector(self, vec: torch.Tensor, step: int) -> None:
        """Sets the parameters and velocity from :meth:`state_vector`'s layout, and the step."""
        offset = 0
        for t in self.params + self.velocity:
            t.copy_(vec[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
        self.step = step

    def checksum(self) -> float:
        """The sum of every parameter (equal on workers that hold the same model)."""
        return float(sum(p.detach().double().sum() for p in self.params))


def save_checkpoint(trainer: Trainer, path: Path) -> None:
    """Writes the step and the state vector to ``path`` atomically (a temporary file
    renamed over it), so a crash mid-write leaves the previous checkpoint."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"step": trainer.step, "state": trainer.state_vector()}, tmp)
    os.replace(tmp, path)


def load_checkpoint(trainer: Trainer, path: Path) -> bool:
    """Loads ``path`` into ``trainer`` when it exists; returns whether it did."""
    if not path.exists():
        return False
    saved = torch.load(path, weights_only=True)
    trainer.load_state_vector(saved["state"], int(saved["step"]))
    return True


def reference_run(cfg: TrainingConfig, steps: int) -> Trainer:
    """One process doing ``steps`` steps on the whole global batch: the model a
    data-parallel run must end with, whatever workers it lost on the way."""
    trainer = Trainer(cfg)
    while trainer.step < steps:
        trainer.apply(trainer.local_gradient(0, 1))
    return trainer
