"""A sweep's runs packed on one device: each packed run ends where its solo training ends (within the stated
tolerance), keeps its own batches, optimizer, hyperparameters and progress, and a packed run stopped and resumed
from its own checkpoint alone ends bit for bit where the undisturbed pack ends."""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tests.model.dispatch import Dispatched
from workload.model import lineage, packed
from workload.model.trainer import HParams, Trainer, _shard_seed

CPU = torch.device("cpu")
FEATURES = ("a", "b", "c", "d")
BASE = HParams(hidden=(8, 4), epochs=2, batch_size=64, window_days=1)
# Different seeds (so batches and initial weights), learning rates, weight decays, averaging decays, class-weight
# caps, and one run with more epochs a day (it trains alone while the others sit its last epoch out).
RUNS = {"a": {"seed": 1}, "b": {"seed": 2, "lr": 1e-3, "weight_decay": 0.0, "ema_decay": 0.9},
        "c": {"seed": 3, "lr": 5e-3, "weight_decay": 1e-3, "epochs": 3, "pos_weight_cap": 2.0}}
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# Every run stopped at once (SIGTERM) mid-epoch, after an epoch's last batch, and in its last epoch; run b alone
# (its lease lost).
STOPS = (lambda r, n: n == 5, lambda r, n: n == 11, lambda r, n: n == 15, lambda r, n: r == 1 and n == 7)
ALL_AT_ONCE = (0, 1, 2)  # the STOPS that stop every run of the pack


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _day(seed: int, n: int = 700) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.1).astype(np.float32)
    x = (rng.normal(size=(n, 4)) + y[:, None]).astype(np.float32)
    return x, y


def fresh(device: torch.device = CPU) -> list[Trainer]:
    return [Trainer(name, HParams.from_dict({**BASE.to_dict(), **spec}), FEATURES, device, feature_version="v")
            for name, spec in RUNS.items()]


def solo(device: torch.device = CPU) -> list[Trainer]:
    out = []
    for t in fresh(device):
        for i in range(2):
            x, y = _day(i)
            t.begin_shard(f"d{i}", x)
            assert t.train_shard(x, y, lambda: True)
            t.finish_shard({"shard": f"d{i}", "train_accuracy": t.train_accuracy(len(y))})
        out.append(t)
    return out


def reload(t: Trainer) -> Trainer:
    buf = io.BytesIO()
    torch.save(lineage.checkpoint_of(t), buf)
    buf.seek(0)
    return lineage.trainer_from(torch.load(buf, weights_only=True, map_location="cpu"), t.device)


def pack_run(stop: Callable[[int, int], bool] | None = None, device: torch.device = CPU,
             capture: bool | None = None, rejoin: bool = False) -> list[Trainer]:
    """Two days packed; on the second, `stop(run, its step)` True stops that run: each stopped run is reloaded
    from its own checkpoint and finishes the day in a pack of its own, or with `rejoin` the stopped runs finish
    it together in one pack (a packed peer that leases them again). `capture`: replay a CUDA graph (default:
    on CUDA)."""
    trainers = fresh(device)
    for i in range(2):
        x, y = _day(i)
        for t in trainers:
            t.begin_shard(f"d{i}", x)
        pack = packed.Pack(trainers, _shard_seed, capture=capture)
        count = [0] * len(trainers)

        def after_step(r: int, i: int = i, count: list = count, pack: packed.Pack = pack) -> bool:
            count[r] += 1
            if stop is not None and i == 1 and stop(r, count[r]):
                lineage.checkpoint_of(pack.trainer(r))  # what a checkpoint would read, mid-pack
                return False
            return True

        done = pack.train_shard(x, y, after_step)
        stopped = [r for r, finished in enumerate(done) if not finished]
        for r in stopped:
            trainers[r] = reload(pack.trainer(r))
            trainers[r].begin_shard(f"d{i}", x)
        for group in [stopped] if rejoin and stopped else [[r] for r in stopped]:
            again = packed.Pack([trainers[r] for r in group], _shard_seed, capture=capture)
            assert again.train_shard(x, y, lambda r: True) == [True] * len(group)
        for t in trainers:
            t.finish_shard({"shard": f"d{i}", "train_accuracy": t.train_accuracy(len(y))})
    return trainers


