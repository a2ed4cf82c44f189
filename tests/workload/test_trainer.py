"""Trainer pieces: normalisation that survives constant-so-far features, hyperparameter errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workload
from workload.model.hparams import default_seed, parse_runs
from workload.model.lineage import checkpoint_of, trainer_from
from workload.model.trainer import CPU_SCORING_ROWS, HParams, Normalizer, Trainer, _shard_seed, scoring_passes


def test_features_constant_so_far_are_left_unscaled() -> None:
    # First-day shape: terminal features all 0 (no label is 7 days old yet). Dividing a later
    # day's 0.8 by that day's std (0) would blow it up; it must pass through unscaled instead.
    norm = Normalizer(2)
    norm.update(np.c_[np.array([1.0, 2.0, 3.0, 4.0]), np.zeros(4)])
    out = norm.apply(np.array([[2.5, 0.8]]))
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), [[0.0, 0.8]], atol=1e-6)


def test_running_statistics_match_the_whole_data() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(i, 1 + i, size=(50 + 10 * i, 3)) for i in range(4)]
    norm = Normalizer(3)
    for part in parts:
        norm.update(part)
    whole = np.concatenate(parts)
    np.testing.assert_allclose(norm.mean.numpy(), whole.mean(0), rtol=1e-12)
    np.testing.assert_allclose((norm.m2 / norm.count).numpy(), whole.var(0), rtol=1e-12)


def test_folding_a_day_in_leaves_the_callers_rows_alone_and_sums_squares_as_before() -> None:
    """`_merge` centres and squares its chunk in place: the chunk is a float64 copy even when the caller's rows are
    float64 already, and the sum of squares is ((chunk - mean) ** 2).sum(0) to the bit (what checkpoints hold)."""
    rng = np.random.default_rng(4)
    day = rng.normal(3, 2, size=(1000, 3))
    kept = day.copy()
    norm = Normalizer(3)
    norm.update(day)
    np.testing.assert_array_equal(day, kept)
    chunk = torch.from_numpy(kept)
    assert torch.equal(norm.m2, ((chunk - chunk.mean(0)) ** 2).sum(0)) and torch.equal(norm.mean, chunk.mean(0))


@pytest.mark.parametrize(("spec", "message"), [
    ({"lr": 0}, "lr=0.0 is not allowed; must be 0 < lr < 1"),
    ({"epochs": 0}, "epochs=0 is not allowed"),
    ({"hidden": [64, 0]}, "hidden=(64, 0) is not allowed"),
    ({"learning_rate": 0.1}, "unknown key(s) ['learning_rate']"),
    ({"batch_size": "big"}, "run 'x'"),
])
def test_bad_hyperparameters_name_the_key(spec: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        HParams.from_dict(spec, where="run 'x'")
    assert message in str(err.value) and "run 'x'" in str(err.value)


def test_no_hidden_layer_is_logistic_regression() -> None:
    assert HParams.from_dict({"hidden": []}).hidden == ()


def _day(seed: int, n: int = 700) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.1).astype(np.float32)
    x = (rng.normal(size=(n, 4)) + y[:, None]).astype(np.float32)
    return x, y


def _train(stop_at: int | None) -> Trainer:
    """Two days of training; with `stop_at`, interrupted after that many steps of the second day
    (11 batches an epoch), saved, reloaded from the state dict alone, and finished."""
    hp = HParams(hidden=(8,), epochs=2, batch_size=64, ema_decay=0.9)
    trainer = Trainer("r", hp, ("a", "b", "c", "d"), torch.device("cpu"), feature_version="v")
    for i, shard in enumerate(("d1", "d2")):
        x, y = _day(i)
        trainer.begin_shard(shard, x)
        steps = {"n": 0}

        def after_step(steps: dict = steps, shard: str = shard) -> bool:
            steps["n"] += 1
            return stop_at is None or shard != "d2" or steps["n"] != stop_at

        if not trainer.train_shard(x, y, after_step):
            state = checkpoint_of(trainer)
            if state["progress"]["epoch"] == hp.epochs - 1:  # in the last epoch: the count travels with it
                assert state["progress"]["correct"] >= 0
            trainer = trainer_from(state, torch.device("cpu"))
            trainer.begin_shard(shard, x)
            assert trainer.train_shard(x, y, lambda: True)
        accuracy = trainer.train_accuracy(len(y))
        trainer.finish_shard({"shard": shard, "train_accuracy": accuracy})
    return trainer


def test_resuming_mid_epoch_on_cpu_is_bit_for_bit_averaged_weights_and_accuracy_included() -> None:
    whole = _train(None)
    for stop_at in (4, 11, 12, 16):  # in the first epoch, at its end, and twice in the last
        resumed = _train(stop_at)
        for part in ("model", "averaged"):
            a, b = checkpoint_of(whole)[part], checkpoint_of(resumed)[part]
            assert all(torch.equal(a[k], b[k]) for k in a), f"{part} differs after a stop at step {stop_at}"
        assert resumed.history == whole.history
    assert 0 < whole.history[-1]["train_accuracy"] <= 1
    x, _ = _day(5)
    np.testing.assert_array_equal(whole.score(x), _train(3).score(x))


def test_on_cpu_adam_steps_tensor_by_tensor_with_the_bits_of_torchs_single_tensor_loop_resumed_or_not() -> None:
    """The CPU trainer's Adam runs torch's foreach loop (less Python a step); its weights, averaged weights and
    optimizer state equal the single-tensor loop's (torch's CPU default, what CPU runs trained with before) bit
    for bit, and a trainer restored from a checkpoint that recorded the default loop steps with foreach again."""
    x, y = _day(0, n=2000)

    def day(foreach: bool) -> Trainer:
        trainer = Trainer("r", HParams(epochs=3, batch_size=64, weight_decay=1e-4), ("a", "b", "c", "d"),
                          torch.device("cpu"), feature_version="v")
        trainer.optimizer.param_groups[0]["foreach"] = foreach
        trainer.begin_shard("d1", x)
        assert trainer.train_shard(x, y, lambda: True)
        return trainer

    fast, single = day(True), day(False)
    assert Trainer("r", HParams(), ("a",), torch.device("cpu")).optimizer.param_groups[0]["foreach"] is True
    a, b = checkpoint_of(fast), checkpoint_of(single)
    for part in ("model", "averaged"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part
    for i, state in a["optimizer"]["state"].items():
        assert all(torch.equal(v, b["optimizer"]["state"][i][k]) for k, v in state.items()), i
    restored = trainer_from(b, torch.device("cpu"))  # its checkpoint says foreach=False
    assert restored.optimizer.param_groups[0]["foreach"] is True


def test_the_averaged_weights_score_and_differ_from_the_raw_ones() -> None:
    trainer = _train(None)
    raw = {k: v for k, v in trainer.model.state_dict().items()}
    avg = trainer.averaged.state_dict()
    assert any(not torch.equal(raw[k], avg[k]) for k in raw)
    x, _ = _day(7)
    with torch.no_grad():
        expected = torch.sigmoid(trainer.averaged(trainer.norm.apply(x))).numpy()
    np.testing.assert_array_equal(trainer.score(x), expected)


def test_ema_decay_is_validated() -> None:
    with pytest.raises(ValueError, match=r"ema_decay=1.0 is not allowed; must be 0 <= ema_decay < 1"):
        HParams.from_dict({"ema_decay": 1}, where="run 'x'")


@pytest.mark.parametrize(("spec", "message"), [
    ({"hidden": "64"}, "hidden='64' is not allowed; must be a list of layer sizes"),
    ({"hidden": 64}, "hidden=64 is not allowed"),
    ({"hidden": [64.0]}, "hidden=[64.0] is not allowed"),
    ({"epochs": 2.7}, "epochs=2.7 is not allowed; must be a whole number >= 1"),
    ({"epochs": 2.0}, "epochs=2.0 is not allowed"),
    ({"epochs": True}, "epochs=True is not allowed"),
    ({"lr": "0.01"}, "lr='0.01' is not allowed"),
    ({"lr": float("nan")}, "lr=nan is not allowed"),
    ({"seed": -1}, "seed=-1 is not allowed"),
])
def test_types_are_strict_never_coerced(spec: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        HParams.from_dict(spec, where="run 'x'")
    assert message in str(err.value) and "run 'x'" in str(err.value)


def test_a_sweep_gets_distinct_stable_seeds_unless_given() -> None:
    runs = parse_runs({"main": {}, "wide": {"hidden": [128, 64]}, "fixed": {"seed": 3}}, "runs")
    assert runs["fixed"].seed == 3
    assert runs["main"].seed == default_seed("main") != runs["wide"].seed == default_seed("wide")
    assert parse_runs({"main": None}, "runs")["main"] == runs["main"]  # YAML `main:` is an empty spec


@pytest.mark.parametrize(("specs", "message"), [
    ({"a": {"seed": 1}, "b": {"seed": 1}}, "runs 'a' and 'b' have the same hyperparameters"),
    ({"../x": {}}, "run name '../x' is not allowed"),
    ({"main": {"lr": 2}}, "run 'main': lr=2.0 is not allowed"),
    ({"main": [1]}, "run 'main': expected an object of hyperparameters"),
    ({}, "expected a non-empty object"),
    ([], "expected a non-empty object"),
])
def test_bad_sweeps_name_the_source_and_the_run(specs, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_runs(specs, "config runs")
    assert message in str(err.value) and str(err.value).startswith("config runs")


# --- numerics checked against their definitions, not against snapshots ------------------------------------


def _numpy_standardised(seen: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(x - mean) / std over every row seen, numpy's population std; a feature with std < 1e-3 unscaled."""
    std = seen.std(0)
    return (x - seen.mean(0)) / np.where(std < 1e-3, 1.0, std)


