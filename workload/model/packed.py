"""A sweep's runs on one GPU: runs of one dataset trained in one process as one stacked model.

One run's step leaves a GPU nearly idle (a batch of 128 rows through a small MLP); R runs of the same
architecture stacked on a leading axis take R batches in one step: `torch.func.vmap` over
`functional_call` gives every run its own forward and gradients in batched kernels (backward seeded with the
loss's gradient; the loss itself is computed only while some run sums its last epoch), and Adam and the
weight average are written out over the stacked tensors with per-run learning rate, weight decay, class
weight, averaging decay and step count. Each run keeps everything that makes it itself: its batches (its
own seed's permutation each epoch, its own cursor), its optimizer state, its number of epochs for the day,
its normalisation statistics, its progress and sums; a run that has finished its epochs, or was stopped,
sits the remaining steps out (masked: its tensors are not written).

Each run stays a `Trainer` (its lineage, its checkpoint): `Pack.trainer(r)` writes the run's slice of the
stacked state back into it before anyone reads it (a checkpoint, the report). A packed run equals its solo
training within `SOLO_TOLERANCE`: batched matrix products and the per-run Adam written over tensors round
differently from one run's kernels in the last bits (tests/model/test_packed.py). On CUDA the packed step is
captured once as a CUDA graph and replayed (workload/model/gpustep.py's recipe).

Runs pack when they share what the stacked tensors' shapes depend on: the device, the features, the hidden
layer widths and the batch size; and they must train the same rows (one window of days). Different widths
form different packs.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.func import functional_call, vjp, vmap
from torch.nn import functional as F

from workload.model import gpustep
from workload.model.trainer import Trainer

# A packed run's weights, averaged weights and Adam moments against its solo training: after 44-66 steps on CPU
# at most 3e-8 apart (tests/model/test_packed.py; 6e-8 while the pack differentiated the loss under vmap); within
# this tolerance on an H200 too (the CUDA tests, 2026-11-28, before that change).
# Not bit for bit even on CPU: vmap's batched products round differently from one run's (gradients ~1e-9 apart
# after one step). On CUDA they also round by the pack's size: a run resumed in a pack of another size (alone, say)
# ends within this tolerance of its undisturbed pack, and bit for bit when its pack resumes together.
SOLO_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def pack_key(trainer: Trainer) -> tuple:
    """What runs must share to train as one stacked model."""
    return (trainer.device.type, trainer.device.index, trainer.feature_names, trainer.hp.hidden,
            trainer.hp.batch_size)


@dataclass
class Cursor:
    """Where one run stands in the day: the host's copy (it never asks the device)."""

    epoch: int
    batch: int
    epochs: int
    active: bool = True