@functools.cache
def undisturbed() -> tuple[Trainer, ...]:
    """The undisturbed pack on CPU, which the CPU tests compare with (read, never trained on)."""
    return tuple(pack_run())


def tensors(t: Trainer) -> dict[str, torch.Tensor]:
    state = lineage.checkpoint_of(t)
    out = {f"model.{k}": v for k, v in state["model"].items()}
    out |= {f"averaged.{k}": v for k, v in state["averaged"].items()}
    for i, st in state["optimizer"]["state"].items():
        out |= {f"adam.{i}.{k}": v.detach().cpu().float() for k, v in st.items()}
    return out


def test_each_packed_run_ends_where_its_solo_training_ends_within_the_stated_tolerance() -> None:
    alone, together = solo(), undisturbed()
    for a, b in zip(alone, together, strict=True):
        ta, tb = tensors(a), tensors(b)
        assert ta.keys() == tb.keys()
        for key in ta:
            torch.testing.assert_close(tb[key], ta[key], **packed.SOLO_TOLERANCE, msg=f"run {a.run}: {key}")
        assert (b.steps, b.applied, b.progress) == (a.steps, a.applied, None)
        assert [h["train_accuracy"] for h in b.history] == pytest.approx([h["train_accuracy"] for h in a.history],
                                                                         abs=2 / 700)
    assert [t.steps for t in together] == [44, 44, 66]  # each its own epochs
    assert not torch.equal(tensors(together[0])["model.net.0.weight"], tensors(together[1])["model.net.0.weight"])


def test_each_packed_runs_last_epoch_sums_are_its_solo_runs_though_only_that_epochs_steps_take_them() -> None:
    """A packed step seeds its backward with the loss's gradient and runs the loss itself only while a run is in
    its last epoch (run c's third epoch is trained alone in the pack): each run's summed loss and rows classified
    right are still its solo training's (what the finiteness check before promotion and the day's accuracy read)."""
    x, y = _day(0)
    alone, together = fresh(), fresh()
    for t in alone:
        t.begin_shard("d0", x)
        assert t.train_shard(x, y, lambda: True)
    for t in together:
        t.begin_shard("d0", x)
    assert packed.Pack(together, _shard_seed).train_shard(x, y, lambda r: True) == [True] * len(RUNS)
    for a, b in zip(alone, together, strict=True):
        assert b.last_epoch_loss() == pytest.approx(a.last_epoch_loss(), rel=1e-5), a.run
        assert b.train_accuracy(len(y)) == pytest.approx(a.train_accuracy(len(y)), abs=2 / 700), a.run  # a row
        # whose logit sits within rounding of 0 may go either way, as in the test above


def _loaded_pack() -> packed.Pack:
    """A pack of the three runs with day 0 begun and loaded."""
    x, y = _day(0)
    trainers = fresh()
    for t in trainers:
        t.begin_shard("d0", x)
    pack = packed.Pack(trainers, _shard_seed, capture=False)
    pack.load_day(x, y)
    return pack


def _ready_pack() -> packed.Pack:
    """A pack of the three runs on day 0, every run active with its own permutation, ready for `packed_step`."""
    pack = _loaded_pack()
    for r in range(pack.r):
        pack.order[r].copy_(torch.randperm(pack.n, generator=torch.Generator().manual_seed(r)))
    pack.active.fill_(True)
    pack.summing.copy_(torch.tensor([True, False, True]))
    return pack


def test_a_plain_packed_step_is_the_masked_step_to_the_bit_where_nothing_is_masked() -> None:
    """With every run active and every batch full, the step runs without masks (in place, no weights of 1, no
    `where`): each of its numbers must be the masked step's, or a run resumed in a pack whose runs stand elsewhere
    (so that the other kind of step trains it) would not end bit for bit where it would have ended."""
    plain, masked = _ready_pack(), _ready_pack()
    for sums in (False, True, True):
        packed.packed_step(plain, sums, plain=True)
        packed.packed_step(masked, sums, plain=False)
    for name in ("flat_w", "flat_avg", "flat_m", "flat_v", "adam_steps", "ema_step", "base", "hits", "loss_sum"):
        assert torch.equal(getattr(plain, name), getattr(masked, name)), name
    assert int(plain.base[0]) == 3 * plain.bs and int(plain.hits[1]) == 0 < int(plain.hits[0])