def test_the_normaliser_standardises_like_numpy_whatever_the_chunking() -> None:
    rng = np.random.default_rng(3)
    days = [np.c_[rng.normal(5, 0.01, 40), rng.normal(-2, 30, 40), np.full(40, 7.0)] for _ in range(3)]
    whole = np.concatenate(days)
    for chunk in (1, 7, 1 << 16):
        norm = Normalizer(3)
        for part in days:
            norm.update(part, chunk=chunk)
        assert int(norm.count) == len(whole)
        np.testing.assert_allclose(norm.mean.numpy(), whole.mean(0), rtol=1e-12)
        out = norm.apply(whole[:5])
        np.testing.assert_allclose(out.numpy(), _numpy_standardised(whole, whole[:5]), rtol=1e-4, atol=1e-5)
    day32 = whole[:5].astype(np.float32)
    norm.apply(day32)
    np.testing.assert_array_equal(day32, whole[:5].astype(np.float32))  # the caller's day is left as it was
    # Before any shard, nothing is known: values pass through as they are.
    np.testing.assert_array_equal(Normalizer(3).apply(whole[:2]).numpy(), whole[:2].astype(np.float32))


def test_the_model_stacks_the_hidden_layers_and_gives_one_logit_per_row() -> None:
    hp = HParams(hidden=(8, 4), seed=1)
    trainer = Trainer("r", hp, ("a", "b", "c"), torch.device("cpu"))
    shapes = [tuple(p.shape) for p in trainer.model.parameters()]
    assert shapes == [(8, 3), (8,), (4, 8), (4,), (1, 4), (1,)]
    assert trainer.model(torch.zeros(5, 3)).shape == (5,)
    assert trainer.model(torch.zeros(1, 3)).shape == (1,)
    relu = torch.nn.ReLU
    assert [type(m) for m in trainer.model.net] == [torch.nn.Linear, relu, torch.nn.Linear, relu, torch.nn.Linear]