class Pack:
    """Runs of one dataset trained together; each `trainers[r]` stays the run's own lineage."""

    def __init__(self, trainers: list[Trainer], shard_seed: gpustep.ShardSeed, capture: bool | None = None) -> None:
        if not trainers:
            raise ValueError("a pack needs at least one run")
        keys = {pack_key(t) for t in trainers}
        if len(keys) != 1:
            raise ValueError(f"runs {[t.run for t in trainers]} cannot share one stacked model: they differ in "
                             f"device, features, hidden widths or batch size ({sorted(map(str, keys))})")
        self.trainers, self.shard_seed = list(trainers), shard_seed
        first = trainers[0]
        self.device, self.bs, self.r = first.device, first.hp.batch_size, len(trainers)
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.base_model = copy.deepcopy(first.model).to("meta")
        self.names = [k for k, _ in first.model.named_parameters()]
        self._stack()
        # CUDA graphs of the step by (the last epoch's sums, nothing masked), as captured
        self.graphs: dict[tuple[bool, bool], Any] = {}
        self.sums, self.all_active = True, False
        self.orders: dict[tuple[int, int], Future[torch.Tensor]] = {}  # (run, epoch): its permutation, drawing

    # -- stacked state ----------------------------------------------------------------------------------
    def _stack(self) -> None:
        dev, ts = self.device, self.trainers

        def stacked(get: Callable[[Trainer, str], torch.Tensor]) -> dict[str, torch.Tensor]:
            return {k: torch.stack([get(t, k).detach().to(dev) for t in ts]).contiguous() for k in self.names}

        def moment(t: Trainer, k: str, key: str) -> torch.Tensor:
            p = dict(t.model.named_parameters())[k]
            st = t.optimizer.state.get(p)
            return st[key] if st else torch.zeros_like(p)

        # Each kind of state in one [R, P] buffer, a run's parameters along its row, every parameter's [R, ...] block
        # a view of it: Adam and the weight average run as a few kernels over all parameters (on CUDA a step's cost
        # is its count of kernels), each run's own numbers broadcast along its row.
        self.flat_w, self.w = flat(stacked(lambda t, k: dict(t.model.named_parameters())[k]))
        self.flat_avg, self.avg = flat(stacked(lambda t, k: dict(t.averaged.named_parameters())[k]))
        self.flat_m, self.m = flat(stacked(lambda t, k: moment(t, k, "exp_avg")))
        self.flat_v, self.v = flat(stacked(lambda t, k: moment(t, k, "exp_avg_sq")))
        # What a row holds besides the parameters (zeros: each parameter starts aligned, the row too): the gradients
        # are laid out alike by one concatenation.
        self.gaps = {k: torch.zeros((self.r, n), device=dev) for k, n in gaps(stacked_sizes(self.w)).items()}
        p0 = [dict(t.model.named_parameters())[self.names[0]] for t in ts]
        self.adam_steps = torch.tensor([float(t.optimizer.state[p]["step"]) if t.optimizer.state.get(p) else 0.0
                                        for t, p in zip(ts, p0, strict=True)], dtype=torch.float64, device=dev)
        groups = [t.optimizer.param_groups[0] for t in ts]
        self.lr = torch.tensor([g["lr"] for g in groups], dtype=torch.float64, device=dev)
        self.wd = torch.tensor([g["weight_decay"] for g in groups], dtype=torch.float32, device=dev)
        self.betas, self.eps = groups[0]["betas"], groups[0]["eps"]
        if any((g["betas"], g["eps"]) != (self.betas, self.eps) for g in groups):
            raise ValueError("runs of a pack must share Adam's betas and eps")
        self.ema_decay = torch.tensor([t.hp.ema_decay for t in ts], dtype=torch.float64, device=dev)
        self.ema_step = torch.zeros(self.r, dtype=torch.float64, device=dev)
        self.pos_weight = torch.ones(self.r, device=dev)
        self.active = torch.zeros(self.r, dtype=torch.bool, device=dev)
        self.summing = torch.zeros(self.r, dtype=torch.bool, device=dev)  # in its last epoch
        self.hits = torch.zeros(self.r, dtype=torch.int64, device=dev)
        self.loss_sum = torch.zeros(self.r, device=dev)
        self.base = torch.zeros(self.r, dtype=torch.int64, device=dev)
        self.arange = torch.arange(self.bs, device=dev)
        self.full = torch.full((self.r,), float(self.bs), device=dev)  # a full batch's rows, as `count` has them

    def trainer(self, r: int) -> Trainer:
        """Run `r`'s trainer with its slice of the stacked state written back: what a checkpoint saves."""
        t = self.trainers[r]
        with torch.no_grad():
            for name, p in t.model.named_parameters():
                p.copy_(self.w[name][r])
                st = t.optimizer.state[p]
                st["step"] = torch.tensor(float(self.adam_steps[r]), dtype=torch.float32)  # as Adam keeps it
                st["exp_avg"] = self.m[name][r].clone()
                st["exp_avg_sq"] = self.v[name][r].clone()
            for name, a in t.averaged.named_parameters():
                a.copy_(self.avg[name][r])
        return t

    # -- a day --------------------------------------------------------------------------------------------
    def load_day(self, x: np.ndarray, y: np.ndarray) -> None:
        """The window's rows, normalised by each run's statistics (one copy when they agree, as they do for
        runs that applied the same days), and each run's class weight."""
        norms = [t.norm.state() for t in self.trainers]
        same = all(all(torch.equal(n[k], norms[0][k]) for k in n) for n in norms)
        xs = [t.norm.apply(x, self.device) for t in (self.trainers[:1] if same else self.trainers)]
        self.xs = torch.stack(xs)
        self.run_ix = (torch.zeros if same else torch.arange)(self.r, dtype=torch.int64, device=self.device)[:, None]
        self.ys = torch.from_numpy(np.asarray(y, dtype=np.float32)).to(self.device)
        self.n = len(self.ys)
        positives = float(self.ys.sum())
        for r, t in enumerate(self.trainers):
            cap = t.hp.pos_weight_cap
            self.pos_weight[r] = min(max((self.n - positives) / positives, 1.0), cap) if positives else 1.0
        self.order = torch.zeros((self.r, self.n), dtype=torch.int64, device=self.device)
        self.ema_step.copy_(torch.tensor([float(t.steps) for t in self.trainers], dtype=torch.float64))
        self.graphs = {}  # new buffers: capture again

    def train_shard(self, x: np.ndarray, y: np.ndarray, after_step: Callable[[int], bool]) -> list[bool]:
        """Every run from its own progress to the end of the day (each `trainers[r].begin_shard` first, all on
        the same window `x`, `y`). `after_step(r)` runs after each of run r's steps (`trainer(r)` gives its
        checkpointable state); False stops that run. Returns, per run, whether it finished the day."""
        self.load_day(x, y)
        batches = math.ceil(self.n / self.bs)
        cursors = []
        for t in self.trainers:
            assert t.progress is not None, f"run {t.run}: begin_shard first"
            t.model.train()
            c = Cursor(t.progress["epoch"], t.progress["batch"], int(t.progress.get("epochs", t.hp.epochs)))
            if c.batch >= batches:  # stopped after an epoch's last batch: the next epoch is next, as solo
                c.epoch, c.batch = c.epoch + 1, 0
                t.progress = {**t.progress, "epoch": c.epoch, "batch": 0, "epochs": c.epochs}
            c.active = c.epoch < c.epochs
            cursors.append(c)
        with ThreadPoolExecutor(max_workers=min(self.r, os.cpu_count() or 1)) as self.pool:
            self.orders = {(r, c.epoch): self._draw(r, c.epoch) for r, c in enumerate(cursors) if c.active}
            for r, c in enumerate(cursors):
                if c.active:
                    self._begin_epoch(r, c, batches)
            self._set_flags(cursors)
            while any(c.active for c in cursors):
                self._run_step(self.n % self.bs == 0 or all(c.batch < batches - 1 for c in cursors))
                changed = False
                for r, c in enumerate(cursors):
                    if c.active:
                        changed |= self._after_step(r, c, batches, after_step)
                if changed:
                    self._set_flags(cursors)
            for future in self.orders.values():
                future.cancel()
        for r in range(self.r):
            self.trainer(r)
        return [c.epoch >= c.epochs for c in cursors]

    def _after_step(self, r: int, c: Cursor, batches: int, after_step: Callable[[int], bool]) -> bool:
        """The host's bookkeeping for run r's step, as the solo loop keeps it; True when a flag changed."""
        t = self.trainers[r]
        t.steps += 1
        if c.epoch == c.epochs - 1:
            t._correct, t._loss_sum = self.hits[r], self.loss_sum[r]
        c.batch += 1
        t.progress = {"shard": t.progress["shard"], "epoch": c.epoch, "batch": c.batch, "epochs": c.epochs}
        if not after_step(r):
            c.active = False
            return True
        if c.batch < batches:
            return False
        c.epoch, c.batch = c.epoch + 1, 0
        t.progress = {"shard": t.progress["shard"], "epoch": c.epoch, "batch": 0, "epochs": c.epochs}
        c.active = c.epoch < c.epochs
        if c.active:
            self._begin_epoch(r, c, batches)
        return True

    def _begin_epoch(self, r: int, c: Cursor, batches: int) -> None:
        """Run r's permutation for its epoch (its own seed's generator, as solo) and its sums' start."""
        t = self.trainers[r]
        order = (self.orders.pop((r, c.epoch), None) or self._draw(r, c.epoch)).result()
        if c.epoch + 1 < c.epochs:  # the next one is drawn while this epoch trains
            self.orders[(r, c.epoch + 1)] = self._draw(r, c.epoch + 1)
        self.order[r].copy_(order)
        self.base[r] = c.batch * self.bs
        if c.epoch == c.epochs - 1 and c.batch < batches:
            self.hits[r] = int(t._correct) if t._correct is not None else 0
            self.loss_sum[r] = float(t._loss_sum) if t._loss_sum is not None else 0.0

    def _draw(self, r: int, epoch: int) -> Future[torch.Tensor]:
        """Run r's permutation for `epoch`, drawn on a CPU thread by the generator its solo training uses:
        a 1M-row permutation costs ~10-30 ms, times 32 runs an epoch, which would otherwise stall the GPU."""
        t = self.trainers[r]
        seed = self.shard_seed(t.hp.seed, t.progress["shard"], epoch)
        return self.pool.submit(lambda: torch.randperm(self.n, generator=torch.Generator().manual_seed(seed)))

    def _set_flags(self, cursors: list[Cursor]) -> None:
        summing = [c.active and c.epoch == c.epochs - 1 for c in cursors]
        self.active.copy_(torch.tensor([c.active for c in cursors]))
        self.summing.copy_(torch.tensor(summing))
        self.sums = any(summing)  # the host knows: the step with the sums (a graph of its own) only then
        self.all_active = all(c.active for c in cursors)  # then, with full batches, nothing is masked

    def _run_step(self, full: bool) -> None:
        """The step (replayed on CUDA: a graph for each kind, captured on first use); `full`: every run's batch is."""
        sums, plain = self.sums, full and self.all_active
        if not self.capture:
            packed_step(self, sums, plain)
            return
        graph = self.graphs.get((sums, plain))
        if graph is None:
            state = [self.flat_w, self.flat_avg, self.flat_m, self.flat_v, self.adam_steps, self.ema_step, self.hits,
                     self.loss_sum, self.base]
            graph = self.graphs[(sums, plain)] = gpustep.capture_or_none("the packed step", lambda: gpustep.capture(
                lambda: packed_step(self, sums, plain), lambda: packed_step(self, sums, plain), state))
            if graph is None:
                self.capture = False
                packed_step(self, sums, plain)
                return
        graph.replay()