def test_a_packed_step_outside_last_epochs_runs_no_loss_and_a_third_fewer_operators() -> None:
    """On CUDA a packed step costs its count of kernels. Under vmap the loss's forward and backward decomposed into
    ~30 operators (log, exp, clamps, negations); seeded with the loss's gradient, a step computes the loss only
    when some run sums its last epoch (the graph with the sums): the other steps dispatch none of it. And where
    nothing is masked (every run active, every batch full: most steps of a day) none of the masks either."""
    pack = _ready_pack()
    counts = {}
    for sums, plain in ((False, False), (True, False), (False, True)):
        with Dispatched() as seen:
            packed.packed_step(pack, sums, plain)
        counts[sums, plain] = seen.names
    loss_ops = {"binary_cross_entropy_with_logits", "log", "log_", "exp", "exp_", "log_sigmoid_forward"}
    assert not loss_ops & set(counts[False, False]), counts[False, False]
    assert counts[True, False].count("binary_cross_entropy_with_logits") == 1
    assert "where" not in counts[False, True] and "lt" not in counts[False, True]
    # 124 a step while the loss was differentiated under vmap; 80 masked and 64 plain now (torch 2.13)
    assert len(counts[False, False]) <= 0.7 * 124, len(counts[False, False])
    assert len(counts[False, True]) <= 0.55 * 124, len(counts[False, True])


def test_a_packed_run_stopped_and_resumed_from_its_checkpoint_ends_bit_for_bit() -> None:
    """All runs stopped at once (SIGTERM) mid-epoch and in their last epoch; run b alone (its lease lost) while
    the others train on: every run, resumed alone or with its pack, ends bit for bit where the undisturbed pack
    ends it (on CPU a pack's size does not change a run's bits; on CUDA see the test below)."""
    whole = undisturbed()
    for stop, rejoin in [*((stop, False) for stop in STOPS), (STOPS[0], True)]:
        resumed = pack_run(stop, rejoin=rejoin)
        for r, (a, b) in enumerate(zip(whole, resumed, strict=True)):
            ta, tb = tensors(a), tensors(b)
            assert [k for k in ta if not torch.equal(ta[k], tb[k])] == [], f"run {r}"
            assert (a.history, a.steps) == (b.history, b.steps)  # the last epoch's accuracy travels too


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a machine where the step cannot be recorded")
def test_a_pack_that_cannot_be_recorded_runs_eagerly_bit_for_bit_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="workload.model.gpustep"):
        got = pack_run(capture=True)
    for a, b in zip(undisturbed(), got, strict=True):
        ta, tb = tensors(a), tensors(b)
        assert [k for k in ta if not torch.equal(ta[k], tb[k])] == [], a.run
    assert len(caplog.records) == 2  # once a day: a pack is made for the day
    assert caplog.records[0].getMessage().startswith("the packed step could not be captured as a CUDA graph")


def _alike(n_runs: int = 3, **hp: object) -> list[Trainer]:
    """Runs that differ only in their seeds (so they stay in step through a day)."""
    return [Trainer(f"s{i}", HParams.from_dict({**BASE.to_dict(), "seed": i + 1, **hp}), FEATURES, CPU,
                    feature_version="v") for i in range(n_runs)]


def _solo_day(t: Trainer, x: np.ndarray, y: np.ndarray, edit: Callable[[Trainer], None] = lambda t: None) -> list:
    """One day trained alone, the progress after each step recorded (what each checkpoint would save)."""
    t.begin_shard("d0", x)
    edit(t)
    seen: list = []
    assert t.train_shard(x, y, lambda: seen.append(dict(t.progress)) or True)
    return seen


def _packed_day(ts: list[Trainer], x: np.ndarray, y: np.ndarray, edit: Callable[[Trainer], None] = lambda t: None,
                **kw: object) -> list[list]:
    for t in ts:
        t.begin_shard("d0", x)
        edit(t)
    seen: list[list] = [[] for _ in ts]
    pack = packed.Pack(ts, _shard_seed, **kw)
    assert pack.train_shard(x, y, lambda r: seen[r].append(dict(ts[r].progress)) or True) == [True] * len(ts)
    return seen


