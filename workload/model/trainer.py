"""The fraud model and its training loop: an MLP over leak-free features, class-weighted.

Everything needed to resume is in the trainer's state (model, averaged weights, optimizer, normalisation
statistics, applied shards, in-shard progress, metrics history), which the checkpoint format
(workload.model.lineage, `LineageState`) takes and gives back. Batch order is a pure function of
(seed, shard, epoch), so training resumed at any batch boundary follows the exact path of an
uninterrupted run: on CPU the final weights match bit for bit.

The same code runs on CPU and CUDA. A day's tensors are normalised and moved to the device once;
batches are indexed there (no per-batch copy, no DataLoader); scoring runs on the device in large
batches. On CUDA, torch's deterministic algorithms are switched on (with cuBLAS's fixed workspace),
so a resumed run repeats its kernels' arithmetic on the same GPU model and library versions; CPU
and GPU results differ in the last bits, as do different GPU models.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from workload.data import cycle
from workload.model import gpustep
from workload.model.hparams import HParams

MAX_EPOCH_FACTOR = 8  # `min_steps` raises a day's epochs to at most this many times `epochs`

# cuBLAS is deterministic only with a fixed workspace; read when the first CUDA handle is made.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


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

    def update(self, x: np.ndarray, chunk: int = 1 << 16) -> None:
        """Fold rows in, `chunk` at a time: a float64 copy of a chunk stays in cache, where one of a
        whole 1M-row day is 144 MB written and read twice."""
        for start in range(0, len(x), chunk):
            # a copy (np.array, not asarray: the caller's float64 rows too), which _merge centres in place
            self._merge(torch.from_numpy(np.array(x[start:start + chunk], dtype=np.float64)))

    def _merge(self, batch: torch.Tensor) -> None:
        n = batch.shape[0]
        if n == 0:
            return
        mean = batch.mean(0)
        m2 = batch.sub_(mean).square_().sum(0)  # ((batch - mean) ** 2).sum(0) bit for bit, without two copies
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
        self.count = total

    def apply(self, x: np.ndarray, device: torch.device | None = None) -> torch.Tensor:
        """Standardised float32 copy of `x` on `device`: copied there once, scaled there in place."""
        std = torch.sqrt(self.m2 / self.count.clamp(min=1))
        # A feature constant so far (terminal risk before any label is old enough) stays unscaled:
        # dividing by a tiny std would blow its first real values up a millionfold.
        std = torch.where(std < 1e-3, torch.ones_like(std), std)
        out = torch.from_numpy(np.asarray(x, dtype=np.float32)).to(device or "cpu", copy=True)
        return out.sub_(self.mean.float().to(out.device)).div_(std.float().to(out.device))

    def state(self) -> dict[str, torch.Tensor]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.count, self.mean, self.m2 = state["count"], state["mean"], state["m2"]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def use_deterministic(device: torch.device) -> None:
    """Deterministic kernels where torch has them (CUDA); a warning, not an error, where it has none."""
    if device.type == "cuda":
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def _shard_seed(seed: int, shard: str, epoch: int) -> int:
    """The batch order's seed. A day's file type is not part of it: ``training/D.csv`` seeds as
    ``training/D.parquet`` (whose seeds never change), so a day trains alike from either export; nor is its
    version (late labels, ``workload.data.cycle``): ``training/v2/D.parquet`` seeds as ``training/D.parquet``."""
    shard = cycle.unversioned(shard)
    if shard.lower().endswith(".csv"):
        shard = shard[:-len(".csv")] + ".parquet"
    digest = hashlib.sha256(f"{seed}|{shard}|{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


shard_seed = _shard_seed  # what a pack of runs draws each run's batch order by (runtime/packing.py)


def adam_foreach(device: torch.device) -> bool | None:
    """Adam's step loop on `device`. On CPU torch defaults to its single-tensor loop; the foreach one does the same
    arithmetic tensor by tensor (the same bits: tests/workload/test_trainer.py) with less Python a step, and a CPU
    day trains ~12 % faster (20,000 rows, batches of 128, 1 thread: 0.72-0.76 s -> 0.64 s). Elsewhere torch's
    default (CUDA trains with the fused Adam of the GPU-shaped step, gpustep.py)."""
    return True if device.type == "cpu" else None


class Trainer:
    """A run's model lineage: what it has learned, and where it is in the current shard."""

    def __init__(self, run: str, hp: HParams, feature_names: tuple[str, ...],
                 device: torch.device | None = None, feature_version: str = "") -> None:
        self.run, self.hp, self.feature_names = run, hp, tuple(feature_names)
        self.feature_version = feature_version
        self.device = device or default_device()
        use_deterministic(self.device)
        torch.manual_seed(hp.seed)
        self.model = FraudMLP(len(feature_names), hp.hidden).to(self.device)
        # The averaged weights that score (`score`); the raw ones keep training.
        self.averaged = FraudMLP(len(feature_names), hp.hidden).to(self.device)
        self.averaged.load_state_dict(self.model.state_dict())
        self.averaged.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay,
                                          foreach=adam_foreach(self.device))
        self.norm = Normalizer(len(feature_names))
        self.applied: list[str] = []
        self.history: list[dict[str, Any]] = []
        # Rewinds of the lineage: a day that arrived after later ones was applied in date order by going
        # back to the boundary before it; each record names the day, the boundary and what was re-applied.
        self.reapplied: list[dict[str, Any]] = []
        self.progress: dict[str, Any] | None = None  # {"shard", "epoch", "batch"} while mid-shard
        self._correct: torch.Tensor | None = None  # last-epoch rows classified right, while in it
        self._loss_sum: torch.Tensor | None = None  # this process's last-epoch losses, summed on the device
        self.steps = 0  # optimizer steps over the run's life: the weight average's warm-up reads it
        # p = sigmoid(scale * logit + shift): fitted after each applied day (model.calibration).
        self.calibration = {"scale": torch.tensor(1.0, dtype=torch.float64),
                            "shift": torch.tensor(0.0, dtype=torch.float64)}

    def set_calibration(self, scale: float, shift: float) -> None:
        self.calibration = {"scale": torch.tensor(float(scale), dtype=torch.float64),
                            "shift": torch.tensor(float(shift), dtype=torch.float64)}

    def _progress_state(self) -> dict[str, Any] | None:
        if not self.progress:
            return None
        out = dict(self.progress)
        if self._correct is not None:
            out["correct"] = int(self._correct)
        return out

    # -- training ----------------------------------------------------------------------------------
    def window(self, shard: str) -> list[str]:
        """The days `shard` trains on, in order: the run's newest `window_days - 1` applied days, then itself.
        A function of the lineage (its applied list, which a rewind cuts back), so a resumed day reads the
        same rows in the same order."""
        before = self.hp.window_days - 1
        earlier = [s for s in self.applied if s != shard][-before:] if before else []
        return [*earlier, shard]

    def begin_shard(self, shard: str, x: np.ndarray) -> None:
        """Fold the shard's own rows `x` into the normalisation statistics once (the earlier days of its
        window are in them already), then train from its first batch."""
        if self.progress and self.progress["shard"] == shard:
            return  # resuming mid-shard: statistics already include it
        self.norm.update(x)
        self.progress = {"shard": shard, "epoch": 0, "batch": 0,
                         "epochs": self.epochs_for(len(x), len(self.window(shard)))}
        self._correct = None

    def epochs_for(self, rows: int, days: int) -> int:
        """Epochs over the window of a day of `rows` rows, the window holding `days` days: `epochs`, fewer
        once the window holds more than `full_window_days` days (`window_epochs`), more while the run is short
        of `min_steps` steps (at most MAX_EPOCH_FACTOR x `epochs`). Fixed when the day begins and kept in the
        progress, so a resume trains the same number."""
        hp = self.hp
        batches = max(1, math.ceil(rows / hp.batch_size))
        wanted = math.ceil(max(0, hp.min_steps - self.steps) / batches)
        return min(max(self.window_epochs(days), wanted), MAX_EPOCH_FACTOR * hp.epochs)

    def window_epochs(self, days: int) -> int:
        """Epochs over a window of `days` days: `epochs` up to `full_window_days` days (or when that is 0), else
        ceil(epochs * full_window_days / days), at least 1."""
        hp = self.hp
        if hp.full_window_days == 0 or days <= hp.full_window_days:
            return hp.epochs
        return max(1, math.ceil(hp.epochs * hp.full_window_days / days))

    def load_optimizer(self, state: dict[str, Any]) -> None:
        """The optimizer's state from a checkpoint; its step loop stays this device's (`adam_foreach`), whatever
        the checkpoint's param_groups recorded (a checkpoint saved before it, or on another device)."""
        self.optimizer.load_state_dict(state)
        for group in self.optimizer.param_groups:
            group["foreach"] = adam_foreach(self.device)

    def train_shard(self, x: np.ndarray, y: np.ndarray, after_step: Callable[[], bool]) -> bool:
        """Train from `self.progress` to the end of the shard, on `x`, `y`: the rows of its window
        (`window`), in that order. `after_step()` runs at every batch boundary (checkpoint there if due) and
        returns False to stop early. True when finished."""
        assert self.progress is not None, "begin_shard first"
        # -- the step seam (issue 33): CUDA trains with the GPU-shaped step (captured once, replayed); the CPU
        # keeps the eager loop below, bit for bit. --------------------------------------------------------------
        if gpustep.wanted(self.device):
            return gpustep.train_shard(self, x, y, after_step, _shard_seed)
        # -- end of the step seam ---------------------------------------------------------------------------------
        shard, hp = self.progress["shard"], self.hp
        xs = self.norm.apply(x, self.device)  # the day's tensors move to the device once
        ys = torch.from_numpy(np.asarray(y, dtype=np.float32)).to(self.device)
        n = len(ys)
        positives = float(ys.sum())
        pos_weight = min(max((n - positives) / positives, 1.0), hp.pos_weight_cap) if positives else 1.0
        loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pos_weight, device=self.device))
        batches = math.ceil(n / hp.batch_size)
        params, averaged = list(self.model.parameters()), list(self.averaged.parameters())
        self.model.train()
        epochs = int(self.progress.get("epochs", hp.epochs))  # a format-2 checkpoint's progress has none
        while self.progress["epoch"] < epochs:
            epoch = self.progress["epoch"]
            last_epoch = epoch == epochs - 1
            gen = torch.Generator().manual_seed(_shard_seed(hp.seed, shard, epoch))
            order = torch.randperm(n, generator=gen).to(self.device)  # one copy per epoch, indexed there
            for b in range(self.progress["batch"], batches):
                idx = order[b * hp.batch_size:(b + 1) * hp.batch_size]
                self.optimizer.zero_grad(set_to_none=True)
                logits = self.model(xs[idx])
                target = ys[idx]
                loss = loss_fn(logits, target)
                loss.backward()
                self.optimizer.step()
                average(averaged, params, decay_at(hp.ema_decay, self.steps))
                self.steps += 1
                if last_epoch:  # training accuracy from logits already computed: no extra pass
                    # An integer count (a sum of booleans is int64): a float32 one would stop at 2**24 rows.
                    hits = ((logits.detach() >= 0) == (target >= 0.5)).sum()
                    self._correct = hits if self._correct is None else self._correct + hits
                    self._loss_sum = loss.detach() + (0 if self._loss_sum is None else self._loss_sum)
                self.progress = {"shard": shard, "epoch": epoch, "batch": b + 1, "epochs": epochs}
                if not after_step():
                    return False
            self.progress = {"shard": shard, "epoch": epoch + 1, "batch": 0, "epochs": epochs}
        return True

    def finish_shard(self, entry: dict[str, Any]) -> None:
        assert self.progress is not None
        self.applied.append(self.progress["shard"])
        self.history.append(entry)
        self.progress = None
        self._correct = None
        self._loss_sum = None

    def train_accuracy(self, n: int) -> float:
        """Share of the shard's `n` rows classified right (p >= 0.5) as the last epoch passed over them
        (by the weights of that moment): free, where scoring the day again costs a forward pass."""
        return int(self._correct) / n if n and self._correct is not None else float("nan")

    def last_epoch_loss(self) -> float | None:
        """Sum of the last epoch's batch losses that this process trained (None if it trained none):
        for the finiteness check before promotion, without another pass over the day."""
        return None if self._loss_sum is None else float(self._loss_sum)

    @torch.no_grad()
    def logits(self, x: np.ndarray, batch: int | None = None) -> np.ndarray:
        """Raw logits per row, from the averaged weights, on the device in large passes (`scoring_passes`; `batch`:
        passes of that many rows instead)."""
        xs = self.norm.apply(x, self.device)
        passes = [(i, i + batch) for i in range(0, len(xs), batch)] if batch else scoring_passes(len(xs), self.device)
        out = [self.averaged(xs[start:end]) for start, end in passes]
        return torch.cat(out).cpu().numpy() if out else np.zeros(0, dtype=np.float32)

    def score(self, x: np.ndarray, batch: int | None = None, calibrated: bool = True) -> np.ndarray:
        """Fraud probability per row (float32); `calibrated=False`: the class-weighted network's own
        sigmoid, which ranks the same but overstates fraud."""
        return self.probabilities(self.logits(x, batch), calibrated)

    def probabilities(self, logits: np.ndarray, calibrated: bool = True) -> np.ndarray:
        """`score` from logits already computed (`logits`): both kinds from one forward pass, bit for bit."""
        z = torch.from_numpy(logits)
        if calibrated:  # in float32, as the network's sigmoid: identity calibration changes no bit
            z = z * self.calibration["scale"].float() + self.calibration["shift"].float()
        return torch.sigmoid(z).numpy()