def _weighted_bce(z: np.ndarray, y: np.ndarray, w: float) -> float:
    p = 1 / (1 + np.exp(-z))
    return float(np.mean(-(w * y * np.log(p) + (1 - y) * np.log(1 - p))))


@pytest.mark.parametrize(("positives", "cap", "weight"), [
    (20, 25.0, 9.0),  # 180 negatives / 20 frauds: weighted 9x
    (4, 25.0, 25.0),  # 196 / 4 = 49x, capped at pos_weight_cap
    (4, 40.0, 40.0),  # the cap is the run's own
    (150, 25.0, 1.0),  # more frauds than not: never weighted below 1
    (0, 25.0, 1.0),  # a day without fraud
])
def test_the_loss_is_class_weighted_bce_and_accuracy_counts_the_last_epoch(positives: int, cap: float,
                                                                          weight: float) -> None:
    """One batch per epoch, logistic regression: the last epoch's loss and accuracy are those of the weights
    after the first step, computed here by hand over the standardised day."""
    rng = np.random.default_rng(positives)
    n = 200
    y = np.zeros(n, dtype=np.float32)
    y[rng.choice(n, positives, replace=False)] = 1
    x = rng.normal(size=(n, 3)) + y[:, None]
    hp = HParams(hidden=(), epochs=2, batch_size=n, pos_weight_cap=cap, seed=2)
    trainer = Trainer("r", hp, ("a", "b", "c"), torch.device("cpu"))
    trainer.begin_shard("d1", x)
    snapshots = []
    assert trainer.last_epoch_loss() is None
    assert trainer.train_shard(x, y, lambda: snapshots.append(
        {k: v.double().numpy().copy() for k, v in trainer.model.state_dict().items()}) or True)
    first = snapshots[0]
    z = _numpy_standardised(x, x) @ first["net.0.weight"][0] + first["net.0.bias"][0]
    assert trainer.last_epoch_loss() == pytest.approx(_weighted_bce(z, y, weight), rel=1e-5)
    assert trainer.train_accuracy(n) == np.mean((z >= 0) == (y >= 0.5))
    assert np.isnan(trainer.train_accuracy(0))
    trainer.finish_shard({"shard": "d1"})
    assert trainer.last_epoch_loss() is None and np.isnan(trainer.train_accuracy(n)) and trainer.progress is None