def _close(a: Trainer, b: Trainer) -> None:
    ta, tb = tensors(a), tensors(b)
    for key in ta:
        torch.testing.assert_close(tb[key], ta[key], **packed.SOLO_TOLERANCE, msg=f"run {a.run}: {key}")


def _packed_as_solo(alone: list[Trainer], together: list[Trainer], x: np.ndarray, y: np.ndarray,
                    edit: Callable[[Trainer], None] = lambda t: None) -> None:
    """The day trained by each of `alone` on its own and by `together` packed: each packed run ends within the
    stated tolerance of its solo twin."""
    for t in alone:
        _solo_day(t, x, y, edit)
    _packed_day(together, x, y, edit)
    for a, b in zip(alone, together, strict=True):
        _close(a, b)


@pytest.mark.parametrize("rows", [641, 640])
def test_a_packed_runs_progress_is_its_solo_runs_at_every_step_and_at_the_days_end(rows: int) -> None:
    """What each checkpoint of a packed run saves (its progress after every step) and where the day leaves it are
    its solo training's; a day whose last batch holds one row (641 rows, batches of 64) or none trains as solo."""
    x, y = _day(3, n=rows)
    alone, together = _alike(), _alike()
    solo_seen = [_solo_day(t, x, y) for t in alone]
    assert _packed_day(together, x, y) == solo_seen
    for a, b in zip(alone, together, strict=True):
        assert (b.progress, b.steps) == (a.progress, a.steps) == ({"shard": "d0", "epoch": 2, "batch": 0,
                                                                   "epochs": 2}, 2 * math.ceil(rows / 64))
        _close(a, b)


def test_a_packed_run_stopped_after_its_days_last_step_resumes_to_nothing_more() -> None:
    """Stopped by its last step's checkpoint (the day trained, not yet closed), a run resumed in a pack trains no
    further step and stands where its solo training ends the day."""
    x, y = _day(3, n=640)
    (t,) = _alike(1)
    t.begin_shard("d0", x)
    assert packed.Pack([t], _shard_seed).train_shard(x, y, lambda r: t.steps < 20) == [False]
    again = reload(t)
    again.begin_shard("d0", x)
    assert packed.Pack([again], _shard_seed).train_shard(x, y, lambda r: True) == [True]
    assert (again.steps, again.progress) == (20, {"shard": "d0", "epoch": 2, "batch": 0, "epochs": 2})


def test_a_packed_day_of_more_epochs_than_the_runs_default_or_of_an_old_progress_without_them_trains_as_solo() -> None:
    """`min_steps` raises a short run's epochs for the day (the progress keeps them); a format-2 checkpoint's
    progress has no epochs and the run's `epochs` apply: packed as solo, either way."""
    x, y = _day(4, n=300)
    for edit, epochs in ((lambda t: None, 6), (lambda t: t.progress.pop("epochs"), 2)):
        alone, together = _alike(min_steps=30), _alike(min_steps=30)
        _packed_as_solo(alone, together, x, y, edit)
        assert [t.steps for t in together] == [t.steps for t in alone] == [epochs * 5] * 3


def test_a_day_of_full_batches_trains_unmasked_steps_and_sums_only_in_its_last_epoch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The host chooses each step's kind from its cursors: with every run active and every batch full the step
    runs without masks (the cheaper graph); the step that holds a partial last batch is masked; only the last
    epoch's steps compute the sums."""
    kinds: list[tuple[bool, bool]] = []
    step = packed.packed_step
    monkeypatch.setattr(packed, "packed_step", lambda p, sums=True, plain=False: kinds.append((sums, plain))
                        or step(p, sums, plain))
    for rows, plain in ((640, [True] * 10), (700, [True] * 10 + [False])):
        kinds.clear()
        x, y = _day(5, n=rows)
        _packed_day(_alike(), x, y)
        assert kinds == [(False, p) for p in plain] + [(True, p) for p in plain], rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a machine where the step cannot be recorded")
