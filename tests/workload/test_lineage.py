"""The run's lineage, typed (workload/model/lineage.py): every checkpoint format an older version wrote still
loads as that version loaded it, the rewind rule on its own, and the checkpoint's keys read in that module only."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import math
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import torch

from workload.core.errors import ItemFault, NonFinite
from workload.data import features, simulator
from workload.data.dataset import Dataset
from workload.data.manifest import write_manifest
from workload.model import lineage, metrics
from workload.model.hparams import HParams
from workload.model.lineage import Checkpoint, Lineage, LineageState, Rewind
from workload.model.trainer import Trainer
from workload.share.checkpoint import CheckpointStore, checkpoint_name

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "checkpoints"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CPU = torch.device("cpu")


# -- older formats ----------------------------------------------------------------------------------------------------
def _day(seed: int, n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """The fixtures' days (README.md there: the same generator)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype(np.float32), (rng.random(n) < 0.2).astype(np.float32)


def _digest(t: Trainer) -> str:
    h = hashlib.sha256()
    for part in (t.model.state_dict(), t.averaged.state_dict(), t.norm.state()):
        for k, v in part.items():
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_older_checkpoint_format_loads_as_the_code_that_wrote_it_loaded_it(name: str) -> None:
    """Files written before the lineage module (formats 2 to 5, with and without rewind records, at a boundary
    and mid-day): the same upgraded hyperparameters, progress, calibration and history, the same weights, the
    same scores, and the same weights after training one more day, bit for bit."""
    expected = EXPECTED[name]
    state = LineageState.read(torch.load(FIXTURES / f"{name}.pt", weights_only=True))
    t = state.trainer(CPU)
    probe, _ = _day(9, n=16)
    seen = {"hparams": t.hp.to_dict(), "applied": t.applied, "progress": t.progress, "steps": t.steps,
            "history": t.history, "reapplied": t.reapplied,
            "calibration": [float(t.calibration["scale"]), float(t.calibration["shift"])],
            "correct": None if t._correct is None else int(t._correct),
            "loaded": _digest(t), "scores": hashlib.sha256(t.score(probe).tobytes()).hexdigest()}
    (x, y), (x2, y2) = _day(1), _day(2)
    t.begin_shard("training/2026-01-02.parquet", x2)
    assert t.train_shard(np.concatenate([x, x2]), np.concatenate([y, y2]), lambda: True)
    seen |= {"after_training_day_2": _digest(t), "train_accuracy": t.train_accuracy(96)}
    assert json.loads(json.dumps(seen)) == expected
    again = LineageState.read(state.to_checkpoint())  # written back: today's format, the same lineage
    assert again.to_checkpoint()["format"] == lineage.FORMAT and again.hparams == t.hp.to_dict() | {
        k: v for k, v in again.hparams.items() if k not in t.hp.to_dict()}
    assert (again.applied, again.progress, again.reapplied) == (state.applied, state.progress, state.reapplied)


def test_an_unreadable_format_is_refused_in_one_line() -> None:
    raw = torch.load(FIXTURES / "format5_boundary.pt", weights_only=True)
    for bad in (1, None, 6):
        with pytest.raises(ValueError, match=rf"^checkpoint format {bad!r} is not supported \(readable: 2, 3, 4, 5\); "
                                             "start a new run with this code version$"):
            LineageState.read({**raw, "format": bad})


# -- the questions the runtime asks -----------------------------------------------------------------------------------
def _state(applied: tuple[str, ...], progress: dict | None = None) -> LineageState:
    base = LineageState.of(Trainer("r", HParams(hidden=(2,)), ("a", "b"), CPU))
    return dataclasses.replace(base, applied=applied, progress=progress)


def test_a_state_answers_applied_mid_day_and_boundary() -> None:
    at_end = _state(("d1", "d2"))
    assert at_end.has_applied("d2") and not at_end.has_applied("d3")
    assert at_end.is_boundary and at_end.mid_day is None
    mid = _state(("d1",), {"shard": "d2", "epoch": 0, "batch": 3, "epochs": 1})
    assert not mid.is_boundary and mid.mid_day == "d2"


