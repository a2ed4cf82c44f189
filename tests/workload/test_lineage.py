"""The run's lineage, typed (workload/model/lineage.py): every checkpoint format an older version wrote still
loads as that version loaded it, the rewind rule on its own, and the checkpoint's keys read in that module only."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from workload.core.errors import NonFinite
from workload.data import features
from workload.model import lineage
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
    with pytest.raises(NonFinite, match=r"^main/x: training produced non-finite weights "):
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
