"""The share's run records, read and written in-process: names checked with what they name, the file's exact
text, nothing left behind by a write, a hidden file never read as a run, and a refusal naming the way out."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from workload.queue import plan
from workload.share.paths import runs_dir

SPEC = plan.RunSpec(run="main", dataset="fraud", hparams={"epochs": 2, "hidden": [8]})


def test_a_record_is_written_whole_as_sorted_indented_json_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    share = tmp_path / "share"  # runs_dir's parents do not exist yet: record makes them
    assert plan.record(share, SPEC) is True
    folder = runs_dir(share)
    assert sorted(p.name for p in folder.iterdir()) == ["main.json"]
    assert (folder / "main.json").read_text() == (
        '{\n "dataset": "fraud",\n "hparams": {\n  "epochs": 2,\n  "hidden": [\n   8\n  ]\n },\n "run": "main"\n}\n')
    assert plan.record(share, SPEC) is False, "the same spec again: already recorded"
    assert sorted(p.name for p in folder.iterdir()) == ["main.json"]
    other = plan.RunSpec(run="main", dataset="fraud", hparams={"epochs": 3})
    with pytest.raises(plan.PlanError, match=r"A run is one model lineage: give the new hyperparameters a new run "
                                             r"name\.$"):
        plan.record(share, other)
    assert sorted(p.name for p in folder.iterdir()) == ["main.json"], "a refused record leaves nothing"


@pytest.mark.parametrize(("spec", "what"), [
    (plan.RunSpec(run="../up", dataset="fraud", hparams={}), "run '../up'"),
    (plan.RunSpec(run="main", dataset="a/b", hparams={}), "dataset 'a/b'"),
])
def test_a_bad_name_is_refused_naming_what_it_names_before_anything_is_written(tmp_path: Path, spec: plan.RunSpec,
                                                                               what: str) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(what)} is not allowed: use "):
        plan.record(tmp_path, spec)
    assert not runs_dir(tmp_path).exists()


def test_spec_reads_a_recorded_run_and_none_for_an_unknown_one_and_refuses_a_bad_name(tmp_path: Path) -> None:
    plan.record(tmp_path, SPEC)
    assert plan.spec(tmp_path, "main") == SPEC
    assert plan.spec(tmp_path, "other") is None
    with pytest.raises(ValueError, match=r"^run '\.\./main' is not allowed: use "):
        plan.spec(tmp_path, "../main")


@pytest.mark.parametrize(("record", "what"), [
    ({"run": "../main", "dataset": "fraud", "hparams": {}}, "run '../main'"),
    ({"run": "main", "dataset": "../fraud", "hparams": {}}, "dataset '../fraud'"),
])
def test_a_record_naming_a_bad_run_or_dataset_is_refused_naming_which(tmp_path: Path, record: dict,
                                                                      what: str) -> None:
    folder = runs_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "main.json").write_text(json.dumps(record))
    with pytest.raises(plan.PlanError, match=rf": not a run record \({re.escape(what)} is not allowed: use "):
        plan.spec(tmp_path, "main")


def test_runs_skips_hidden_files_such_as_a_writers_temporary_one(tmp_path: Path) -> None:
    plan.record(tmp_path, SPEC)
    (runs_dir(tmp_path) / ".main.json").write_text("{half a record")
    assert plan.runs(tmp_path) == {"main": SPEC}


def test_a_seeder_killed_before_linking_its_record_leaves_one_hidden_temporary_file_beside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a seeder killed just before it links its record into place leaves, seen at that point (recorded around
    the real os.link, so the record is still made): one hidden `.main.<random>.tmp` in the runs folder, beside where
    the record goes (a link cannot cross file systems: the share is NFS, the pod's /tmp is not), holding the whole
    record; runs() reads nothing from it."""
    seen: list[tuple[Path, Path, list[str], dict, str]] = []
    real_link = os.link

    def link(src: str, dst: str, *args, **kwargs) -> None:
        names = sorted(p.name for p in runs_dir(tmp_path).iterdir())
        seen.append((Path(src), Path(dst), names, plan.runs(tmp_path), Path(src).read_text()))
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    assert plan.record(tmp_path, SPEC) is True
    ((temp, target, names, recorded, text),) = seen
    assert target == runs_dir(tmp_path) / "main.json" and temp.parent == target.parent
    assert names == [temp.name] and re.fullmatch(r"\.main\.[a-z0-9_]{8}\.tmp", temp.name), temp.name
    assert recorded == {} and text == SPEC.to_json()
    assert sorted(p.name for p in runs_dir(tmp_path).iterdir()) == ["main.json"]