ORDER = ["d1", "d2", "d3", "d4"]


def test_a_day_after_the_applied_ones_needs_no_rewind() -> None:
    assert Rewind.needed(None, "d1", ORDER) is None  # a cold start
    assert Rewind.needed(_state(("d1", "d2")), "d3", ORDER) is None
    assert Rewind.needed(_state(("d1", "d2")), "elsewhere", ORDER) is None  # reading the day refuses it


def test_a_late_day_goes_back_to_the_boundary_holding_exactly_the_days_before_it() -> None:
    rewind = Rewind.needed(_state(("d1", "d3", "d4")), "d2", ORDER)
    assert rewind == Rewind(day="d2", later=("d3", "d4"), earlier=("d1",), again=(("d3", 2), ("d4", 3)))
    assert rewind.is_target(_state(("d1",)).to_checkpoint())
    assert not rewind.is_target(_state(("d1", "d3")).to_checkpoint())
    assert not rewind.is_target(_state(("d1",), {"shard": "d3", "epoch": 0, "batch": 1}).to_checkpoint())
    first = Rewind.needed(_state(("d2", "d3")), "d1", ORDER)
    assert first.earlier == () and first.again == (("d2", 1), ("d3", 2), ("d4", 3))


def _save(store: CheckpointStore, state: LineageState, token: int = 1) -> Path:
    path = store.save(state.to_checkpoint(), path=store.next_path(token), may_promote=lambda: True,
                      boundary=state.is_boundary)
    assert path is not None
    return path


def test_the_rewind_starts_from_the_boundary_before_the_late_day_and_records_itself(tmp_path: Path) -> None:
    """Retention keeps every boundary (the store is told which are), so the late day finds its boundary even
    behind newer mid-day checkpoints; the later days go back to pending; the record names the boundary."""
    store = CheckpointStore(tmp_path, keep=1)
    assert store.fence(1)
    boundary = _save(store, _state(("d1",)))
    _save(store, _state(("d1",), {"shard": "d3", "epoch": 0, "batch": 1}))
    _save(store, dataclasses.replace(_state(("d1", "d3")), reapplied=({"day": "old"},)))
    _save(store, _state(("d1", "d3"), {"shard": "d4", "epoch": 0, "batch": 1}))
    assert store.retained() >= {boundary.name}
    found = lineage.newest(store, "d2")  # mid-way through d4: passed over for the last boundary
    assert found.state.applied == ("d1", "d3") and found.state.is_boundary
    start = lineage.start_for(store, found, "d2", lambda: ORDER, "r")
    assert start.checkpoint.path == boundary and start.again == (("d3", 2), ("d4", 3))
    assert start.reapplied[0] == {"day": "old"}
    record = start.reapplied[1]
    assert {k: record[k] for k in ("day", "reapplied", "from")} == {"day": "d2", "reapplied": ["d3"],
                                                                    "from": boundary.name}
    assert record["why"] == "d2 arrived after d3 was applied (a backfill or a requeued day)"
    assert lineage.start_for(store, found, "d4", lambda: ORDER, "r") == lineage.Start(found)


def test_a_late_day_whose_boundary_was_pruned_detours_by_the_nearest_kept_one_and_a_first_day_starts_cold(
        tmp_path: Path) -> None:
    """The boundary holding (d1, d2) is gone, (d1,) is kept: the run goes back to (d1,), d2 and every day after
    it go back to pending (d2 first), and the late day waits for them; with no boundary kept, a cold start."""
    store = CheckpointStore(tmp_path)
    assert store.fence(1)
    kept = _save(store, _state(("d1",)))
    _save(store, _state(("d1", "d2", "d4")))
    found = lineage.newest(store, "d3")
    start = lineage.start_for(store, found, "d3", lambda: ORDER, "r")
    assert start.checkpoint.path == kept and start.detour == (("d2", 1),)
    assert start.again == (("d2", 1), ("d4", 3)) and start.reapplied[-1]["from"] == kept.name
    kept.unlink()
    cold = lineage.start_for(store, lineage.newest(store, "d3"), "d3", lambda: ORDER, "r")
    assert cold.checkpoint is None and cold.detour == (("d1", 0), ("d2", 1))
    assert cold.reapplied[-1]["from"] == "a cold start"
    first = lineage.start_for(store, found, "d0", lambda: ["d0", *ORDER], "r")
    assert first.checkpoint is None and first.again == (("d1", 1), ("d2", 2), ("d3", 3), ("d4", 4))
    assert not first.detour and first.reapplied[-1]["from"] == "a cold start"


