"""The GPU-shaped step means what the eager step means: on CPU the same function, run eagerly, trains a run bit
for bit as `Trainer.train_shard` does (the fused Adam within a stated tolerance); on CUDA the replayed graph
equals the same function run eagerly, and a run killed and resumed equals an undisturbed one, bit for bit
(those skip without a GPU and run on the GPU machine)."""

from __future__ import annotations

import dataclasses
import functools
import io
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from tests.model.dispatch import Dispatched
from workload.model import gpustep, lineage
from workload.model.trainer import HParams, Trainer, _shard_seed

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
FEATURES = ("a", "b", "c", "d")
HP = HParams(hidden=(8, 4), epochs=2, batch_size=64, ema_decay=0.9, window_days=1)
# Fused Adam (torch's `_fused_adam_`) computes the bias corrections and the update in float32 in one kernel where
# the default Adam computes them in float64 on the host: after 2 days x 2 epochs x 11 batches the weights agree to
# this (measured ~1e-7 apart on CPU).
FUSED_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """This MLP's matrices are too small for intra-op threads; on the loaded 2-core CI machine two made
    these runs 10x slower (as bench/run.py found for the worker)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _day(seed: int, n: int = 700) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.1).astype(np.float32)
    x = (rng.normal(size=(n, 4)) + y[:, None]).astype(np.float32)
    return x, y


Train = Callable[[Trainer, np.ndarray, np.ndarray, Callable[[], bool]], bool]


def eager(trainer: Trainer, x: np.ndarray, y: np.ndarray, after_step: Callable[[], bool]) -> bool:
    return trainer.train_shard(x, y, after_step)


def shaped(capture: bool, fused: bool, per_replay: int = 1) -> Train:
    def train(trainer: Trainer, x: np.ndarray, y: np.ndarray, after_step: Callable[[], bool]) -> bool:
        return gpustep.train_shard(trainer, x, y, after_step, _shard_seed, capture=capture, fused=fused,
                                   per_replay=per_replay)
    return train


def reload(trainer: Trainer) -> Trainer:
    """A kill: the state dict through bytes, read back onto the CPU (as the checkpoint store does), a new trainer
    from it."""
    buf = io.BytesIO()
    torch.save(lineage.checkpoint_of(trainer), buf)
    buf.seek(0)
    return lineage.trainer_from(torch.load(buf, weights_only=True, map_location="cpu"), trainer.device)


def run(train: Train, device: torch.device, stop_at: int | None = None, days: int = 2) -> Trainer:
    """`days` days (700 rows: 10 full batches and one of 60); with `stop_at`, the second day is stopped after
    that many steps, reloaded from its state dict alone, and finished."""
    trainer = Trainer("r", HP, FEATURES, device, feature_version="v")
    for i in range(days):
        shard = f"d{i}"
        x, y = _day(i)
        trainer.begin_shard(shard, x)
        count = {"n": 0}

        def after_step(count: dict = count, i: int = i) -> bool:
            count["n"] += 1
            return stop_at is None or i != 1 or count["n"] != stop_at

        if not train(trainer, x, y, after_step):
            trainer = reload(trainer)
            trainer.begin_shard(shard, x)
            assert train(trainer, x, y, lambda: True)
        # The loss sum is this process's (a resumed run sums what it trained since): kept when none was stopped.
        loss = {"loss": trainer.last_epoch_loss()} if stop_at is None else {}
        trainer.finish_shard({"shard": shard, "train_accuracy": trainer.train_accuracy(len(y)), **loss})
    return trainer


@functools.cache
def eager_cpu() -> Trainer:
    """The eager trainer's undisturbed run on CPU, which every CPU test compares with (read, never trained on)."""
    return run(eager, torch.device("cpu"))


def tensors(trainer: Trainer) -> dict[str, torch.Tensor]:
    state = lineage.checkpoint_of(trainer)
    out = {f"model.{k}": v for k, v in state["model"].items()}
    out |= {f"averaged.{k}": v for k, v in state["averaged"].items()}
    for i, st in state["optimizer"]["state"].items():
        out |= {f"adam.{i}.{k}": v.detach().cpu().float() for k, v in st.items()}
    return out


