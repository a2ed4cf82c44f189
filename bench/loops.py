"""The training loops the benchmarks time: the eager bare loop (`make bench`'s ideal for the CPU worker, and the
GPU's baseline at the default), the product's own step with nothing around it, and a packed sweep.

`bare_loop` is the ideal the worker is compared with on CPU: the same model, optimiser, loss, weight averaging,
batch size and epochs on tensors already in device memory, written out eagerly. `trainer_loop` and
`packed_loop` run the product's training code (`Trainer.train_shard`: the captured GPU step on CUDA, the eager
loop on CPU; `packed.Pack`) without queue, files or checkpoints, and may stop after a time budget so that one
short visit to a GPU can time them: their figures are samples per second over the steps they ran.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from workload.model import gpustep, packed
from workload.model.trainer import FraudMLP, HParams, Normalizer, Trainer, average, decay_at

SHARD = "training/shard.parquet"


def bench_seed(seed: int, shard: str, epoch: int) -> int:
    """Each packed run's batch order in the benchmark: its own per epoch (what is timed does not depend on it)."""
    return (seed * 1_000_003 + epoch) & 0x7FFF_FFFF


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bare_loop(x: np.ndarray, y: np.ndarray, hp: HParams, device: torch.device) -> float:
    """Seconds for the ideal: the same model, optimiser, loss, weight averaging, batch size and epochs on
    tensors already normalised and in device memory; no queue, files, features, checkpoints or evaluation."""
    torch.manual_seed(hp.seed)
    model = FraudMLP(x.shape[1], hp.hidden).to(device)
    averaged = FraudMLP(x.shape[1], hp.hidden).to(device)
    averaged.load_state_dict(model.state_dict())
    params, averages = list(model.parameters()), list(averaged.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    norm = Normalizer(x.shape[1])
    norm.update(x)
    xs, ys = norm.apply(x, device), torch.from_numpy(y).to(device)
    n = len(ys)
    positives = float(ys.sum())
    pos_weight = min(max((n - positives) / positives, 1.0), hp.pos_weight_cap) if positives else 1.0
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pos_weight, device=device))
    gen = torch.Generator().manual_seed(hp.seed)
    step = 0
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(hp.epochs):
        order = torch.randperm(n, generator=gen).to(device)
        for b in range(math.ceil(n / hp.batch_size)):
            idx = order[b * hp.batch_size:(b + 1) * hp.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(xs[idx]), ys[idx]).backward()
            optimizer.step()
            average(averages, params, decay_at(hp.ema_decay, step))  # part of the training algorithm: paid here too
            step += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def trained(t: Trainer, rows: int) -> int:
    """Rows trained so far in the trainer's day (its progress; all of them once it is finished)."""
    if t.progress is None or t.progress["epoch"] >= t.progress["epochs"]:
        return rows * (t.progress["epochs"] if t.progress else t.hp.epochs)
    return t.progress["epoch"] * rows + min(t.progress["batch"] * t.hp.batch_size, rows)


def trainer_loop(x: np.ndarray, y: np.ndarray, hp: HParams, device: torch.device,
                 budget_s: float = math.inf) -> tuple[int, float]:
    """(samples, seconds): a fresh run's day through `Trainer.train_shard` (the product's step: captured and
    replayed on CUDA, eager on CPU), stopped at the first batch boundary after `budget_s`. The day's move to the
    device and the graph's capture count: they are part of a day."""
    names = tuple(f"f{i}" for i in range(x.shape[1]))
    t = Trainer("bench", hp, names, device)
    t.begin_shard(SHARD, x)
    sync(device)
    started = time.perf_counter()
    t.train_shard(x, y, lambda: time.perf_counter() - started < budget_s)
    sync(device)
    return trained(t, len(y)), time.perf_counter() - started


@contextmanager
def steps_per_replay(count: int) -> Iterator[None]:
    """The product's step (`Trainer.train_shard` on CUDA, and so the worker's) with `count` full batches a replay
    (`gpustep.STEPS_PER_REPLAY`), for a while: what a graph of several steps buys, before it is a default."""
    before = gpustep.STEPS_PER_REPLAY
    gpustep.STEPS_PER_REPLAY = count
    try:
        yield
    finally:
        gpustep.STEPS_PER_REPLAY = before


