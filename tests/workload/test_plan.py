"""The share records what must be trained: run specs written once, items derived from manifests."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

import pytest

from workload.queue import plan
from workload.share.paths import check_name, runs_dir


def _spec(run: str = "main", dataset: str = "fraud", **hp) -> plan.RunSpec:
    return plan.RunSpec(run=run, dataset=dataset, hparams={"epochs": 1, **hp})


def test_a_run_is_recorded_once_and_the_same_spec_again_is_a_no_op(tmp_path: Path) -> None:
    assert plan.record(tmp_path, _spec()) is True
    assert plan.record(tmp_path, _spec()) is False
    assert plan.runs(tmp_path) == {"main": _spec()}
    assert not [p for p in runs_dir(tmp_path).iterdir() if p.name.startswith(".")], "temp files left behind"


def test_a_different_spec_for_an_existing_run_is_refused_and_the_record_kept(tmp_path: Path) -> None:
    plan.record(tmp_path, _spec())
    with pytest.raises(plan.PlanError, match=r"run 'main' already exists.*new run name"):
        plan.record(tmp_path, _spec(lr=0.1))
    with pytest.raises(plan.PlanError, match="dataset 'other'"):
        plan.record(tmp_path, _spec(dataset="other"))
    assert plan.runs(tmp_path)["main"] == _spec()


def _race(args: tuple[str, float]) -> str:
    share, lr = args
    try:
        plan.record(Path(share), _spec(lr=lr))
        return "recorded"
    except plan.PlanError:
        return "refused"


def test_racing_seeders_create_one_record(tmp_path: Path) -> None:
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_race, [(str(tmp_path), 0.001 * (i + 1)) for i in range(8)])
    assert results.count("recorded") == 1, results
    assert list(plan.runs(tmp_path)) == ["main"]


@pytest.mark.parametrize("content, match", [
    ("{not json", "not a run record"),
    (json.dumps({"run": "main", "dataset": "fraud"}), "not a run record"),
    (json.dumps({"run": "../x", "dataset": "fraud", "hparams": {}}), "not a run record"),
    (json.dumps({"run": "other", "dataset": "fraud", "hparams": {}}), "named for 'main'"),
])
def test_a_damaged_record_names_its_file(tmp_path: Path, content: str, match: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    runs_dir(tmp_path).mkdir(parents=True)
    (runs_dir(tmp_path) / "main.json").write_text(content)
    with pytest.raises(plan.PlanError, match=match) as err:
        plan.spec(tmp_path, "main")
    assert "main.json" in str(err.value)
    assert plan.runs(tmp_path) == {}, "skipped when the runs are listed (test_plan_stray.py)"
    assert f"skipped, not a run: {err.value}; remove it" in caplog.text


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "/abs", "a/b", ".hidden", "x" * 64, "tab\tname", None, 7])
def test_names_that_are_not_plain_folder_names_are_refused(name) -> None:
    with pytest.raises(ValueError, match="is not allowed"):
        check_name(name, "run")


def test_items_cover_every_recorded_run_in_chronological_order(tmp_path: Path, dataset_src: Path) -> None:
    shutil.copytree(dataset_src, tmp_path / "datasets" / "fraud")
    plan.record(tmp_path, _spec("a"))
    plan.record(tmp_path, _spec("b", lr=0.01))
    items = plan.items(tmp_path)
    shards = [i.shard for i in items if i.run == "a"]
    assert shards == [i.shard for i in items if i.run == "b"] and len(shards) == 6
    assert [i.seq for i in items if i.run == "a"] == list(range(6))
    assert {i.dataset for i in items} == {"fraud"}
    assert [i.run for i in plan.items(tmp_path, only={"b": plan.runs(tmp_path)["b"]})] == ["b"] * 6


def test_the_gap_line_says_what_the_queue_lacks_of_the_share() -> None:
    """The one line `status` and the worker's log print: nothing lacking, or each kind of lack, three names at most."""
    whole = plan.Gap(runs=2, items=12, missing_runs=[], missing_items=[], token=7, token_floor=7)
    assert not whole
    assert whole.line() == "share vs queue: the share's plan is 2 run(s), 12 item(s); the queue holds them all"
    behind = plan.Gap(runs=2, items=12, missing_runs=["a", "b", "c", "d", "e"], missing_items=["a/1", "a/2", "a/3"],
                      token=3, token_floor=9)
    assert behind
    assert behind.line() == (
        "share vs queue: the share's plan is 2 run(s), 12 item(s); the queue is BEHIND: it lacks 5 run(s) (a, b, c "
        "and 2 more), 3 item(s) (a/1, a/2, a/3), a token counter at 3, below the share's 9 (Redis restored from an "
        "older snapshot?); a worker adds them at start and before it exits")
    for lacking, lacks in (({"missing_runs": ["a"]}, "1 run(s) (a)"), ({"missing_items": ["a/1"]}, "1 item(s) (a/1)"),
                           ({"token": 6}, "a token counter at 6, below the share's 7")):
        one = plan.Gap(**{"runs": 1, "items": 1, "missing_runs": [], "missing_items": [], "token": 7,
                          "token_floor": 7, **lacking})
        assert one and f"the queue is BEHIND: it lacks {lacks} (Redis restored" in one.line()