def assert_equal(a: Trainer, b: Trainer) -> None:
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys()
    different = [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert different == [], f"differ: {different}"
    no_loss = [[{k: v for k, v in h.items() if k != "loss"} for h in t.history] for t in (a, b)]
    assert (no_loss[0], a.steps) == (no_loss[1], b.steps)


def test_on_cpu_the_shaped_step_run_eagerly_equals_the_trainers_bit_for_bit() -> None:
    expected, got = eager_cpu(), run(shaped(capture=False, fused=False), torch.device("cpu"))
    assert_equal(expected, got)
    assert expected.steps == 2 * 2 * 11 and 0 < got.history[-1]["train_accuracy"] <= 1
    assert got.history[-1]["loss"] == expected.history[-1]["loss"] is not None


@pytest.mark.parametrize("stop_at", [3, 11, 12, 20, 22])  # first epoch, its end, the last epoch, its last step
def test_on_cpu_the_shaped_step_resumes_bit_for_bit(stop_at: int) -> None:
    assert_equal(eager_cpu(), run(shaped(capture=False, fused=False), torch.device("cpu"), stop_at=stop_at))


# 10 full batches an epoch and one of 60: 4 a replay is 0-3, 4-7, then 8, 9 and the short one alone; 10 is the whole
# epoch's full batches in one; 16 never fits (every step alone).
@pytest.mark.parametrize("per_replay", [2, 4, 10, 16])
def test_on_cpu_steps_gathered_for_several_batches_at_once_train_bit_for_bit_as_one_at_a_time(per_replay: int) -> None:
    """`STEPS_PER_REPLAY` above 1 (a GPU's graph of several steps) changes where the rows are gathered and when the
    host is asked, not what a step computes: the run equals the trainer's, and so does one stopped between two
    replays and resumed (a checkpoint only ever falls where a replay ends)."""
    cpu = torch.device("cpu")
    assert_equal(eager_cpu(), run(shaped(capture=False, fused=False, per_replay=per_replay), cpu))
    for stop_at in (1, 3, 6):
        assert_equal(eager_cpu(), run(shaped(capture=False, fused=False, per_replay=per_replay), cpu, stop_at=stop_at))


def test_a_replay_of_several_steps_asks_the_host_once_at_its_end() -> None:
    """The batch boundaries `after_step` sees with 4 steps a replay: where each replay ends, the last full batches
    and the short one alone; the progress a checkpoint would record is always one of them."""
    trainer = Trainer("r", HP, FEATURES, torch.device("cpu"), feature_version="v")
    x, y = _day(0)
    trainer.begin_shard("d0", x)
    seen: list[tuple[int, int, int]] = []

    def after_step() -> bool:
        seen.append((trainer.progress["epoch"], trainer.progress["batch"], trainer.steps))
        return True

    assert shaped(capture=False, fused=False, per_replay=4)(trainer, x, y, after_step)
    assert seen == [(e, b, e * 11 + b) for e in range(2) for b in (4, 8, 9, 10, 11)]


def test_flattening_keeps_each_tensors_values_shape_and_gradient_and_aligns_its_slice() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    buffer = gpustep.flatten(params)
    assert len(buffer) == len(params) * gpustep.ALIGN  # each of these fits in one aligned slice
    for p, was in zip(params, before, strict=True):
        assert torch.equal(p, was) and p.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        assert (p.data_ptr() - buffer.data_ptr()) % (gpustep.ALIGN * buffer.element_size()) == 0
    model(torch.ones(2, 4)).sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in params)
    with torch.no_grad():
        buffer.add_(1)
    assert all(torch.equal(p, was + 1) for p, was in zip(params, before, strict=True))  # written through