# Rows per forward pass when scoring on a CPU. A week of test or calibration days (~70,000 rows) in one pass
# works through activations far larger than the CPU's caches and took twice as long as passes of this size: two
# such passes a day were most of a ~10,000-row day's time outside training (issue 33: per-item overhead). A multiple
# of 2^11 * 3, so every pass starts on a row that one pass over all rows would give to the same matrix kernel.
CPU_SCORING_ROWS = 6144


def scoring_passes(n: int, device: torch.device) -> list[tuple[int, int]]:
    """The (start, end) rows of each forward pass that scores `n` rows. On a CPU, passes of CPU_SCORING_ROWS, the
    last one taking the rest (a pass of a handful of rows goes through another kernel of the matrix library, and
    its logits differ in their last bits): on the CI machine's CPU each row's logit is bit for bit that of one pass
    over all rows, on others within float32 rounding (an Intel Xeon's matrix library rounds by the rows a product
    holds), and always the same bits for the same rows (tests/workload/test_trainer.py). On a GPU, passes of 2^18
    rows."""
    size = CPU_SCORING_ROWS if device.type == "cpu" else 1 << 18
    starts = list(range(0, n, size))
    if device.type == "cpu" and len(starts) > 1 and n - starts[-1] < size:
        starts.pop()  # the rest joins the pass before it
    return list(zip(starts, [*starts[1:], n] if starts else [], strict=True))


def decay_at(decay: float, step: int) -> float:
    """The averaging decay at optimizer step `step` of a run: warmed up as (1 + step) / (10 + step), so
    that the average forgets the random initial weights within a few hundred steps instead of
    ~1/(1 - decay); on a one-week run a plain 0.999 average still carried them at the end."""
    return min(decay, (1 + step) / (10 + step))


def average(averaged: list[torch.Tensor], params: list[torch.Tensor], decay: float) -> None:
    """averaged <- decay * averaged + (1 - decay) * params, in one fused call (decay 0: a copy)."""
    with torch.no_grad():
        torch._foreach_lerp_(averaged, params, 1.0 - decay)