def test_applied_days_are_the_newest_checkpoints(tmp_path: Path) -> None:
    assert lineage.applied_days(tmp_path) == set()
    store = CheckpointStore(tmp_path)
    assert store.fence(1)
    _save(store, _state(("d1",)))
    _save(store, _state(("d1", "d2"), {"shard": "d3", "epoch": 0, "batch": 1}))
    assert lineage.applied_days(tmp_path) == {"d1", "d2"}


def test_what_save_promoted_is_described_from_its_name_alone(tmp_path: Path) -> None:
    """The worker reports from the checkpoint it just promoted without reading it back: its seq and token
    come from the file name, as a load would give them."""
    store = CheckpointStore(tmp_path)
    kept = _state(("d1",))
    path = _save(store, kept, token=3)
    promoted = Checkpoint.promoted(kept, path)
    assert promoted.state is kept  # the state just saved, as it is in memory
    loaded = lineage.load(store)
    assert (promoted.path, promoted.seq, promoted.token) == (loaded.path, loaded.seq, loaded.token) == (path, 1, 3)
    far = Checkpoint.promoted(kept, store.dir / checkpoint_name(123_456_789, 4))
    assert (far.seq, far.token) == (123_456_789, 4), "a ninth digit of seq is read too"
    with pytest.raises(ValueError, match=r"model\.pt is not a checkpoint file name$"):
        Checkpoint.promoted(kept, tmp_path / "model.pt")