def _operators_a_step(per_replay: int) -> float:
    """Operators one step of the default run dispatches, with `per_replay` steps a replay (the fused Adam, as on
    CUDA): measured over 8 replays, less what 4 cost (the day's own set-up cancels out)."""
    features = tuple(f"f{i}" for i in range(15))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4096, 15)).astype(np.float32), (rng.random(4096) < 0.05).astype(np.float32)
    counts = []
    for replays in (4, 8):
        trainer = Trainer("r", HParams(), features, torch.device("cpu"))
        trainer.begin_shard("d", x)
        calls = {"n": 0}

        def after_step(calls: dict = calls, replays: int = replays) -> bool:
            calls["n"] += 1
            return calls["n"] < replays

        with Dispatched() as seen:
            gpustep.train_shard(trainer, x, y, after_step, _shard_seed, capture=False, fused=True,
                                per_replay=per_replay)
        counts.append((seen.count, trainer.steps))
    (a, sa), (b, sb) = counts
    return (b - a) / (sb - sa)


def test_a_replay_of_several_steps_dispatches_a_quarter_fewer_operators_a_step() -> None:
    """What makes a replay of several steps cheaper on a launch-bound GPU: the rows and weights gathered once a
    replay, the weight average one operator (the loss gradient's operators are the same in both)."""
    one, four = _operators_a_step(1), _operators_a_step(4)
    # 35 and 24.25 with torch 2.13 (a replay's gathers shared by its 4 steps); 37 and 27 before the loss's factors
    # were taken once a day, 40 and 30 while each step ran the loss
    assert one - four == 10.75 and four / one <= 0.75, (one, four)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="needs a CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
def test_the_loss_gradient_is_torchs_own_backward_of_the_loss_to_the_bit(device: str) -> None:
    """The step seeds backward with the loss's gradient (`gpustep.loss_gradient`) instead of running the loss:
    it must be what autograd's backward of `binary_cross_entropy_with_logits` (mean, `pos_weight`) gives, bit for
    bit, for any class weight, batch size (the last, shorter batch too) and logits far out on either side."""
    gen = torch.Generator().manual_seed(7)
    for n in (1, 3, 97, 128, 1000):
        for pw in (1.0, 3.0, 7.31, 28.537, 99.99):
            logits = (torch.randn(n, generator=gen) * torch.tensor([0.1, 3.0, 40.0])[torch.arange(n) % 3]).to(device)
            target = (torch.rand(n, generator=gen) < 0.3).float().to(device)
            pos_weight = torch.tensor(pw, device=device)
            z = logits.clone().requires_grad_(True)
            torch.nn.functional.binary_cross_entropy_with_logits(z, target, pos_weight=pos_weight).backward()
            assert torch.equal(gpustep.loss_gradient(logits, target, pos_weight), z.grad), (n, pw)


def test_a_step_runs_no_loss_forward_until_its_last_epoch_sums_it() -> None:
    """What the gradient saves on CUDA, where the loss's forward is about nine kernels and its backward's seed and
    scaling two more: a step of the first epochs dispatches no loss at all; one of the last epoch (which sums the
    loss) does, once."""
    trainer = Trainer("r", HParams(epochs=2), tuple(f"f{i}" for i in range(4)), torch.device("cpu"))
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(512, 4)).astype(np.float32), (rng.random(512) < 0.2).astype(np.float32)
    trainer.begin_shard("d", x)
    with Dispatched() as seen:
        gpustep.train_shard(trainer, x, y, lambda: True, _shard_seed, capture=False, fused=True)
    losses = [i for i, name in enumerate(seen.names) if name.startswith("binary_cross_entropy_with_logits")]
    assert trainer.steps == 8 and len(losses) == 4, (trainer.steps, losses)  # 4 steps an epoch, summed in the second