def packed_step(p: Pack, sums: bool = True, plain: bool = False) -> None:
    """One step of every active run: its next batch (a short last batch masked to its rows), its gradients (vmap
    over the runs, backward seeded with the loss's gradient), Adam with its own lr and weight decay, its weight
    average, and with `sums` (some run is in its last epoch) the sums of the runs that are. `plain`: every run is
    active and its batch full (what the host knows of its cursors), so nothing is masked: the same values, by the
    same arithmetic, for a fifth fewer operators (on CUDA a step costs its count of kernels)."""
    pos = p.base[:, None] + p.arange  # [R, bs] positions in each run's order
    if plain:
        idx, count, weight = p.order.gather(1, pos), p.full, None
    else:
        valid = pos < p.n
        idx = p.order.gather(1, pos.clamp(max=p.n - 1))
        count, weight = valid.sum(1).clamp(min=1).float(), valid.float()
    xb, yb = p.xs[p.run_ix, idx], p.ys[idx]

    def grads_of(params: dict, x: torch.Tensor, y: torch.Tensor, pw: torch.Tensor, n: torch.Tensor,
                 w: torch.Tensor | None = None) -> tuple[dict, torch.Tensor]:
        logits, pullback = vjp(lambda q: functional_call(p.base_model, q, (x,)), params)
        # d/dlogits of sum(w * BCE-with-logits(pos_weight)) / n, as torch's backward of the loss computes it (the
        # loss's forward and backward were ~30 operators under vmap; the forward runs only where the loss is summed).
        # A full batch's weights are all 1: x * 1 is x, so leaving them out changes no bit.
        t = pw * y
        dz = (t + 1 - y) * logits.sigmoid() - t
        return pullback((dz if w is None else dz * w) / n)[0], logits

    if plain:
        grads, logits = vmap(grads_of)(p.w, xb, yb, p.pos_weight, count)
    else:
        grads, logits = vmap(grads_of)(p.w, xb, yb, p.pos_weight, count, weight)
    with torch.no_grad():
        adam(p, grads, plain)
        decay = torch.minimum((1 + p.ema_step) / (10 + p.ema_step), p.ema_decay)
        avg_weight = (1.0 - decay if plain else torch.where(p.active, 1.0 - decay, 0.0)).float()
        p.flat_avg.lerp_(p.flat_w, avg_weight[:, None])
        if plain:
            p.ema_step.add_(1)
            p.base.add_(p.bs)
        else:
            p.ema_step.add_(p.active.double())
            p.base.add_(p.active.long() * p.bs)
        if sums:
            loss = F.binary_cross_entropy_with_logits(logits, yb, weight=weight, pos_weight=p.pos_weight[:, None],
                                                      reduction="none").sum(1) / count
            right = (logits >= 0) == (yb >= 0.5)
            hits = (right if plain else right & valid).sum(1)
            p.hits.add_(torch.where(p.summing, hits, 0))
            p.loss_sum.add_(torch.where(p.summing, loss, 0.0))