def test_the_first_step_is_adam_with_the_runs_learning_rate_and_weight_decay() -> None:
    """Adam's first step moves every weight by lr against the sign of its gradient; a weight on a feature
    that is always 0 gets only weight decay's gradient, so it moves by lr towards 0 (without decay: not at all)."""
    rng = np.random.default_rng(4)
    y = (rng.random(300) < 0.2).astype(np.float32)
    x = np.c_[rng.normal(size=300) + y, np.zeros(300)]
    hp = HParams(hidden=(), epochs=1, batch_size=300, lr=0.01, weight_decay=0.5, seed=3)
    trainer = Trainer("r", hp, ("a", "zero"), torch.device("cpu"))
    before = trainer.model.net[0].weight.detach().clone()
    trainer.begin_shard("d1", x)
    assert trainer.train_shard(x, y, lambda: True)
    step = (trainer.model.net[0].weight.detach() - before)[0]
    assert abs(float(step[0])) == pytest.approx(0.01, rel=1e-4)
    assert float(step[1]) == pytest.approx(-0.01 * float(np.sign(before[0, 1].item())), rel=1e-4)


@pytest.mark.parametrize("ema_decay", [0.5, 0.999])  # past the warm-up by the end (d reaches 0.5 at t = 8); in it
def test_the_averaged_weights_are_the_warmed_up_moving_average_of_the_raw_ones(ema_decay: float) -> None:
    """avg <- d * avg + (1 - d) * raw after every step, d = min(ema_decay, (1 + t) / (10 + t)) with t the
    run's step count (across shards), starting from the initial weights; computed here in float64."""
    hp = HParams(hidden=(3,), epochs=2, batch_size=16, ema_decay=ema_decay, seed=5)
    trainer = Trainer("r", hp, ("a", "b"), torch.device("cpu"))
    expected = {k: v.double().numpy().copy() for k, v in trainer.model.state_dict().items()}
    t = 0
    for i, shard in enumerate(("d1", "d2")):
        x, y = _day(10 + i, n=60)
        x = x[:, :2]

        def after_step() -> bool:
            nonlocal t
            d = min(ema_decay, (1 + t) / (10 + t))
            for k, v in trainer.model.state_dict().items():
                expected[k] = d * expected[k] + (1 - d) * v.double().numpy()
            t += 1
            return True

        trainer.begin_shard(shard, x)
        assert trainer.train_shard(x, y, after_step)
        trainer.finish_shard({"shard": shard})
    assert t == trainer.steps == 2 * 2 * 4  # 8 steps a shard
    assert not any(p.requires_grad for p in trainer.averaged.parameters())  # averaged, never trained
    for k, v in trainer.averaged.state_dict().items():
        np.testing.assert_allclose(v.double().numpy(), expected[k], rtol=1e-5, atol=1e-6)


def _quick() -> Trainer:
    """Two small days, one epoch each: a lineage with history, for tests that need one and not its numbers."""
    trainer = Trainer("r", HParams(hidden=(4,), epochs=1, batch_size=32, seed=6), ("a", "b", "c", "d"),
                      torch.device("cpu"), feature_version="v")
    for i, shard in enumerate(("d1", "d2")):
        x, y = _day(20 + i, n=100)
        trainer.begin_shard(shard, x)
        assert trainer.train_shard(x, y, lambda: True)
        trainer.finish_shard({"shard": shard, "train_accuracy": trainer.train_accuracy(len(y))})
    return trainer