def test_check_finite_names_what_is_not_finite() -> None:
    hp = HParams(hidden=(8,), epochs=1, batch_size=256)
    trainer = Trainer("main", hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
    Lineage(trainer).check_finite("main/x", loss=0.5, scores=np.array([0.1, 0.9]))
    Lineage(trainer).check_finite("main/x")
    with pytest.raises(NonFinite, match=r"^main/x: the training loss is inf; nothing was promoted$"):
        Lineage(trainer).check_finite("main/x", loss=math.inf)
    with pytest.raises(NonFinite, match=r"^main/x: the training loss is nan"):
        Lineage(trainer).check_finite("main/x", loss=math.nan)
    with pytest.raises(NonFinite, match=r"^main/x: the model's test scores are non-finite \(NaN or infinity\); "
                       r"nothing was promoted: check the test days' data for extreme values$"):
        Lineage(trainer).check_finite("main/x", scores=np.array([0.1, np.nan]))
    with torch.no_grad():
        next(iter(trainer.averaged.parameters())).view(-1)[0] = math.inf
    with pytest.raises(NonFinite, match=r"^main/x: training produced non-finite averaged weights "):
        Lineage(trainer).check_finite("main/x")
    trainer = Trainer("main", hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
    with torch.no_grad():
        next(iter(trainer.model.parameters())).view(-1)[0] = math.nan
    with pytest.raises(NonFinite, match=r"^main/x: training produced non-finite weights net\.0\.weight \(NaN or "
                       r"infinity\); nothing was promoted: check the day's data for extreme values$"):
        Lineage(trainer).check_finite("main/x")
    trainer = Trainer("main", hp, features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
    key, value = next(iter(trainer.norm.state().items()))
    value.view(-1)[0] = math.nan
    trainer.norm.load({**trainer.norm.state(), key: value})
    with pytest.raises(NonFinite, match=rf"^main/x: training produced non-finite feature normaliser {key} "):
        Lineage(trainer).check_finite("main/x")


# -- one home for the format --------------------------------------------------------------------------------------
# Reads of these names elsewhere that are not a checkpoint's: (module, the expression, why).
NOT_A_CHECKPOINT = {
    ("workload/queue/plan.py", "data['run']"): "a run record on the share (runs/<run>.json)",
    ("workload/queue/plan.py", "data['hparams']"): "a run record on the share (runs/<run>.json)",
    ("workload/queue/workqueue.py", "data['run']"): "a queue item",
    ("workload/queue/workqueue.py", "json.loads(raw)['run']"): "a queue item",
    ("workload/model/report.py", "r['reapplied']"): "one rewind record (lineage.Rewind.record writes it)",
    ("workload/model/report_html.py", "r['reapplied']"): "one rewind record (lineage.Rewind.record writes it)",
    ("workload/share/checkpoint.py", "'model' not in state"): "the store's one test that a file is a training "
                                                              "checkpoint at all, so a stray file falls back",
}


def key_reads(path: Path, keys: set[str]) -> list[str]:
    """`x["key"]`, `x.get("key")`, `x.pop("key")` and `"key" in x` for the checkpoint's keys in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop")
              and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
              and isinstance(node.ops[0], (ast.In, ast.NotIn))):
            key = node.left.value
        if key in keys:
            found.append(ast.unparse(node))
    return found


def test_the_checkpoints_keys_are_read_by_name_in_the_lineage_module_only() -> None:
    keys = set(lineage.checkpoint_of(Trainer("r", HParams(hidden=(2,)), ("a", "b"), CPU)))
    assert {"applied", "progress", "history", "reapplied", "hparams", "model", "format"} <= keys
    reads = {(str(p.relative_to(ROOT)), e) for p in (ROOT / "workload").rglob("*.py")
             if p.name != "lineage.py" for e in key_reads(p, keys)}
    assert reads - set(NOT_A_CHECKPOINT) == set(), "read the checkpoint through workload.model.lineage"
    assert key_reads(ROOT / "workload" / "model" / "lineage.py", keys), "the scan finds the reads that are there"


# -- the protocol's calls, as the worker makes them (workload/runtime/steps.py) ----------------------------------------
# Ten training days: the first ones end a label delay (7 days) before the test days, so calibration is fitted.
PROTOCOL_SPEC = simulator.SimulationSpec(customers=200, terminals=150, train_days=10, test_days=2,
                                         start_date="2018-04-01", seed=5)
PROTOCOL_HP = HParams(hidden=(8,), epochs=2, batch_size=64, window_days=2, seed=4)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """A small simulated dataset on disk: ten training days and two test days."""
    root = tmp_path_factory.mktemp("lineage") / "fraud"
    simulator.generate(root, PROTOCOL_SPEC)
    write_manifest(root)
    return Dataset(root)


def _closed(data: Dataset, tmp_path: Path, days: int, token: int = 1,
            accuracies: list[float] | None = None) -> tuple[Lineage, CheckpointStore, list]:
    """A run trained over its first `days` days as the worker does it: read, train, close, save each (each day's
    training accuracy, which closing it resets, appended to `accuracies`)."""
    store = CheckpointStore(tmp_path / "run")
    assert store.fence(token)
    run = Lineage.resume("main", PROTOCOL_HP, lineage.Start(None))
    closed = []
    for day in data.training_shards()[:days]:
        examples, window = run.read(data, day)
        seconds = run.train_day(day, examples, window, lambda: True, f"main/{day}")
        assert seconds is not None and seconds >= 0
        if accuracies is not None:
            accuracies.append(run.trainer.train_accuracy(len(window.y)))
        closed.append(run.close_day(data, day, examples, window, seconds, store, token, lambda: None))
        assert store.save(closed[-1].raw, path=closed[-1].checkpoint.path, may_promote=lambda: True,
                          boundary=True) == closed[-1].checkpoint.path
    return run, store, closed


def test_a_cold_start_is_a_new_trainer_of_this_codes_features_with_the_starts_rewind_records() -> None:
    records = ({"day": "d2", "reapplied": ["d3"], "from": "a cold start", "why": "w", "time": "t"},)
    run = Lineage.resume("main", PROTOCOL_HP, lineage.Start(None, reapplied=records))
    t = run.trainer
    assert (t.run, t.hp, t.feature_names, t.feature_version) == ("main", PROTOCOL_HP, features.FEATURE_NAMES,
                                                                 features.FEATURE_VERSION)
    assert t.applied == [] and t.progress is None
    assert t.reapplied == list(records) and t.reapplied[0] is not records[0], "the lineage's own copies"
    assert Lineage.resume("main", PROTOCOL_HP, lineage.Start(None)).trainer.reapplied == []


def test_a_day_reads_its_window_trains_and_closes_into_the_checkpoint_its_lease_writes_next(
        data: Dataset, tmp_path: Path) -> None:
    accuracies: list[float] = []
    run, store, closed = _closed(data, tmp_path, 3, token=2, accuracies=accuracies)
    accuracy = accuracies[-1]
    assert 0 < accuracy <= 1
    days = data.training_shards()[:3]
    assert run.trainer.applied == days
    examples, window = run.read(data, days[2])
    want_examples, want_window = data.day_and_window(days[1:3])  # window_days=2: the day before, then the day
    assert np.array_equal(window.x, want_window.x) and np.array_equal(examples.y, want_examples.y)
    last = closed[-1]
    assert (last.checkpoint.seq, last.checkpoint.token) == (3, 2) and last.checkpoint.path.parent == store.dir
    assert last.checkpoint.state.has_applied(days[2]) and last.checkpoint.state.is_boundary
    assert last.raw == last.checkpoint.state.to_checkpoint()
    entry = last.checkpoint.state.history[-1]
    test = data.test_examples()
    scores = run.trainer.score(test.x)
    evaluated = metrics.evaluate(scores, test.y, test.day, test.card)
    assert {k: entry[k] for k in ("shard", "checkpoint", "train_rows", "window_rows", "test_window")} == {
        "shard": days[2], "checkpoint": last.checkpoint.path.name, "train_rows": len(examples.y),
        "window_rows": len(window.y), "test_window": data.test_window()}
    assert entry["train_frauds"] == int(examples.y.sum())
    assert (entry["first_day"], entry["last_day"]) == (str(examples.day.min()), str(examples.day.max()))
    assert days[2] == f"training/{entry['first_day']}.parquet"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", entry["time"])
    assert entry["train_accuracy"] == accuracy
    assert {k: entry[k] for k in evaluated} == evaluated
    assert entry["calibration_days"] == days[:3], "the first days end a label delay before the test days"
    assert (entry["calibration_scale"], entry["calibration_shift"]) != (1.0, 0.0), "calibrated: not the raw"
    raw = run.trainer.probabilities(run.trainer.logits(test.x), False)
    assert (entry["brier_raw"], entry["ece_raw"]) == (metrics.brier(raw, test.y),
                                                      metrics.expected_calibration_error(raw, test.y))
    precision, recall = last.pr
    want_precision, want_recall = metrics.pr_curve(scores, test.y)
    assert np.array_equal(precision, want_precision) and np.array_equal(recall, want_recall)
    for got, want in zip(run.pr_curve(data), last.pr, strict=True):
        assert np.array_equal(got, want)
    for got, want in zip(run.pr_curve(data, np.zeros_like(scores)), metrics.pr_curve(np.zeros_like(scores), test.y),
                         strict=True):
        assert np.array_equal(got, want), "the scores given are the ones the curve is drawn from"


def test_closing_a_day_touches_the_lease_before_scoring_the_test_days(data: Dataset, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    assert store.fence(1)
    run = Lineage.resume("main", PROTOCOL_HP, lineage.Start(None))
    day = data.training_shards()[0]
    examples, window = run.read(data, day)
    run.train_day(day, examples, window, lambda: True, "main/d")
    order: list[str] = []
    logits = run.trainer.logits
    test_rows = len(data.test_examples().y)
    monkeypatch.setattr(run.trainer, "logits", lambda x, *a: (len(x) == test_rows and order.append("score"))
                        or logits(x, *a))
    closed = run.close_day(data, day, examples, window, 1.23456, store, 1, lambda: order.append("touch"))
    assert order == ["touch", "score"]
    assert closed.checkpoint.state.history[-1]["train_seconds"] == 1.235


def test_a_day_stopped_at_a_step_returns_none_mid_day_and_resumes_from_its_checkpoint_to_the_same_weights(
        data: Dataset, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="workload.model.lineage")
    whole, _, _ = _closed(data, tmp_path / "whole", 2)
    store = CheckpointStore(tmp_path / "cut")
    assert store.fence(1)
    run = Lineage.resume("main", PROTOCOL_HP, lineage.Start(None))
    first, second = data.training_shards()[:2]
    examples, window = run.read(data, first)
    run.train_day(first, examples, window, lambda: True, "main/a")
    assert caplog.messages[-1] == (f"main/a: training on {len(window.y)} rows ({len(examples.y)} of the day's), "
                                   "cold start")
    state = run.close_day(data, first, examples, window, 0.0, store, 1, lambda: None).checkpoint.state
    examples, window = run.read(data, second)
    steps = iter(range(3))
    assert run.train_day(second, examples, window, lambda: next(steps, None) is not None, "main/b") is None
    assert caplog.messages[-1].endswith("of the day's), warm start after 1 shard(s)")
    mid = run.checkpoint("main/b")
    assert mid.mid_day == second and not mid.is_boundary and mid.applied == state.applied
    path = store.save(mid.to_checkpoint(), path=store.next_path(1), may_promote=lambda: True, boundary=False)
    resumed = Lineage.resume("main", PROTOCOL_HP, lineage.Start(lineage.load(store)))
    assert resumed.trainer.progress == mid.progress and path is not None
    assert resumed.train_day(second, examples, window, lambda: True, "main/b") is not None
    progress = mid.progress
    assert caplog.messages[-1].endswith(f"resuming at epoch {progress['epoch']} batch {progress['batch']}")
    assert _digest(resumed.trainer) == _digest(whole.trainer), "stopped and resumed: the same weights, to the bit"


def test_a_checkpoint_of_other_features_is_refused_naming_it_and_other_hyperparameters_lose_to_it(
        data: Dataset, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, store, closed = _closed(data, tmp_path, 1)
    found = lineage.load(store)
    other = dataclasses.replace(found, state=dataclasses.replace(found.state, feature_version="0"))
    with pytest.raises(ItemFault, match=rf"^checkpoint {re.escape(str(found.path))} was trained on features .* "
                       r"version '0', this code computes .* version .*: start a new run$"):
        Lineage.resume("main", PROTOCOL_HP, lineage.Start(other))
    assert Lineage.as_saved(other).trainer.feature_version == "0", "its report is re-rendered as saved"
    renamed = dataclasses.replace(found, state=dataclasses.replace(
        found.state, feature_names=tuple(reversed(features.FEATURE_NAMES))))
    with pytest.raises(ItemFault, match="start a new run"):
        Lineage.resume("main", PROTOCOL_HP, lineage.Start(renamed))
    other_hp = dataclasses.replace(PROTOCOL_HP, lr=0.5)
    caplog.clear()  # the days trained above log at INFO where the root logger lets them through
    with caplog.at_level(logging.WARNING, logger="workload.model.lineage"):
        run = Lineage.resume("main", other_hp, lineage.Start(found))
    assert run.trainer.hp == PROTOCOL_HP and run.trainer.applied == [closed[0].checkpoint.state.applied[0]]
    assert caplog.messages == [f"run main: checkpoint hyperparameters {PROTOCOL_HP} differ from the share's "
                               f"{other_hp}; the checkpoint's lineage wins"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="workload.model.lineage"):
        Lineage.resume("main", PROTOCOL_HP, lineage.Start(found))
    assert caplog.messages == []


def test_a_mid_day_checkpoint_of_non_finite_weights_is_refused() -> None:
    run = Lineage.resume("main", PROTOCOL_HP, lineage.Start(None))
    assert run.checkpoint("main/d").applied == ()
    with torch.no_grad():
        next(iter(run.trainer.model.parameters())).view(-1)[0] = math.nan
    with pytest.raises(NonFinite, match=r"^main/d: training produced non-finite weights "):
        run.checkpoint("main/d")


def test_a_model_files_entries_leave_out_what_only_training_needs_and_load_back_to_the_same_scores(
        data: Dataset, tmp_path: Path) -> None:
    run, store, _ = _closed(data, tmp_path, 2)
    state = lineage.load(store).state
    entries = state.scoring_entries()
    assert set(lineage.TRAINING_ONLY) == {"optimizer", "rng", "progress"}
    assert set(entries) == set(state.to_checkpoint()) - set(lineage.TRAINING_ONLY)
    assert {"model", "averaged", "norm", "calibration"} <= set(entries)
    back = LineageState.from_scoring_entries(entries, "--model m.safetensors").trainer(CPU)
    test = data.test_examples()
    assert np.array_equal(back.score(test.x), run.trainer.score(test.x))
    assert back.hp == run.trainer.hp and back.applied == run.trainer.applied
    bad = {**entries, "hparams": {**entries["hparams"], "batch_size": 0}}
    with pytest.raises(ValueError, match=r"^--model m\.safetensors: hparams"):
        LineageState.from_scoring_entries(bad, "--model m.safetensors")
    mid = run.checkpoint("main/x")
    assert mid.is_boundary  # closed: nothing half-trained
    half = dataclasses.replace(mid, progress={"shard": "d9", "epoch": 0, "batch": 1, "epochs": 1}).to_checkpoint()
    with pytest.raises(ValueError, match=r"^state is mid-way through \{'shard': 'd9'.*\}; export a shard-boundary "
                       r"checkpoint$"):
        lineage.scoring_entries(half)


def test_the_newest_boundary_with_a_day_applied_is_what_export_and_score_read(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.fence(1)
    assert lineage.newest_boundary(store) is None
    _save(store, _state(()))  # a boundary with nothing applied: nothing to export
    assert lineage.newest_boundary(store) is None
    first = _save(store, _state(("d1",)))
    _save(store, _state(("d1",), {"shard": "d2", "epoch": 0, "batch": 1}))
    found = lineage.newest_boundary(store)
    assert found.path == first and found.state.applied == ("d1",)
    second = _save(store, _state(("d1", "d2")))
    assert lineage.newest_boundary(store).path == second


def test_the_newest_checkpoint_is_taken_unless_it_is_mid_way_through_another_day(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path)
    assert store.fence(1)
    assert lineage.newest(store, "d1") is None
    boundary = _save(store, _state(("d1",)))
    with caplog.at_level(logging.WARNING, logger="workload.model.lineage"):
        assert lineage.newest(store, "d2").path == boundary
    assert caplog.messages == [], "a boundary is taken as it is"
    mid = _save(store, _state(("d1", "d2"), {"shard": "d3", "epoch": 0, "batch": 1}))
    assert lineage.newest(store, "d3").path == mid, "its own day resumes there"
    assert lineage.newest(store, "d2").path == mid, "it holds the day already: the day is only acked"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="workload.model.lineage"):
        assert lineage.newest(store, "d4").path == boundary
    assert caplog.messages == [f"checkpoint {mid.name} is mid-way through d3, not d4: starting from the last shard "
                               "boundary"]


def test_a_day_applied_already_is_neither_earlier_nor_later_and_an_older_version_of_a_day_is_later() -> None:
    state = _state(("d1", "d2", "d3"))
    assert Rewind.needed(state, "d2", ORDER) == Rewind(day="d2", later=("d3",), earlier=("d1",),
                                                      again=(("d3", 2), ("d4", 3)))
    relabelled = Rewind.needed(_state(("d1", "d3@v1")), "d2", ORDER)
    assert relabelled == Rewind(day="d2", later=("d3@v1",), earlier=("d1",), again=(("d3", 2), ("d4", 3)))
    record = relabelled.record(None, ORDER)
    assert record["why"] == "d2 carries new labels for d3@v1 (late labels)" and record["from"] == "a cold start"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", record["time"])
    assert relabelled.record(None)["why"] == "d2 arrived after d3@v1 was applied (a backfill or a requeued day)"
    two = Rewind(day="d1", later=("d2", "x@v1", "y@v1"), earlier=(), again=())
    assert two.record(None, ORDER)["why"] == "d1 carries new labels for x@v1 (late labels)"


def test_a_rewind_goes_back_to_the_boundary_holding_exactly_the_earlier_days_before_any_newer_shorter_one(
        tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.fence(1)
    exact = _save(store, _state(("d1", "d2")))
    _save(store, _state(("d1",)))  # newer, after an earlier rewind: a prefix of what the rewind needs
    rewind = Rewind(day="d3", later=("d4",), earlier=("d1", "d2"), again=(("d4", 3),))
    assert rewind.target(store).path == exact


def test_a_rewinds_record_in_start_for_names_late_labels_in_both_its_paths(tmp_path: Path) -> None:
    """Whether the rewind's boundary is kept or pruned, its record says why with the dataset's order in hand."""
    store = CheckpointStore(tmp_path)
    assert store.fence(1)
    _save(store, _state(("d1",)))
    found = lineage.load(store)
    found = dataclasses.replace(found, state=_state(("d1", "d3@v1")))
    kept = lineage.start_for(store, found, "d2", lambda: ORDER, "r")
    assert kept.reapplied[-1]["why"] == "d2 carries new labels for d3@v1 (late labels)"
    pruned = lineage.start_for(store, dataclasses.replace(found, state=_state(("d1", "d2", "d4@v1"))), "d3",
                               lambda: ORDER, "r")
    assert pruned.detour == (("d2", 1),)
    assert pruned.reapplied[-1]["why"] == "d3 carries new labels for d4@v1 (late labels)"


def test_a_state_read_keeps_the_code_version_that_wrote_it() -> None:
    raw = _state(("d1",)).to_checkpoint()
    assert LineageState.read({**raw, "code_version": "0.9.1"}).code_version == "0.9.1"
    assert LineageState.read({k: v for k, v in raw.items() if k != "code_version"}).code_version == ""


def test_record_times_are_utc_whatever_the_machines_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # +09:00 all year: never the UTC date and hour at once
    time.tzset()
    try:
        before = datetime.now(UTC).replace(microsecond=0)
        stamp = datetime.strptime(lineage._now(), "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)
        after = datetime.now(UTC)
    finally:
        monkeypatch.undo()  # the machine's own TZ (or none) back, then read again
        time.tzset()
    assert before <= stamp <= after


def test_closing_a_day_refuses_a_non_finite_loss_or_test_scores_naming_the_run_and_day(
        data: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path)
    assert store.fence(1)
    run = Lineage.resume("main", PROTOCOL_HP, lineage.Start(None))
    day = data.training_shards()[0]
    examples, window = run.read(data, day)
    started = time.monotonic()
    seconds = run.train_day(day, examples, window, lambda: True, "main/d")
    assert 0 <= seconds <= time.monotonic() - started
    t = run.trainer

    def close() -> lineage.ClosedDay:
        return run.close_day(data, day, examples, window, 0.0, store, 1, lambda: None)

    monkeypatch.setattr(t, "last_epoch_loss", lambda: math.inf)
    with pytest.raises(NonFinite, match=rf"^main/{re.escape(day)}: the training loss is inf; nothing was promoted$"):
        close()
    monkeypatch.undo()
    test_rows = len(data.test_examples().y)
    logits = t.logits
    monkeypatch.setattr(t, "logits", lambda x, *a: np.full(len(x), np.nan, np.float32) if len(x) == test_rows
                        else logits(x, *a))
    with pytest.raises(NonFinite, match=rf"^main/{re.escape(day)}: the model's test scores are non-finite"):
        close()
    monkeypatch.undo()
    empty = dataclasses.replace(examples, **{k: getattr(examples, k)[:0] for k in ("x", "y", "day", "card", "known",
                                                                                    "ids")})
    entry = run.close_day(data, day, empty, window, 0.0, store, 1, lambda: None).checkpoint.state.history[-1]
    assert (entry["first_day"], entry["last_day"], entry["train_rows"]) == ("", "", 0)