@pytest.mark.parametrize("rows", [300, 40])
def test_a_pack_that_cannot_be_recorded_on_its_first_summing_step_trains_and_sums_it_as_the_eager_pack(
        rows: int) -> None:
    """The step after the failed recording sums (the day's one epoch is its last), its batch full or, on a day of
    one partial batch, masked."""
    x, y = _day(6, n=rows)
    eager, fallen = _alike(epochs=1), _alike(epochs=1)
    _packed_day(eager, x, y, capture=False)
    _packed_day(fallen, x, y, capture=True)
    for a, b in zip(eager, fallen, strict=True):
        ta, tb = tensors(a), tensors(b)
        assert [k for k in ta if not torch.equal(ta[k], tb[k])] == [], a.run
        assert (b.last_epoch_loss(), b.train_accuracy(len(y))) == (a.last_epoch_loss(), a.train_accuracy(len(y)))


def test_each_packed_run_keeps_its_own_hyperparameters_exactly() -> None:
    ts = fresh()
    pack = packed.Pack(ts, _shard_seed, capture=False)
    assert pack.lr.tolist() == [t.hp.lr for t in ts] and pack.lr.dtype == torch.float64
    assert pack.ema_decay.tolist() == [t.hp.ema_decay for t in ts]
    assert pack.wd.tolist() == [torch.tensor(t.hp.weight_decay, dtype=torch.float32).item() for t in ts]
    # Counts in int64, as solo (a float32 count stops at 2**24 rows); the averaging's step count in float64.
    assert (pack.hits.dtype, pack.ema_step.dtype, pack.ema_decay.dtype) == (torch.int64, torch.float64, torch.float64)


def test_a_packed_runs_last_epoch_sums_start_from_what_it_carried_or_from_zero() -> None:
    """At the start of a run's last epoch its counts start from the trainer's (a checkpoint's `correct`, or what
    this process summed before a stop) or from zero; at any other epoch, or past the epoch's end, they are
    left alone."""
    pack = _loaded_pack()
    ts = pack.trainers
    batches = math.ceil(pack.n / pack.bs)
    with ThreadPoolExecutor(max_workers=1) as pack.pool:
        def start(epoch: int, batch: int = 0) -> tuple[int, float]:
            pack.hits[0], pack.loss_sum[0] = 7, 0.5
            pack._begin_epoch(0, packed.Cursor(epoch, batch, 2), batches)
            return int(pack.hits[0]), float(pack.loss_sum[0])

        assert start(0) == (7, 0.5) and start(1, batches) == (7, 0.5)
        assert start(1) == (0, 0.0)
        ts[0]._correct, ts[0]._loss_sum = torch.tensor(5), torch.tensor(1.25)
        assert start(1) == (5, 1.25)


def _rated(seed: int, rate: float, n: int = 320) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < rate).astype(np.float32)
    return (rng.normal(size=(n, 4)) + y[:, None]).astype(np.float32), y


def test_packed_runs_weigh_fraud_as_solo_at_any_rate_and_read_labels_of_any_float_type() -> None:
    """The class weight (non-fraud over fraud rows, at least 1, at most the run's cap) where the cap does not bind:
    30 % fraud (2.3) and 60 % (below 1: 1); labels handed over as float64 are read as float32, as solo."""
    for rate in (0.0, 0.3, 0.6):
        x, y = _rated(7, rate)
        alone, together, as_float64 = _alike(), _alike(), _alike()
        for t in alone:
            _solo_day(t, x, y)
        _packed_day(together, x, y)
        _packed_day(as_float64, x, y.astype(np.float64))
        for a, b, c in zip(alone, together, as_float64, strict=True):
            _close(a, b)
            tb, tc = tensors(b), tensors(c)
            assert [k for k in tb if not torch.equal(tb[k], tc[k])] == [], "float64 labels are read as float32"


def test_runs_whose_normalisers_differ_are_each_fed_the_day_normalised_by_their_own() -> None:
    """A pack of runs that applied different days: each run's rows are normalised by its own statistics (a pack of
    runs that agree shares one copy)."""
    early, (x, y) = _day(8, n=200), _day(9, n=320)
    alone, together = _alike(), _alike()
    for ts in (alone, together):
        ts[1].begin_shard("early", early[0])  # run 1's statistics fold in another day first
        assert ts[1].train_shard(*early, lambda: True)
        ts[1].finish_shard({"shard": "early"})
    _packed_as_solo(alone, together, x, y)