def test_scoring_in_batches_is_scoring_at_once() -> None:
    trainer = _quick()
    x, _ = _day(8, n=50)
    whole = trainer.score(x)
    assert whole.shape == (50,) and whole.dtype == np.float32
    np.testing.assert_allclose(trainer.score(x, batch=7), whole, rtol=1e-6)
    rows: list[int] = []  # each forward pass's rows: `batch` bounds what one pass holds (score --batch)
    hook = trainer.averaged.register_forward_hook(lambda _m, args, _out: rows.append(len(args[0])))
    try:
        trainer.score(x, batch=7)
        assert rows == [7] * 7 + [1]
        rows.clear()
        trainer.score(x)
        assert rows == [50]
    finally:
        hook.remove()
    empty = trainer.score(x[:0])
    assert empty.shape == (0,) and empty.dtype == np.float32


def test_scoring_on_a_cpu_in_passes_is_one_pass_within_rounding_and_the_same_bits_every_time() -> None:
    # The default run's shape: the passes that make scoring cheap (issue 33) change no score beyond float32
    # rounding, and the same rows are scored to the same bits every time (the passes depend on the row count only).
    # Bit for bit one pass on the CI machine's AMD CPU, not on the GPU machine's Intel Xeon (torch 2.11, 2026-11-28):
    # there a matrix product's rounding depends on how many rows it holds. A last pass of one row (8193 rows in
    # passes of 8192) is never made: the rest joins the pass before it.
    trainer = Trainer("r", HParams(), tuple(f"f{i}" for i in range(18)), torch.device("cpu"), feature_version="v")
    x = np.random.default_rng(3).normal(size=(3 * CPU_SCORING_ROWS + 2, 18)).astype(np.float32)
    trainer.norm.update(x)
    for n in (2 * CPU_SCORING_ROWS + 1, 2 * CPU_SCORING_ROWS + 3, len(x)):
        assert len(scoring_passes(n, torch.device("cpu"))) > 1
        passes = trainer.logits(x[:n])
        np.testing.assert_allclose(passes, trainer.logits(x[:n], batch=n), rtol=1e-5, atol=1e-6)
        assert np.array_equal(passes, trainer.logits(x[:n]))
    c = CPU_SCORING_ROWS
    assert scoring_passes(0, torch.device("cpu")) == [] and scoring_passes(5, torch.device("cpu")) == [(0, 5)]
    assert scoring_passes(2 * c + 1, torch.device("cpu")) == [(0, c), (c, 2 * c + 1)]
    assert scoring_passes(2 * c, torch.device("cpu")) == [(0, c), (c, 2 * c)]
    assert scoring_passes(c + 1, torch.device("cpu")) == [(0, c + 1)], "a pass of one row joins the one before"
    assert scoring_passes(3 * c, torch.device("cuda")) == [(0, 3 * c)]


def test_a_checkpoint_restores_the_whole_lineage_and_refuses_other_formats() -> None:
    trainer = _quick()
    state = checkpoint_of(trainer)
    again = trainer_from(state, torch.device("cpu"))
    assert (again.run, again.hp, again.feature_version) == ("r", trainer.hp, "v")
    assert again.feature_names == ("a", "b", "c", "d")
    assert again.applied == ["d1", "d2"] and again.history == trainer.history and again.steps == trainer.steps
    assert again.progress is None and checkpoint_of(again)["progress"] is None
    assert torch.equal(again.norm.mean, trainer.norm.mean) and torch.equal(again.norm.m2, trainer.norm.m2)
    assert state["format"] == 5 and state["code_version"] == workload.__version__
    with pytest.raises(ValueError, match=r"^checkpoint hparams: lr=2.0 is not allowed"):
        trainer_from({**state, "hparams": {**state["hparams"], "lr": 2.0}}, torch.device("cpu"))
    for bad in (1, None):
        with pytest.raises(ValueError, match=f"checkpoint format {bad!r} is not supported \\(readable: 2, 3, 4, 5\\)"):
            trainer_from({**state, "format": bad}, torch.device("cpu"))


