"""The training step shaped for a GPU: captured once as a CUDA graph, replayed for every batch of a day.

On CUDA the eager step (trainer.py) is bound by kernel launches and Python, not by the GPU: an H200 trained
the default run at 61,438 samples/s, slower than one CPU core, and every batch size cost the same ~2 ms a step
(issue 33). Here the whole step (gather the batch, forward, class-weighted loss, backward, Adam, the weight
average, the last epoch's accuracy and loss sums) is one function of tensors kept at fixed addresses, captured
once and replayed, so a step is one launch. Nothing in the loop waits for the GPU: the weight average's place in
the day's table of weights, the batch's offset and the sums live on the device; the host keeps its own count of
steps and progress (it knows them without asking), and reads the device only when a checkpoint is written.

On an H200 (2026-11-28) the replayed step cost the same ~150-170 us at batches of 128 and 1,024 rows (bench.gpu):
it is bound by what it launches, kernel after small kernel, not by its arithmetic or the host. So the day's
averaging weights are computed once on the host (one lookup a step instead of six kernels of arithmetic) and the
last epoch's accuracy and loss sums are taken only in the last epoch (a second graph, with them). For the same
reason a step seeds its backward with the loss's gradient (`loss_gradient`: torch's own backward of the loss,
operator for operator, so the same bits) and runs the loss's forward only where its value is summed.

The meaning is the eager step's:
- the same batches in the same order: each epoch's permutation is drawn by the same CPU generator as today
  (CUDA's randperm draws another) and copied to the device once per epoch;
- the same arithmetic, except Adam: on CUDA the fused, capturable Adam (its step count and bias corrections on
  the device, in float32) replaces the default one, which computes them on the host and cannot be replayed.
  It shares the trainer's optimizer state, so checkpoints keep their format (only `step` lives on the device);
- the same function runs eagerly (`capture=False`): on CPU with the trainer's own Adam it equals the eager
  trainer bit for bit, and with the fused Adam within a stated tolerance (tests/model/test_gpustep.py); on CUDA
  the replayed graph equals the same function run eagerly, and a run killed and resumed equals an undisturbed
  one bit for bit (tests skipped without a GPU).

A day's full batches replay a graph; its last, shorter batch runs the same function eagerly (one step an
epoch). A graph is captured on first use and again only when a day outgrows the buffers or the optimizer's
tensors were replaced (a checkpoint loaded into the same trainer). A torch or GPU that cannot record the step
runs it eagerly, with the same meaning, and the log says so (`capture_or_none`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger(__name__)

WARMUP_STEPS = 3  # eager steps on a side stream before capture (torch's CUDA graphs recipe); undone after
# Full batches one replay trains (`Step.run`'s `count`). 1: a graph of one step, as measured on an H200 (~150 us a
# step at batches of 128: launch-bound, small kernels one after another). More: the batches' rows and the weight
# average's weights of `count` steps gathered at once, the weights and their average each in one buffer (the average
# one kernel a step, not one a tensor), then the steps one after another in one graph: 24.25 operators a step
# instead of 35 (counted at dispatch, the default run, 4 a replay; 30 and 40 while each step ran the loss), each step
# the same arithmetic on the same values (tests/model/test_gpustep.py), the
# host asked after every `count` steps whether to checkpoint or stop. The default stays 1 until a GPU has measured
# what more buys (`bench.gpu --per-replay`); a stated count is used where it fits (a day's remaining full batches),
# single steps elsewhere.
STEPS_PER_REPLAY = 1
ShardSeed = Callable[[int, str, int], int]  # (run seed, shard, epoch) -> the epoch's generator seed


def wanted(device: torch.device) -> bool:
    """The GPU-shaped step trains on CUDA; the CPU keeps the eager step, bit for bit as it always trained."""
    return device.type == "cuda"


def fused_adam(optimizer: torch.optim.Optimizer) -> torch.optim.Adam:
    """A fused, capturable Adam over the same parameters, hyperparameters and state as `optimizer` (the
    trainer's): its steps are the trainer's steps, and the trainer's `state_dict` saves them."""
    group = optimizer.param_groups[0]
    fused = torch.optim.Adam(group["params"], lr=group["lr"], betas=group["betas"], eps=group["eps"],
                             weight_decay=group["weight_decay"], fused=True,
                             capturable=group["params"][0].device.type == "cuda")
    fused.state = optimizer.state
    return fused


class Step:
    """One run's step and the tensors it reads and writes, all on the run's device. In capture mode they
    stay at fixed addresses (a day's rows are copied into buffers that only grow), as a graph needs."""

    def __init__(self, model: nn.Module, averaged: nn.Module, optimizer: torch.optim.Optimizer,
                 batch_size: int, ema_decay: float, capture: bool, per_replay: int = 1) -> None:
        self.model, self.optimizer, self.capture = model, optimizer, capture
        self.requested = capture  # `capture` turns False for good when this torch and GPU cannot record the step
        self.params, self.averages = list(model.parameters()), list(averaged.parameters())
        self.batch_size, self.ema_decay, self.per_replay = batch_size, ema_decay, max(1, per_replay)
        device = self.params[0].device
        self.arange = torch.arange(self.per_replay * batch_size, device=device)  # a replay's rows, or its steps
        # Several steps a replay: the weights and their average each in one buffer (the parameters re-pointed to
        # slices of it, values unchanged), so that the average is one kernel a step instead of one a tensor.
        self.flat: tuple[torch.Tensor, torch.Tensor] | None = (
            (flatten(self.params), flatten(self.averages)) if self.per_replay > 1 else None)
        self.base = torch.zeros((), dtype=torch.int64, device=device)  # the batch's first position in the order
        # The weight average's weight at each of the day's steps (computed on the host, as the eager step computes
        # it) and the step's place in that table: one lookup a step instead of the decay's arithmetic on the device.
        self.weights = torch.zeros(0, device=device)
        self.k = torch.zeros((), dtype=torch.int64, device=device)
        self.pos_weight = torch.ones((), device=device)
        self.hits = torch.zeros((), dtype=torch.int64, device=device)  # last epoch: rows classified right
        self.loss_sum = torch.zeros((), device=device)  # last epoch: batch losses, summed
        n_features = self.params[0].shape[1]
        self.xs = torch.zeros((0, n_features), device=device)
        self.ys = torch.zeros(0, device=device)
        # Each row's share of the loss's gradient that does not depend on the weights (`loss_factors`), once a day.
        self.t_rows, self.a_rows = torch.zeros(0, device=device), torch.zeros(0, device=device)
        self.order = torch.zeros(0, dtype=torch.int64, device=device)
        # torch.cuda.CUDAGraph per (steps a replay trains, `sums`: the last epoch's step sums), as captured
        self.graphs: dict[tuple[int, bool], Any] = {}
        self.captured_on: tuple[int, ...] = ()

    # -- what the host hands the device: once a day, once an epoch ----------------------------------------
    def load_day(self, xs: torch.Tensor, ys: torch.Tensor, pos_weight: float, steps: int, ahead: int) -> None:
        """The day's rows, its class weight, and the weight average's weights for the `ahead` steps that follow
        the run's `steps` so far."""
        self.pos_weight.fill_(pos_weight)
        weights = average_weights(self.ema_decay, steps, ahead).to(xs.device)
        t_rows, a_rows = loss_factors(ys, self.pos_weight)
        self.k.zero_()
        if not self.capture:
            self.xs, self.ys, self.weights, self.t_rows, self.a_rows = xs, ys, weights, t_rows, a_rows
            return
        n = len(ys)
        if n > len(self.ys):  # grow (and capture again): a graph reads the buffers it was captured with
            self.xs = torch.zeros((n, xs.shape[1]), device=xs.device)
            self.ys, self.t_rows, self.a_rows = (torch.zeros(n, device=ys.device) for _ in range(3))
            self.order = torch.zeros(n, dtype=torch.int64, device=ys.device)  # zeros: valid rows, always
            self.graphs = {}
        if ahead > len(self.weights):
            self.weights = torch.zeros(ahead, device=xs.device)
            self.graphs = {}
        self.xs[:n].copy_(xs)
        self.ys[:n].copy_(ys)
        self.t_rows[:n].copy_(t_rows)
        self.a_rows[:n].copy_(a_rows)
        self.weights[:ahead].copy_(weights)
        if self.captured_on != self._addresses():  # a checkpoint loaded into the trainer replaced its tensors
            self.graphs = {}

    def load_order(self, order: torch.Tensor, first_batch: int) -> None:
        if self.capture:
            self.order[:len(order)].copy_(order)
        else:
            self.order = order.to(self.ys.device)
        self.base.fill_(first_batch * self.batch_size)

    def begin_sums(self, correct: torch.Tensor | None, loss_sum: torch.Tensor | None) -> None:
        """The last epoch's sums start from what a checkpoint carried (the count) or from zero."""
        self.hits.copy_(correct) if correct is not None else self.hits.zero_()
        self.loss_sum.copy_(loss_sum) if loss_sum is not None else self.loss_sum.zero_()

    # -- the step ---------------------------------------------------------------------------------------
    def run(self, size: int, sums: bool, count: int = 1) -> None:
        """`count` steps (more than one: full batches only) over the next `size` rows of the order each, adding to the
        step sums when `sums` (the last epoch's): replayed when they are full batches on CUDA (a graph per `count`
        and `sums`)."""
        if not self.capture or size != self.batch_size:
            steps(self, size, sums, count)
            return
        graph = self.graphs.get((count, sums))
        if graph is None:
            graph = self.graphs[(count, sums)] = capture_or_none("the training step",
                                                                 lambda: self._capture(sums, count))
            if graph is None:
                self.capture = False  # the buffers stay where they are: the eager step reads them alike
                steps(self, size, sums, count)
                return
        graph.replay()

    def _tensors(self) -> list[torch.Tensor]:
        state = [v for p in self.params for v in self.optimizer.state[p].values() if isinstance(v, torch.Tensor)]
        return [*self.params, *self.averages, *state, self.base, self.k, self.weights, self.hits, self.loss_sum]

    def _addresses(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in self._tensors())

    def _capture(self, sums: bool, count: int) -> Any:
        prepare_state(self.optimizer, self.params)

        def warm_step() -> None:
            self.base.zero_()
            self.k.zero_()
            steps(self, self.batch_size, sums, count)

        self.optimizer.zero_grad(set_to_none=True)
        graph = capture(lambda: steps(self, self.batch_size, sums, count), warm_step, self._tensors())
        self.captured_on = self._addresses()
        return graph


def capture(run_step: Callable[[], None], warm_step: Callable[[], None], state: list[torch.Tensor]) -> Any:
    """A CUDA graph of `run_step`. Warms up first on a side stream (lazy initialisation, cuBLAS's workspace:
    torch's CUDA graphs recipe) with `warm_step`, then puts every tensor of `state` back as it was, exactly:
    recording runs nothing, so the run's state is what it was before the call."""
    before = [t.detach().clone() for t in state]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                warm_step()
    finally:
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():
            for t, saved in zip(state, before, strict=True):
                t.copy_(saved)
    graph = torch.cuda.CUDAGraph()
    # thread_local: the worker's heartbeat and watchdog threads may run while this thread records.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        run_step()
    return graph


def capture_or_none(what: str, record: Callable[[], Any]) -> Any:
    """`record()`'s graph, or None when this torch and GPU cannot record the step: then it runs eagerly,
    slower and with the same meaning (the state was put back), and the log says why once."""
    try:
        return record()
    except RuntimeError as exc:
        if torch.cuda.is_available():
            with contextlib.suppress(RuntimeError):  # what the failed recording left on the stream, if anything
                torch.cuda.synchronize()
        log.warning("%s could not be captured as a CUDA graph (%s): it runs eagerly, slower, same meaning", what,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None


def prepare_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """Adam's state as the fused, capturable Adam wants it: created now (zeros, as Adam's first step would),
    its step count on the parameters' device in float32. A no-op for the default Adam on CPU."""
    if not optimizer.param_groups[0].get("fused"):
        return
    for p in params:
        st = optimizer.state[p]
        if not st:
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        elif st["step"].device != p.device:
            st["step"] = st["step"].to(device=p.device, dtype=torch.float32)


def steps(s: Step, size: int, sums: bool, count: int = 1) -> None:
    """The trainer's step as a function of device tensors, `count` times: the same batches (positions `base` ..
    `base + count * size` of the order, `size` rows a step), and for each its loss, backward, Adam step, weight
    average (its weight from the day's table, `average_weights`) and, when `sums`, the last epoch's sums. The
    batches' rows and weights are gathered for all `count` steps at once; each step reads its own contiguous rows."""
    rows = s.order[s.base + s.arange[:count * size]]
    xs, ts, as_ = s.xs[rows], s.t_rows[rows], s.a_rows[rows]
    ys = s.ys[rows] if sums else None  # the labels themselves: only the last epoch's sums read them
    # not weights[k]: the host may read a 0-dim index
    weights = s.weights.index_select(0, s.k + s.arange[:count]) if count > 1 else s.weights.index_select(
        0, s.k.view(1))
    for i in range(count):
        batch = slice(i * size, (i + 1) * size)
        step(s, xs[batch], (ts[batch], as_[batch]), None if ys is None else ys[batch], weights[i], sums)
    s.k.add_(count)
    s.base.add_(count * size)


def step(s: Step, x: torch.Tensor, factors: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor | None,
         weight: torch.Tensor, sums: bool) -> None:
    """One step on the batch `x` (its rows' `loss_factors`; its labels `target` when `sums`): the loss's gradient,
    backward, Adam step, the weight average at `weight`, and the last epoch's sums when `sums`."""
    s.optimizer.zero_grad(set_to_none=True)
    logits = s.model(x)
    with torch.no_grad():
        grad = gradient_from(logits.detach(), *factors)
    logits.backward(grad)
    s.optimizer.step()
    with torch.no_grad():
        if s.flat is not None:
            s.flat[1].lerp_(s.flat[0], weight)
        else:
            for a, p in zip(s.averages, s.params, strict=True):
                a.lerp_(p, weight)
        if sums:
            assert target is not None
            s.hits.add_(((logits.detach() >= 0) == (target >= 0.5)).sum())
            s.loss_sum.add_(F.binary_cross_entropy_with_logits(logits.detach(), target, pos_weight=s.pos_weight))


def loss_gradient(logits: torch.Tensor, target: torch.Tensor, pos_weight: torch.Tensor) -> torch.Tensor:
    """The gradient of the class-weighted loss (`F.binary_cross_entropy_with_logits`, mean over the batch) with
    respect to `logits`, computed as torch's own backward of it computes it, operator for operator (its
    `binary_cross_entropy_with_logits_backward`, the same formula for years: ``t = pos_weight * target;
    ((t + 1 - target) * sigmoid(logits) - t) * 1 / n``, the upstream gradient 1 left out: x * 1 is x), so the bits
    are the same (tests/model/test_gpustep.py: torch 2.13 on CPU here, and on CUDA where a GPU runs it). Without the
    loss's value a step does not run its forward (about nine kernels on CUDA: log-sigmoid, weights, mean) nor the
    gradient's seed and scaling: 7 operators instead of 18 kernels, on a step that is launch-bound (issue 33). The
    last epoch's steps, which sum the loss, compute its value apart."""
    return gradient_from(logits, *loss_factors(target, pos_weight))


def loss_factors(target: torch.Tensor, pos_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The part of `loss_gradient` that does not depend on the weights, row by row: ``t = pos_weight * target`` and
    ``t + 1 - target``. Each element's value is the same whether taken for a batch or for the whole day, so a day
    takes them once (`Step.load_day`) and a step gathers them with its rows: 4 operators a step instead of 7."""
    t = pos_weight.mul(target)
    return t, t.add(1).sub_(target)


def gradient_from(logits: torch.Tensor, t: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """`loss_gradient` from its factors (`loss_factors`): ``(a * sigmoid(logits) - t) / n``, as torch orders it."""
    return a.mul(logits.sigmoid()).sub_(t).div_(logits.numel())


ALIGN = 128  # elements: each slice of a flat buffer starts on 512 bytes, as the CUDA allocator places a tensor


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One buffer holding `tensors`' values, each tensor re-pointed to its slice (the same values and shape, its
    start aligned as a tensor of its own is, so that its kernels stay the ones it had); the gaps hold zeros."""
    sizes = [math.ceil(t.numel() / ALIGN) * ALIGN for t in tensors]
    buffer = torch.zeros(sum(sizes), dtype=tensors[0].dtype, device=tensors[0].device)
    at = 0
    with torch.no_grad():
        for t, size in zip(tensors, sizes, strict=True):
            view = buffer[at:at + t.numel()].view_as(t)
            view.copy_(t)
            t.data = view
            at += size
    return buffer


def average_weights(ema_decay: float, steps: int, ahead: int) -> torch.Tensor:
    """The weight average's weight (`1 - trainer.decay_at`) at steps `steps` .. `steps + ahead - 1`, computed in
    float64 as the eager step computes it and rounded to float32 as lerp rounds it."""
    k = np.arange(steps, steps + ahead, dtype=np.float64)
    return torch.from_numpy(1.0 - np.minimum(ema_decay, (1 + k) / (10 + k))).float()


_STEPS: weakref.WeakKeyDictionary[Any, Step] = weakref.WeakKeyDictionary()


def step_for(trainer: Any, capture: bool, fused: bool, per_replay: int = 1) -> Step:
    """The trainer's Step, made once per trainer and mode (its graph outlives a day)."""
    s = _STEPS.get(trainer)
    mode = (capture, fused, max(1, per_replay))
    if s is None or (s.requested, bool(s.optimizer.param_groups[0].get("fused")), s.per_replay) != mode:
        optimizer = fused_adam(trainer.optimizer) if fused else trainer.optimizer
        s = Step(trainer.model, trainer.averaged, optimizer, trainer.hp.batch_size, trainer.hp.ema_decay, capture,
                 per_replay)
        _STEPS[trainer] = s
    if fused:
        s.optimizer.state = trainer.optimizer.state  # a loaded checkpoint may have replaced the mapping
        prepare_state(s.optimizer, s.params)
    return s


def train_shard(trainer: Any, x: np.ndarray, y: np.ndarray, after_step: Callable[[], bool], shard_seed: ShardSeed,
                capture: bool | None = None, fused: bool | None = None, per_replay: int | None = None) -> bool:
    """`Trainer.train_shard` with the GPU-shaped step: the same contract (train from `trainer.progress` to the
    end of the shard on the window's rows `x`, `y`; `after_step()` at every batch boundary a replay ends at, False
    stops; True when finished), the same progress, step count and last-epoch sums in the trainer as the eager loop
    leaves. `capture`, `fused`: replay a CUDA graph, use the fused Adam (default: both on CUDA, neither elsewhere);
    `per_replay`: full batches a replay trains where they fit (default `STEPS_PER_REPLAY`)."""
    assert trainer.progress is not None, "begin_shard first"
    shard, hp, device = trainer.progress["shard"], trainer.hp, trainer.device
    on_cuda = device.type == "cuda"
    s = step_for(trainer, on_cuda if capture is None else capture, on_cuda if fused is None else fused,
                 STEPS_PER_REPLAY if per_replay is None else per_replay)
    xs = trainer.norm.apply(x, device)  # the day's tensors move to the device once
    ys = torch.from_numpy(np.asarray(y, dtype=np.float32)).to(device)
    n = len(ys)
    positives = float(ys.sum())
    batches = math.ceil(n / hp.batch_size)
    epochs = int(trainer.progress.get("epochs", hp.epochs))  # a format-2 checkpoint's progress has none
    start = trainer.progress["epoch"]
    s.load_day(xs, ys, min(max((n - positives) / positives, 1.0), hp.pos_weight_cap) if positives else 1.0,
               trainer.steps, max(epochs - start, 0) * batches)
    trainer.model.train()
    perms = epoch_orders(n, lambda e: shard_seed(hp.seed, shard, e), start, epochs, ahead=s.requested)
    with contextlib.closing(perms):
        for epoch, perm in zip(range(start, epochs), perms, strict=False):
            first, last_epoch = trainer.progress["batch"], epoch == epochs - 1
            s.load_order(perm, first)
            if last_epoch and first < batches:
                s.begin_sums(trainer._correct, trainer._loss_sum)
            b, full = first, n // hp.batch_size
            while b < batches:
                count = s.per_replay if b + s.per_replay <= full else 1
                s.run(min(hp.batch_size, n - b * hp.batch_size), last_epoch, count)
                b += count
                trainer.steps += count
                if last_epoch:  # the device's running sums: read only when a checkpoint or the report asks
                    trainer._correct, trainer._loss_sum = s.hits, s.loss_sum
                trainer.progress = {"shard": shard, "epoch": epoch, "batch": b, "epochs": epochs}
                if not after_step():
                    return False
            trainer.progress = {"shard": shard, "epoch": epoch + 1, "batch": 0, "epochs": epochs}
    return True


def epoch_orders(n: int, seed_of: Callable[[int], int], start: int, epochs: int, ahead: bool) -> Iterator[torch.Tensor]:
    """Each epoch's permutation from `start` on, by the CPU generator the eager loop uses (the same batches); with
    `ahead`, the next one is drawn on a thread while this one trains (a 1M-row randperm costs 10-30 ms)."""
    def draw(epoch: int) -> torch.Tensor:
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed_of(epoch)))

    if not ahead:
        yield from (draw(e) for e in range(start, epochs))
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        upcoming = pool.submit(draw, start)
        for e in range(start, epochs):
            current = upcoming.result()
            if e + 1 < epochs:
                upcoming = pool.submit(draw, e + 1)
            yield current