def test_on_cpu_the_fused_adam_stays_within_its_stated_tolerance() -> None:
    expected, got = tensors(eager_cpu()), tensors(run(shaped(capture=False, fused=True), torch.device("cpu")))
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], **FUSED_TOLERANCE, msg=key)
    assert any(not torch.equal(got[k], expected[k]) for k in expected if k.startswith("model."))  # it is fused


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a machine where the step cannot be recorded")
def test_a_step_that_cannot_be_recorded_runs_eagerly_with_the_same_meaning_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    """Recording needs CUDA: asked to record on CPU, the step keeps its fixed buffers, falls back to eager
    after the failed recording (the warm-up undone), says why once, and trains bit for bit as the trainer."""
    with caplog.at_level("WARNING", logger="workload.model.gpustep"):
        got = run(shaped(capture=True, fused=False), torch.device("cpu"))
    assert_equal(eager_cpu(), got)
    assert [r.getMessage() for r in caplog.records] == [
        "the training step could not be captured as a CUDA graph (torch.cuda.Stream requires CUDA support): it "
        "runs eagerly, slower, same meaning"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a machine where the step cannot be recorded")
def test_adams_state_made_for_a_recording_is_the_state_its_first_step_would_make(
        caplog: pytest.LogCaptureFixture) -> None:
    """Before recording, the fused Adam's state is created up front (`prepare_state`: a graph cannot create it);
    when the recording then fails (CPU), the eager fused step that goes on from that state trains bit for bit as
    the fused step that created its own state lazily, and a state that exists already is left alone."""
    with caplog.at_level("WARNING", logger="workload.model.gpustep"):
        prepared = run(shaped(capture=True, fused=True), torch.device("cpu"))
    assert_equal(run(shaped(capture=False, fused=True), torch.device("cpu")), prepared)
    assert len(caplog.records) == 1 and "could not be captured" in caplog.records[0].getMessage()
    trainer = Trainer("r", HP, FEATURES, torch.device("cpu"), feature_version="v")
    fused = gpustep.fused_adam(trainer.optimizer)
    params = list(trainer.model.parameters())
    gpustep.prepare_state(fused, params)
    for p in params:
        st = fused.state[p]
        assert st["step"].dtype == torch.float32 and st["step"].shape == () and float(st["step"]) == 0
        assert torch.equal(st["exp_avg"], torch.zeros_like(p)) and torch.equal(st["exp_avg_sq"], torch.zeros_like(p))
        st["step"].fill_(3)
    gpustep.prepare_state(fused, params)
    assert all(float(fused.state[p]["step"]) == 3 for p in params), "an existing state is kept"
    gpustep.prepare_state(trainer.optimizer, params)  # the default Adam: nothing made
    plain = Trainer("r", HP, FEATURES, torch.device("cpu"), feature_version="v")
    gpustep.prepare_state(plain.optimizer, list(plain.model.parameters()))
    assert not plain.optimizer.state


def test_a_step_stopped_in_its_last_epoch_and_continued_in_the_same_process_sums_as_an_undisturbed_one() -> None:
    """Continued without a reload (a stop that did not end the process), the last epoch's loss and count go on
    from what this process summed before the stop, as the eager trainer's do."""
    x, y = _day(0)
    whole = Trainer("r", HP, FEATURES, torch.device("cpu"), feature_version="v")
    whole.begin_shard("d0", x)
    assert shaped(capture=False, fused=False)(whole, x, y, lambda: True)
    cut = Trainer("r", HP, FEATURES, torch.device("cpu"), feature_version="v")
    cut.begin_shard("d0", x)
    assert not shaped(capture=False, fused=False)(cut, x, y, lambda: cut.steps != 15)  # epoch 2 of 2, batch 4
    assert shaped(capture=False, fused=False)(cut, x, y, lambda: True)
    n = len(y)
    assert (cut.last_epoch_loss(), cut.train_accuracy(n)) == (whole.last_epoch_loss(), whole.train_accuracy(n))
    s = gpustep.step_for(cut, capture=False, fused=False)
    assert (s.hits.dtype, s.k.dtype, s.base.dtype) == (torch.int64,) * 3, "counts in int64: float32 stops at 2**24"


@pytest.mark.parametrize("capture", [False, True])
def test_a_logit_of_exactly_zero_counts_as_fraud_in_the_shaped_steps_accuracy_as_in_the_trainers(capture: bool) -> None:
    """Output layer zeroed, one batch, one epoch: every logit the step sees is exactly 0, a probability of one half,
    which counts as fraud; asked to record on CPU, the step that falls back sums it alike."""
    x, y = _day(1, n=64)
    hp = dataclasses.replace(HP, epochs=1)
    trainers = []
    for train in (eager, shaped(capture=capture, fused=False)):
        t = Trainer("r", hp, FEATURES, torch.device("cpu"), feature_version="v")
        with torch.no_grad():
            for p in t.model.net[-1].parameters():
                p.zero_()
        t.begin_shard("d0", x)
        assert train(t, x, y, lambda: True)
        trainers.append(t)
    a, b = trainers
    assert b.train_accuracy(len(y)) == a.train_accuracy(len(y)) == float(y.mean())
    assert b.last_epoch_loss() == a.last_epoch_loss()


def test_on_cpu_the_shaped_step_asked_for_nothing_is_the_trainers_eager_step_to_the_bit() -> None:
    """Without `capture` and `fused` the shaped step records and fuses only on CUDA: on CPU it trains as the
    trainer does, to the bit, whatever float type the labels come in; asked to record several steps a replay, the
    step that falls back trains them all."""
    def defaults(t: Trainer, x: np.ndarray, y: np.ndarray, after_step: Callable[[], bool]) -> bool:
        return gpustep.train_shard(t, x, y.astype(np.float64), after_step, _shard_seed)

    assert_equal(eager_cpu(), run(defaults, torch.device("cpu")))
    assert_equal(eager_cpu(), run(shaped(capture=True, fused=False, per_replay=4), torch.device("cpu")))
    with pytest.raises(AssertionError, match="^begin_shard first$"):
        gpustep.train_shard(Trainer("r", HP, FEATURES, torch.device("cpu")), *_day(0), lambda: True, _shard_seed)


def test_the_shaped_step_trains_the_epochs_its_progress_holds_or_an_old_progress_the_runs_own() -> None:
    """`min_steps` raises a short run's epochs for the day (the progress keeps them); a format-2 checkpoint's
    progress has none and the run's `epochs` apply: the shaped step as the trainer, either way."""
    x, y = _day(2, n=300)
    hp = dataclasses.replace(HP, min_steps=30)
    for edit, epochs in ((lambda t: None, 6), (lambda t: t.progress.pop("epochs"), 2)):
        got = []
        seen: list[list] = []
        for train in (eager, shaped(capture=False, fused=False)):
            t = Trainer("r", hp, FEATURES, torch.device("cpu"), feature_version="v")
            t.begin_shard("d0", x)
            edit(t)
            seen.append([])
            assert train(t, x, y, lambda t=t, at=seen[-1]: at.append(dict(t.progress)) or True)
            got.append(t)
        assert got[0].steps == got[1].steps == epochs * 5
        assert seen[0] == seen[1] and got[0].progress == got[1].progress, "what each checkpoint saves, and the end"
        assert_equal(*got)


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.6])
def test_the_shaped_step_weighs_fraud_as_the_trainer_at_any_rate(rate: float) -> None:
    """The class weight (non-fraud over fraud rows, at least 1, at most the cap; 1 on a day without fraud) where
    the cap does not bind: to the bit as the trainer."""
    rng = np.random.default_rng(5)
    y = (rng.random(300) < rate).astype(np.float32)
    x = (rng.normal(size=(300, 4)) + y[:, None]).astype(np.float32)
    got = []
    for train in (eager, shaped(capture=False, fused=False)):
        t = Trainer("r", HP, FEATURES, torch.device("cpu"), feature_version="v")
        t.begin_shard("d0", x)
        assert train(t, x, y, lambda: True)
        got.append(t)
    assert_equal(*got)