def adam(p: Pack, grads: dict[str, torch.Tensor], plain: bool = False) -> None:
    """torch's single-tensor Adam (L2 weight decay in the gradient), over the stacked runs' flat buffers, element
    by element as it runs over each tensor: each run its own learning rate, weight decay and step count (broadcast
    along its row); a run sitting the step out keeps its tensors. `plain` (every run active): written in place,
    the same values without the three masked passes over every run's parameters."""
    beta1, beta2 = p.betas
    steps = p.adam_steps + (1 if plain else p.active.double())
    step_size = (p.lr / (1 - beta1 ** steps)).float()[:, None]
    bc2_sqrt = torch.sqrt(1 - beta2 ** steps).float()[:, None]
    w = p.flat_w
    g = torch.cat([t for k in p.names for t in (grads[k].reshape(p.r, -1), *(
        [p.gaps[k]] if k in p.gaps else []))], dim=1) + p.wd[:, None] * w
    if plain:
        m = p.flat_m.lerp_(g, 1 - beta1)
        v = p.flat_v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        w.add_((-step_size * m) / (v.sqrt() / bc2_sqrt).add_(p.eps))
    else:
        m = p.flat_m.lerp(g, 1 - beta1)
        v = p.flat_v.mul(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / bc2_sqrt).add_(p.eps)
        new_w = w + (-step_size * m) / denom
        active = p.active[:, None]
        torch.where(active, new_w, w, out=p.flat_w)  # in place: one pass each, not a pass and a copy
        torch.where(active, m, p.flat_m, out=p.flat_m)
        torch.where(active, v, p.flat_v, out=p.flat_v)
    p.adam_steps.copy_(steps)