def test_a_checkpoint_keeps_the_lineages_rewinds_and_calibration_in_float64() -> None:
    trainer = _quick()
    trainer.reapplied = [{"time": "t", "reapplied": ["d1"], "why": "late", "from": "d0", "day": "d1"}]
    trainer.set_calibration(0.123456789012345, -2.5)
    state = checkpoint_of(trainer)
    again = trainer_from(state, torch.device("cpu"))
    assert again.reapplied == trainer.reapplied and again.reapplied is not trainer.reapplied
    assert state["reapplied"] == trainer.reapplied and state["reapplied"][0] is not trainer.reapplied[0]
    for part in (trainer.calibration, state["calibration"], again.calibration):
        assert {k: (v.dtype, float(v)) for k, v in part.items()} == \
            {"scale": (torch.float64, 0.123456789012345), "shift": (torch.float64, -2.5)}
    assert trainer_from({k: v for k, v in state.items() if k != "reapplied"}).reapplied == []
    uncalibrated = trainer_from({k: v for k, v in state.items() if k != "calibration"})
    assert {k: float(v) for k, v in uncalibrated.calibration.items()} == {"scale": 1.0, "shift": 0.0}
    x = np.random.default_rng(1).normal(size=(50, 4)).astype(np.float32)
    z = torch.from_numpy(trainer.logits(x))
    expected = torch.sigmoid(z * torch.tensor(0.123456789012345).float() + torch.tensor(-2.5)).numpy()
    assert np.array_equal(trainer.score(x), expected) and np.array_equal(again.score(x), expected)
    assert np.array_equal(trainer.score(x, calibrated=False), torch.sigmoid(z).numpy())
    assert np.array_equal(trainer.probabilities(z.numpy()), expected), "calibrated unless told otherwise"
    assert np.array_equal(trainer.score(x, batch=7), trainer.score(x))


def test_batch_order_depends_on_seed_shard_and_epoch() -> None:
    seeds = {_shard_seed(s, shard, e) for s in (0, 1) for shard in ("d1", "d2") for e in (0, 1)}
    assert len(seeds) == 8 and all(0 <= s < 2**63 for s in seeds)
    assert _shard_seed(3, "d1", 2) == _shard_seed(3, "d1", 2)


def test_a_trainer_picks_cuda_when_there_is_one() -> None:
    trainer = Trainer("r", HParams(hidden=(2,)), ("a",))
    assert trainer.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert next(trainer.model.parameters()).device.type == trainer.device.type


def test_a_cpu_trainer_leaves_torchs_global_determinism_setting_alone() -> None:
    """Deterministic kernels are switched on for CUDA only: on CPU the process's setting stays as it was."""
    was = torch.are_deterministic_algorithms_enabled()
    Trainer("r", HParams(hidden=(2,)), ("a",), torch.device("cpu"))
    assert torch.are_deterministic_algorithms_enabled() == was


def test_batch_order_ignores_the_processs_global_random_state() -> None:
    """Whatever else the process drew from torch's global generator (a library, another run's dropout), a
    shard trains the same: its batch order comes from (seed, shard, epoch) alone."""
    weights = []
    for draws in (0, 7):
        trainer = Trainer("r", HParams(hidden=(), epochs=2, batch_size=16, seed=8), ("a", "b"), torch.device("cpu"))
        torch.rand(draws)
        x, y = _day(30, n=64)
        trainer.begin_shard("d1", x[:, :2])
        assert trainer.train_shard(x[:, :2], y, lambda: True)
        weights.append(trainer.model.net[0].weight.detach().clone())
    assert torch.equal(weights[0], weights[1])


def test_a_std_of_exactly_the_threshold_is_scaled() -> None:
    """Features with a std below 1e-3 pass unscaled; at 1e-3 itself they are standardised."""
    norm = Normalizer(1)
    norm.update(np.array([[-0.001], [0.001]]))  # population std: exactly 1e-3 in float64
    np.testing.assert_allclose(norm.apply(np.array([[0.001]])).numpy(), [[1.0]], rtol=1e-6)


def test_a_probability_of_exactly_one_half_counts_as_fraud() -> None:
    """Accuracy reads p >= 0.5 as fraud: with all-zero weights every logit is 0, so every row is called fraud
    and the accuracy is the share of frauds."""
    rng = np.random.default_rng(9)
    y = (rng.random(50) < 0.3).astype(np.float32)
    x = rng.normal(size=(50, 2))
    trainer = Trainer("r", HParams(hidden=(), epochs=1, batch_size=50, seed=1), ("a", "b"), torch.device("cpu"))
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.zero_()
    trainer.begin_shard("d1", x)
    assert trainer.train_shard(x, y, lambda: True)
    assert trainer.train_accuracy(50) == int(y.sum()) / 50