def test_a_run_resumed_in_a_later_epoch_draws_that_epochs_batches_when_they_are_drawn_ahead() -> None:
    """Asked to record (on CPU it falls back), the next epoch's permutation is drawn on a thread ahead of it: a
    run of three epochs stopped in its second and resumed from its checkpoint still trains each epoch's batches."""
    x, y = _day(3, n=300)
    hp = dataclasses.replace(HP, epochs=3)
    whole = Trainer("r", hp, FEATURES, torch.device("cpu"), feature_version="v")
    whole.begin_shard("d0", x)
    assert eager(whole, x, y, lambda: True)
    cut = Trainer("r", hp, FEATURES, torch.device("cpu"), feature_version="v")
    cut.begin_shard("d0", x)
    train = shaped(capture=True, fused=False)
    assert not train(cut, x, y, lambda: cut.steps != 7)  # epoch 1 (of 0, 1, 2), batch 2
    cut = reload(cut)
    cut.begin_shard("d0", x)
    assert train(cut, x, y, lambda: True)
    assert_equal(whole, cut)


def test_the_fused_adam_takes_the_trainers_hyperparameters_and_shares_its_state() -> None:
    hp = dataclasses.replace(HP, lr=0.0123, weight_decay=0.004)
    trainer = Trainer("r", hp, FEATURES, torch.device("cpu"), feature_version="v")
    group = trainer.optimizer.param_groups[0]
    fused = gpustep.fused_adam(trainer.optimizer)
    got = fused.param_groups[0]
    assert {k: got[k] for k in ("lr", "betas", "eps", "weight_decay")} == {
        k: group[k] for k in ("lr", "betas", "eps", "weight_decay")}
    assert got["fused"] and not got["capturable"], "capturable only on CUDA"
    assert got["params"] == group["params"] and fused.state is trainer.optimizer.state