ALIGN = 128  # elements: each parameter's slice of a row, and each row, starts on 512 bytes (as a tensor of its own)


def stacked_sizes(blocks: dict[str, torch.Tensor]) -> dict[str, int]:
    """Elements of one run's block of each parameter."""
    return {k: b[0].numel() for k, b in blocks.items()}


def gaps(sizes: dict[str, int]) -> dict[str, int]:
    """The zeros after each parameter in a row that align the next one (and the row's end) to `ALIGN`."""
    return {k: -n % ALIGN for k, n in sizes.items() if n % ALIGN}


def flat(blocks: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One [R, P] buffer holding every [R, ...] block along its rows (a run's parameters in one row, each starting
    aligned, the gaps zeros), and each block as a view of it (same shapes, written through)."""
    sizes, pads = stacked_sizes(blocks), gaps(stacked_sizes(blocks))
    first = next(iter(blocks.values()))
    buffer = torch.cat([t for k, b in blocks.items() for t in (b.reshape(len(b), -1), *(
        [torch.zeros((len(b), pads[k]), dtype=b.dtype, device=b.device)] if k in pads else []))], dim=1)
    views, at = {}, 0
    for k, b in blocks.items():
        views[k] = buffer[:, at:at + sizes[k]].view(len(b), *b.shape[1:])
        at += sizes[k] + pads.get(k, 0)
    assert buffer.shape == (len(first), at)
    return buffer, views