def sweep_hparams(hp: HParams, runs: int) -> list[HParams]:
    """A sweep's runs as a user declares one: seeds, learning rates and weight decays that differ."""
    lrs, decays = (hp.lr, hp.lr / 2, hp.lr * 2, hp.lr / 4), (hp.weight_decay, 0.0, hp.weight_decay * 10)
    return [replace(hp, seed=r, lr=lrs[r % len(lrs)], weight_decay=decays[r % len(decays)]) for r in range(runs)]


def packed_loop(x: np.ndarray, y: np.ndarray, hp: HParams, runs: int, device: torch.device,
                budget_s: float = math.inf) -> tuple[int, float]:
    """(samples over all runs, seconds): a sweep of `runs` fresh runs trained as one stacked model
    (`packed.Pack`: captured and replayed on CUDA), every run stopped at the same step after `budget_s`."""
    names = tuple(f"f{i}" for i in range(x.shape[1]))
    trainers = [Trainer(f"run{r}", h, names, device) for r, h in enumerate(sweep_hparams(hp, runs))]
    for t in trainers:
        t.begin_shard(SHARD, x)
    pack = packed.Pack(trainers, bench_seed)
    clock = {"stop": False}

    def after_step(r: int) -> bool:
        if r == 0:
            clock["stop"] = time.perf_counter() - started >= budget_s
        return not clock["stop"]

    sync(device)
    started = time.perf_counter()
    pack.train_shard(x, y, after_step)
    sync(device)
    seconds = time.perf_counter() - started
    return sum(trained(t, len(y)) for t in trainers), seconds


@dataclass(frozen=True)
class StepProfile:
    """What one step launches, from torch's profiler over `steps` eager steps (the graph replays the same kernels):
    on CUDA its kernels and their GPU time, on CPU its operators and their CPU time."""

    runs: int
    steps: int
    kinds: str  # "kernels" (CUDA) or "operators" (CPU)
    per_step: float  # kernels (operators) a step
    us_per_step: float  # their time a step, microseconds
    top: list[tuple[str, float, float]]  # (name, count a step, microseconds a step), the costliest first

    def lines(self) -> list[str]:
        head = (f"{self.runs} run(s), {self.steps} eager steps: {self.per_step:.1f} {self.kinds} a step, "
                f"{self.us_per_step:,.0f} us of their time a step")
        return [head, *(f"    {us:8.1f} us {count:5.1f}x  {name[:100]}" for name, count, us in self.top)]


def step_profile(x: np.ndarray, y: np.ndarray, hp: HParams, device: torch.device, runs: int = 1,
                 steps: int = 20, warm: int = 5) -> StepProfile:
    """Profile `steps` steps of the product's step run eagerly (`capture=False`: a graph's replay hides its kernels
    from the profiler, but replays the same ones) after `warm` steps, for one run or a pack of `runs`."""
    names = tuple(f"f{i}" for i in range(x.shape[1]))
    trainers = [Trainer(f"run{r}", h, names, device) for r, h in enumerate(sweep_hparams(hp, runs))]
    for t in trainers:
        t.begin_shard(SHARD, x)

    def train(n: int) -> None:
        count = [0] * runs

        def more(r: int = 0) -> bool:
            count[r] += 1
            return count[r] < n

        if runs == 1:
            gpustep.train_shard(trainers[0], x, y, more, bench_seed, capture=False, fused=device.type == "cuda")
        else:
            packed.Pack(trainers, bench_seed, capture=False).train_shard(x, y, more)
        sync(device)

    train(warm)
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]
    before = trainers[0].steps
    with torch.profiler.profile(activities=activities) as prof:
        train(steps)
    steps = max(trainers[0].steps - before, 1)  # fewer when the day ends first
    events = [e for e in prof.key_averages()
              if (e.device_type == torch.autograd.DeviceType.CUDA) == cuda and (cuda or e.key.startswith("aten::"))]

    def us(e: object) -> float:
        return float(getattr(e, "self_device_time_total", 0.0) if cuda else getattr(e, "self_cpu_time_total", 0.0))

    events.sort(key=us, reverse=True)
    return StepProfile(runs, steps, "kernels" if cuda else "operators", sum(e.count for e in events) / steps,
                       sum(map(us, events)) / steps, [(e.key, e.count / steps, us(e) / steps) for e in events[:12]])