def test_training_before_begin_shard_is_refused() -> None:
    """train_shard continues what begin_shard started (the shard's statistics folded in, progress at its start)."""
    trainer = Trainer("r", HParams(hidden=(), seed=1), ("a",), torch.device("cpu"))
    x, y = np.zeros((4, 1)), np.zeros(4, dtype=np.float32)
    with pytest.raises(AssertionError, match=r"^begin_shard first$"):
        trainer.train_shard(x, y, lambda: True)
    assert checkpoint_of(trainer)["progress"] is None and trainer.steps == 0


def test_a_trainer_given_no_feature_version_records_none() -> None:
    """export.load_model rebuilds a trainer without one: its state must not claim a version it never saw."""
    state = checkpoint_of(Trainer("r", HParams(hidden=(), seed=1), ("a",), torch.device("cpu")))
    assert state["feature_version"] == ""
    assert trainer_from(state, torch.device("cpu")).feature_version == ""


def test_the_statistics_of_a_float32_day_are_numpys_float64_ones() -> None:
    """Days arrive as float32; their mean and variance are accumulated in float64, as numpy computes them in
    float64, even where float32 sums would lose digits (large values with a small spread, like amounts)."""
    rng = np.random.default_rng(12)
    day = np.c_[rng.normal(5e4, 3.0, 3000), rng.normal(0, 1, 3000)].astype(np.float32)
    norm = Normalizer(2)
    norm.update(day, chunk=1000)
    exact = day.astype(np.float64)
    np.testing.assert_allclose(norm.mean.numpy(), exact.mean(0), rtol=1e-12)
    np.testing.assert_allclose((norm.m2 / norm.count).numpy(), exact.var(0), rtol=1e-9)


def _rows_in_training_order(seed: int, shard: str, n: int = 24) -> list[list[int]]:
    """The rows (by index) a two-epoch training of a day fed to the model, epoch by epoch: column 0 is the row's
    own index, recovered from the standardised input the model received (a forward hook records it)."""
    x = np.c_[np.arange(n, dtype=np.float64), np.random.default_rng(0).normal(size=n)]
    y = (np.arange(n) % 4 == 0).astype(np.float32)
    trainer = Trainer("r", HParams(hidden=(), epochs=2, batch_size=5, seed=seed), ("row", "b"), torch.device("cpu"))
    fed: list[torch.Tensor] = []
    trainer.model.register_forward_pre_hook(lambda _module, args: fed.append(args[0][:, 0].clone()))
    trainer.begin_shard(shard, x)
    assert trainer.train_shard(x, y, lambda: True)
    index = {float(v): i for i, v in enumerate(trainer.norm.apply(x)[:, 0])}
    rows = [index[float(v)] for v in torch.cat(fed)]
    return [rows[:n], rows[n:]]


def test_batch_order_is_a_shuffle_of_the_day_set_by_seed_shard_and_epoch() -> None:
    """Every epoch feeds each row once, in an order of its own; the same (seed, shard) trains in the same order
    (what bit-for-bit resume rests on) and another seed or another day shuffles differently."""
    first, second = _rows_in_training_order(1, "training/2018-04-01.parquet")
    assert sorted(first) == sorted(second) == list(range(24))
    assert first != list(range(24)) and first != second
    assert _rows_in_training_order(1, "training/2018-04-01.parquet") == [first, second]
    assert _rows_in_training_order(2, "training/2018-04-01.parquet")[0] != first
    assert _rows_in_training_order(1, "training/2018-04-02.parquet")[0] != first


def test_the_batch_order_seeds_are_fixed_across_releases() -> None:
    """A mid-shard checkpoint written by an earlier image resumes on the order that image began (the Job's
    image changes with the code, the share's checkpoints stay): the seed of a (seed, shard, epoch) never
    changes, nor depends on the process (no str hash). Known answers, recorded when it was introduced."""
    assert _shard_seed(0, "training/2018-04-01.parquet", 0) == 2046178966538794369
    assert _shard_seed(7, "d1", 3) == 9028276728440724230
    assert _shard_seed(0, "training/2018-04-01.csv", 0) == 2046178966538794369, "a day's file type is not its order"