def test_the_trainer_picks_the_shaped_step_on_cuda_only() -> None:
    assert gpustep.wanted(torch.device("cuda")) and not gpustep.wanted(torch.device("cpu"))
    assert eager_cpu() not in gpustep._STEPS  # on CPU the trainer's own eager loop trained it, not the shaped step


@CUDA
def test_on_cuda_the_replayed_graph_equals_the_same_step_run_eagerly() -> None:
    cuda = torch.device("cuda")
    assert_equal(run(shaped(capture=False, fused=True), cuda), run(shaped(capture=True, fused=True), cuda))


@CUDA
def test_on_cuda_the_trainer_trains_with_the_graph_and_stays_near_the_eager_cpu_run() -> None:
    cuda = torch.device("cuda")
    assert_equal(run(eager, cuda), run(shaped(capture=True, fused=True), cuda))
    on_cpu, on_gpu = tensors(eager_cpu()), tensors(run(eager, cuda))
    for key in on_cpu:
        torch.testing.assert_close(on_gpu[key], on_cpu[key], **FUSED_TOLERANCE, msg=key)


@CUDA
@pytest.mark.parametrize("stop_at", [3, 11, 12, 22])
def test_on_cuda_a_run_killed_and_resumed_equals_an_undisturbed_one_bit_for_bit(stop_at: int) -> None:
    cuda = torch.device("cuda")
    assert_equal(run(eager, cuda), run(eager, cuda, stop_at=stop_at))


@CUDA
@pytest.mark.parametrize("per_replay", [4, 10])
def test_on_cuda_a_graph_of_several_steps_equals_one_step_graphs_bit_for_bit_killed_or_not(per_replay: int) -> None:
    cuda = torch.device("cuda")
    one = run(shaped(capture=True, fused=True), cuda)
    assert_equal(one, run(shaped(capture=True, fused=True, per_replay=per_replay), cuda))
    assert_equal(one, run(shaped(capture=False, fused=True, per_replay=per_replay), cuda))
    for stop_at in (1, 3, 6):
        assert_equal(one, run(shaped(capture=True, fused=True, per_replay=per_replay), cuda, stop_at=stop_at))
