"""The fraud model and its training loop: an MLP over leak-free features, class-weighted.

Everything needed to resume lives in `Trainer.state_dict()`, one plain dict of tensors and numbers
(model, optimizer, normalisation statistics, applied shards, in-shard progress, metrics history).
Batch order is a pure function of (seed, shard, epoch), so training resumed at any batch boundary
follows the exact path of an uninterrupted run: on CPU the final weights match bit for bit.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

import workload
from workload.hparams import HParams

FORMAT = 1


class FraudMLP(nn.Module):
    def __init__(self, n_features: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = n_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


class Normalizer:
    """Running mean/variance of the features over every shard applied (Chan et al. merge)."""

    def __init__(self, n_features: int) -> None:
        self.count = torch.zeros((), dtype=torch.float64)
        self.mean = torch.zeros(n_features, dtype=torch.float64)
        self.m2 = torch.zeros(n_features, dtype=torch.float64)

    def update(self, x: np.ndarray) -> None:
        batch = torch.from_numpy(np.asarray(x, dtype=np.float64))
        n = batch.shape[0]
        if n == 0:
            return
        mean = batch.mean(0)
        m2 = ((batch - mean) ** 2).sum(0)
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
        self.count = total

    def apply(self, x: np.ndarray) -> torch.Tensor:
        std = torch.sqrt(self.m2 / self.count.clamp(min=1))
        # A feature constant so far (terminal risk before any label is old enough) stays unscaled:
        # dividing by a tiny std would blow its first real values up a millionfold.
        std = torch.where(std < 1e-3, torch.ones_like(std), std)
        return ((torch.from_numpy(np.asarray(x, dtype=np.float64)) - self.mean) / std).float()

    def state(self) -> dict[str, torch.Tensor]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.count, self.mean, self.m2 = state["count"], state["mean"], state["m2"]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _shard_seed(seed: int, shard: str, epoch: int) -> int:
    digest = hashlib.sha256(f"{seed}|{shard}|{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


class Trainer:
    """A run's model lineage: what it has learned, and where it is in the current shard."""

    def __init__(self, run: str, hp: HParams, feature_names: tuple[str, ...],
                 device: torch.device | None = None) -> None:
        self.run, self.hp, self.feature_names = run, hp, tuple(feature_names)
        self.device = device or default_device()
        torch.manual_seed(hp.seed)
        self.model = FraudMLP(len(feature_names), hp.hidden).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        self.norm = Normalizer(len(feature_names))
        self.applied: list[str] = []
        self.history: list[dict[str, Any]] = []
        self.progress: dict[str, Any] | None = None  # {"shard", "epoch", "batch"} while mid-shard

    # -- checkpoint contents -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "code_version": workload.__version__, "run": self.run,
            "hparams": self.hp.to_dict(), "feature_names": list(self.feature_names),
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(), "norm": self.norm.state(),
            "rng": {"torch": torch.get_rng_state()},
            "applied": list(self.applied), "progress": dict(self.progress) if self.progress else None,
            "history": [dict(h) for h in self.history],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device | None = None) -> Trainer:
        if state.get("format") != FORMAT:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not supported (expected {FORMAT})")
        hp = HParams.from_dict(state["hparams"], where="checkpoint hparams")
        trainer = cls(state["run"], hp, tuple(state["feature_names"]), device)
        trainer.model.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.norm.load(state["norm"])
        torch.set_rng_state(state["rng"]["torch"])
        trainer.applied = list(state["applied"])
        trainer.progress = dict(state["progress"]) if state["progress"] else None
        trainer.history = [dict(h) for h in state["history"]]
        return trainer

    # -- training ----------------------------------------------------------------------------------
    def begin_shard(self, shard: str, x: np.ndarray) -> None:
        """Fold the shard into the normalisation statistics once, then train from its first batch."""
        if self.progress and self.progress["shard"] == shard:
            return  # resuming mid-shard: statistics already include it
        self.norm.update(x)
        self.progress = {"shard": shard, "epoch": 0, "batch": 0}

    def train_shard(self, x: np.ndarray, y: np.ndarray, after_step: Callable[[], bool]) -> bool:
        """Train from `self.progress` to the end of the shard. `after_step()` runs at every batch
        boundary (checkpoint there if due) and returns False to stop early. True when finished."""
        assert self.progress is not None, "begin_shard first"
        shard, hp = self.progress["shard"], self.hp
        xs = self.norm.apply(x).to(self.device)
        ys = torch.from_numpy(np.asarray(y, dtype=np.float32)).to(self.device)
        n = len(ys)
        positives = float(ys.sum())
        pos_weight = min(max((n - positives) / positives, 1.0), hp.pos_weight_cap) if positives else 1.0
        loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pos_weight, device=self.device))
        batches = math.ceil(n / hp.batch_size)
        self.model.train()
        while self.progress["epoch"] < hp.epochs:
            epoch = self.progress["epoch"]
            gen = torch.Generator().manual_seed(_shard_seed(hp.seed, shard, epoch))
            order = torch.randperm(n, generator=gen).to(self.device)
            for b in range(self.progress["batch"], batches):
                idx = order[b * hp.batch_size:(b + 1) * hp.batch_size]
                self.optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(self.model(xs[idx]), ys[idx])
                loss.backward()
                self.optimizer.step()
                self.progress = {"shard": shard, "epoch": epoch, "batch": b + 1}
                if not after_step():
                    return False
            self.progress = {"shard": shard, "epoch": epoch + 1, "batch": 0}
        return True

    def finish_shard(self, entry: dict[str, Any]) -> None:
        assert self.progress is not None
        self.applied.append(self.progress["shard"])
        self.history.append(entry)
        self.progress = None

    @torch.no_grad()
    def score(self, x: np.ndarray, batch: int = 65536) -> np.ndarray:
        """Fraud probability per row."""
        self.model.eval()
        xs = self.norm.apply(x)
        out = [torch.sigmoid(self.model(xs[i:i + batch].to(self.device))).cpu() for i in range(0, len(xs), batch)]
        self.model.train()
        return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.float32)