def test_accuracy_and_loss_sum_every_batch_of_the_last_epoch() -> None:
    """Four batches an epoch, two epochs, weights fixed in effect (lr 1e-6 moves no logit by more than ~1e-5):
    the model says fraud iff x > 0, with logit 2x and x = +-1. Accuracy is the share of rows whose sign agrees
    with the label over the last epoch; the loss is the sum of the four batch means (equal batches: the sum
    of every row's loss / 20), whatever order the rows came in."""
    x = np.repeat([1.0, 1.0, -1.0, -1.0], [30, 10, 10, 30])[:, None]  # already standardised: mean 0, std 1
    y = np.repeat([1, 0, 1, 0], [30, 10, 10, 30]).astype(np.float32)  # 40 of 80 frauds: pos_weight 1
    trainer = Trainer("r", HParams(hidden=(), epochs=2, batch_size=20, lr=1e-6, seed=3), ("x",), torch.device("cpu"))
    with torch.no_grad():
        trainer.model.net[0].weight.fill_(2.0)
        trainer.model.net[0].bias.zero_()
    trainer.begin_shard("d1", x)
    assert trainer.train_shard(x, y, lambda: True)
    assert trainer.train_accuracy(80) == 60 / 80
    right, wrong = np.log1p(np.exp(-2.0)), np.log1p(np.exp(2.0))
    assert trainer.last_epoch_loss() == pytest.approx((60 * right + 20 * wrong) / 20, rel=1e-4)


def test_integer_labels_train_like_float_ones() -> None:
    """TX_FRAUD is an integer column in the files: labels given as int64 train exactly as their float32 copy."""
    x, y = _day(40, n=90)
    weights = []
    for labels in (y, y.astype(np.int64)):
        trainer = Trainer("r", HParams(hidden=(3,), epochs=1, batch_size=32, seed=4), tuple("abcd"),
                          torch.device("cpu"))
        trainer.begin_shard("d1", x)
        assert trainer.train_shard(x, labels, lambda: True)
        weights.append(checkpoint_of(trainer)["model"])
        assert trainer.train_accuracy(90) > 0
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_new_trainers_calibration_is_the_identity_in_float64() -> None:
    """The checkpoint stores the two numbers as float64 tensors from the first day on, as set_calibration does."""
    state = checkpoint_of(Trainer("r", HParams(hidden=(4,)), ("a", "b", "c", "d")))
    assert {k: (v.dtype, float(v)) for k, v in state["calibration"].items()} == \
        {"scale": (torch.float64, 1.0), "shift": (torch.float64, 0.0)}


def test_a_format_2_day_stopped_mid_way_resumes_with_the_runs_epochs() -> None:
    """A format-2 checkpoint's in-day progress has no epoch count: the day goes on with `epochs`, and ends as the
    undisturbed day does."""
    hp = HParams(hidden=(8,), epochs=3, batch_size=64, ema_decay=0.9)
    x, y = _day(3)
    whole = Trainer("r", hp, ("a", "b", "c", "d"))
    whole.begin_shard("d1", x)
    assert whole.train_shard(x, y, lambda: True)
    first = Trainer("r", hp, ("a", "b", "c", "d"))
    first.begin_shard("d1", x)
    left = iter(range(4, -1, -1))
    assert not first.train_shard(x, y, lambda: next(left) > 0)
    state = checkpoint_of(first)
    state["progress"] = {k: v for k, v in state["progress"].items() if k != "epochs"}
    resumed = trainer_from(state)
    resumed.begin_shard("d1", x)
    assert resumed.train_shard(x, y, lambda: True)
    assert resumed.steps == whole.steps == 3 * 11
    assert all(torch.equal(v, resumed.model.state_dict()[k]) for k, v in whole.model.state_dict().items())


def test_deterministic_kernels_are_asked_of_cuda_only() -> None:
    """On CUDA, torch is asked for deterministic kernels (warning where it has none) and cuDNN stops
    benchmarking; on the CPU nothing is changed (its kernels are deterministic already, and the
    global switch would turn every nondeterministic op into a warning). The flags are torch's own and
    need no GPU to set."""
    from workload.model.trainer import use_deterministic
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark)
    try:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = True
        use_deterministic(torch.device("cpu"))
        assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
        use_deterministic(torch.device("cuda"))
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert not torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]