def test_a_pack_whose_parameters_fill_whole_aligned_blocks_trains_as_solo() -> None:
    """hidden=(32,) over 4 features: a 128-element weight needs no gap after it in the stacked rows."""
    x, y = _day(10, n=320)
    alone, together = _alike(hidden=(32,)), _alike(hidden=(32,))
    assert 4 * 32 % packed.ALIGN == 0 and "net.0.weight" not in packed.gaps(packed.stacked_sizes(
        packed.Pack(_alike(hidden=(32,)), _shard_seed, capture=False).w))
    _packed_as_solo(alone, together, x, y)


def test_a_logit_of_exactly_zero_counts_as_fraud_in_a_packed_runs_accuracy_as_solo() -> None:
    """Output layer zeroed: every logit of the day's first step is exactly 0, a probability of one half, which
    counts as fraud (trainer: test_a_probability_of_exactly_one_half_counts_as_fraud)."""
    x, y = _day(11, n=64)

    def zeroed(ts: list[Trainer]) -> list[Trainer]:
        for t in ts:
            with torch.no_grad():
                for p in t.model.net[-1].parameters():
                    p.zero_()
        return ts

    alone, together = zeroed(_alike(epochs=1)), zeroed(_alike(epochs=1))
    for t in alone:
        _solo_day(t, x, y)
    _packed_day(together, x, y)
    for a, b in zip(alone, together, strict=True):
        assert b.train_accuracy(len(y)) == a.train_accuracy(len(y)) == float(y.mean())


def test_a_pack_of_no_runs_or_of_runs_with_other_adam_constants_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^a pack needs at least one run$"):
        packed.Pack([], _shard_seed)
    ts = _alike(2)
    ts[1].optimizer.param_groups[0]["eps"] = 1e-6
    with pytest.raises(ValueError, match=r"^runs of a pack must share Adam's betas and eps$"):
        packed.Pack(ts, _shard_seed)


def test_runs_that_cannot_share_a_stacked_model_are_refused_by_name() -> None:
    wide = Trainer("wide", HParams(hidden=(16,)), FEATURES, CPU)
    narrow = Trainer("narrow", HParams(hidden=(8,)), FEATURES, CPU)
    with pytest.raises(ValueError, match=r"runs \['wide', 'narrow'\] cannot share one stacked model"):
        packed.Pack([wide, narrow], _shard_seed)



@CUDA
def test_on_cuda_the_replayed_pack_equals_the_same_step_run_eagerly_and_its_solo_runs() -> None:
    cuda = torch.device("cuda")
    eager, replayed = pack_run(device=cuda, capture=False), pack_run(device=cuda, capture=True)
    for a, b in zip(eager, replayed, strict=True):
        ta, tb = tensors(a), tensors(b)
        assert [k for k in ta if not torch.equal(ta[k], tb[k])] == [], a.run
    for a, b in zip(solo(cuda), replayed, strict=True):
        ta, tb = tensors(a), tensors(b)
        for key in ta:
            torch.testing.assert_close(tb[key], ta[key], **packed.SOLO_TOLERANCE, msg=f"run {a.run}: {key}")


@CUDA
@pytest.mark.parametrize("stop", range(len(STOPS)))
def test_on_cuda_a_packed_run_resumed_with_its_pack_ends_bit_for_bit_and_alone_within_the_tolerance(stop: int) -> None:
    """On CUDA the stacked products' kernels depend on how many runs a pack holds (an H200 rounded a 3-run pack
    and a 1-run pack differently, 2026-11-28): runs stopped together and resumed together end bit for bit where
    the undisturbed pack ends them; a run resumed in a pack of another size ends within SOLO_TOLERANCE of it."""
    cuda = torch.device("cuda")
    whole = [tensors(t) for t in pack_run(device=cuda)]
    if stop in ALL_AT_ONCE:
        together = [tensors(t) for t in pack_run(STOPS[stop], device=cuda, rejoin=True)]
        for r, (a, b) in enumerate(zip(whole, together, strict=True)):
            assert [k for k in a if not torch.equal(a[k], b[k])] == [], f"run {r}"
    alone = [tensors(t) for t in pack_run(STOPS[stop], device=cuda)]
    for r, (a, b) in enumerate(zip(whole, alone, strict=True)):
        for key in a:
            torch.testing.assert_close(b[key], a[key], **packed.SOLO_TOLERANCE, msg=f"run {r}: {key}")
