"""`make mutation`'s scope stays true to the tree: a module or test renamed or moved fails here, in
`make test`, instead of an hour into a mutation run (or, worse, silently mutating nothing)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from bench import mutation

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("group", mutation.GROUPS, ids=[g.name for g in mutation.GROUPS])
def test_every_module_and_test_of_a_group_exists(group: mutation.Group) -> None:
    for path in (*group.modules, *group.tests):
        assert (ROOT / path).is_file(), f"{group.name}: {path} does not exist; update GROUPS in bench/mutation.py"
    assert group.tests or group.pending, f"{group.name}: no tests and no reason given"


def scope_modules(root: Path) -> set[str]:
    """Every module of the packages in scope, as paths from the checkout's root."""
    return {str(p.relative_to(root)) for pkg in mutation.SCOPE_PACKAGES for p in (root / pkg).rglob("*.py")
            if "__pycache__" not in p.parts}


def unscoped(root: Path) -> list[str]:
    """Modules that no group mutates and that the out-of-scope list does not name."""
    grouped = {m for g in mutation.GROUPS for m in g.modules}
    return sorted(scope_modules(root) - grouped - set(mutation.OUT_OF_SCOPE))


def test_every_module_is_mutated_or_left_out_by_name_with_its_reason() -> None:
    """New code cannot slip out of `make mutation`: a module of workload/, infra/ or policy/ is in a group
    or named, with why, in OUT_OF_SCOPE."""
    assert unscoped(ROOT) == [], "add these to a group in bench/mutation.py (or to OUT_OF_SCOPE, with why)"
    grouped = {m for g in mutation.GROUPS for m in g.modules}
    for module, why in mutation.OUT_OF_SCOPE.items():
        assert (ROOT / module).is_file(), f"OUT_OF_SCOPE names {module}, which does not exist"
        assert module not in grouped, f"{module} is both mutated and left out"
        assert why.strip(), f"{module}: no reason given"


def test_groups_do_not_mutate_a_module_twice() -> None:
    modules = [m for g in mutation.GROUPS for m in g.modules]
    assert len(modules) == len(set(modules))


def test_the_shared_settings_name_paths_that_exist() -> None:
    settings = mutation.base_config()
    for path in (*settings["source_paths"], *settings["also_copy"]):
        assert (ROOT / path).exists(), path


def test_a_groups_pyproject_narrows_mutmut_and_keeps_the_rest() -> None:
    group = next(g for g in mutation.GROUPS if g.name == "metrics")
    original = (ROOT / "pyproject.toml").read_text()
    staged = tomllib.loads(mutation.group_pyproject(original, group))
    base = tomllib.loads(original)
    assert staged["tool"]["mutmut"] == {
        **base["tool"]["mutmut"],
        "only_mutate": list(group.modules),
        "pytest_add_cli_args_test_selection": list(group.tests),
    }
    assert {k: v for k, v in staged["tool"].items() if k != "mutmut"} == {
        k: v for k, v in base["tool"].items() if k != "mutmut"
    }


def test_equivalent_mutants_are_recognised_by_their_text_only() -> None:
    nan = next(e for e in mutation.EQUIVALENT if e.before == 'float("nan")')
    assert nan.explains("workload/model/metrics.py", 'return float("nan")', 'return float("NAN")')
    assert not nan.explains("workload/model/metrics.py", 'return float("nan")', "return None")
    assert not nan.explains("workload/model/metrics.py", "return 0.0", "return 1.0")
    cast = next(e for e in mutation.EQUIVALENT if e.before == ".astype(np.float64)")
    line = "return tps.astype(np.float64), fps.astype(np.float64)"
    assert cast.explains("workload/model/metrics.py", line, "return tps.astype(np.float64), fps.astype(None)")
    assert not cast.explains("workload/model/metrics.py", line, "return tps.astype(None), fps.astype(None)")
    sort = next(e for e in mutation.EQUIVALENT if e.module == "workload/model/metrics.py")
    assert not sort.explains("workload/data/features.py", sort.before, sort.after)  # only where the reason holds


def test_a_groups_own_patterns_add_to_the_shared_ones() -> None:
    """A group's do_not_mutate_patterns leave the shared ones (log calls) in force."""
    group = next(g for g in mutation.GROUPS if g.do_not_mutate_patterns)
    original = (ROOT / "pyproject.toml").read_text()
    staged = tomllib.loads(mutation.group_pyproject(original, group))["tool"]["mutmut"]["do_not_mutate_patterns"]
    shared = mutation.base_config()["do_not_mutate_patterns"]
    assert shared and staged == [*shared, *group.do_not_mutate_patterns]


def test_lanes_keep_the_waiting_groups_apart_and_share_the_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two lanes: the waiting groups in one, the others longest first in the other, half the jobs each; a lane
    done with its own list takes from the other's."""
    started: list[tuple[str, int]] = []
    release = {name: threading.Event() for name in "WwCcx"}

    def run_group(group: mutation.Group, jobs: int) -> tuple[list[mutation.ModuleResult], mutation.Run, str]:
        started.append((group.name, jobs))
        assert release[group.name].wait(120)
        return [], mutation.Run(0.0, 0.0, jobs * group.jobs_per_core), ""

    monkeypatch.setattr(mutation, "run_group", run_group)
    groups = [mutation.Group("c", (), (), cpu_minutes=2), mutation.Group("W", (), (), jobs_per_core=2, cpu_minutes=9),
              mutation.Group("C", (), (), cpu_minutes=8), mutation.Group("x", (), (), cpu_minutes=1),
              mutation.Group("w", (), (), jobs_per_core=2, cpu_minutes=3)]
    done: dict[str, object] = {}
    runner = threading.Thread(target=lambda: done.update(mutation.run_groups(groups, 4, 2)))
    runner.start()

    seen = 0  # the starts already returned: counted from 0, as the lanes may start before the first call

    def release_then_started(name: str, count: int) -> list[tuple[str, int]]:
        """Let `name` finish; the `count` groups that start next (and, a moment later, no more)."""
        nonlocal seen
        if name:
            release[name].set()
        deadline = time.monotonic() + 120
        while len(started) < seen + count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        new, seen = started[seen:], len(started)
        return sorted(new)

    try:
        assert release_then_started("", 2) == [("C", 2), ("W", 2)]
        assert release_then_started("W", 1) == [("w", 2)]
        assert release_then_started("w", 1) == [("c", 2)]  # the waiting lane takes from the other's list
        assert release_then_started("C", 1) == [("x", 2)]
        assert release_then_started("c", 0) == []  # nothing left: that lane leaves
    finally:  # a failed assertion must not leave the lanes running into the real run_group once the patch is undone
        for event in release.values():
            event.set()
        runner.join(120)
    assert sorted(done) == ["C", "W", "c", "w", "x"]


def test_one_lane_runs_the_groups_one_after_the_other_with_every_job(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[str, int]] = []

    def run_group(group: mutation.Group, jobs: int) -> tuple[list[mutation.ModuleResult], mutation.Run, str]:
        started.append((group.name, jobs))
        return [], mutation.Run(0.0, 0.0, jobs), ""

    monkeypatch.setattr(mutation, "run_group", run_group)
    groups = [mutation.Group("a", (), (), cpu_minutes=1), mutation.Group("b", (), (), jobs_per_core=2),
              mutation.Group("c", (), (), cpu_minutes=5)]
    mutation.run_groups(groups, 2, 1)
    assert started == [("b", 2), ("c", 2), ("a", 2)]


def test_the_incremental_mode_keeps_the_recorded_figures_and_reruns_what_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--changed-since reads back what --write recorded (figures, survivors, explained ones) unchanged, and
    reruns a group when one of its modules or tests changed or its figures were never recorded."""
    kept = mutation.ModuleResult("workload/model/metrics.py", Counter(killed=40, timeout=2, survived=3, skipped=1))
    kept.survivors = [mutation.Survivor("workload.model.metrics.x_auprc__mutmut_7", kept.module, "a < b", "a <= b"),
                      mutation.Survivor("workload.model.metrics.x_roc__mutmut_2", kept.module, "x", "y", "same"),
                      mutation.Survivor("workload.model.metrics.x_roc__mutmut_3", kept.module, "u", "v", "same too")]
    other = mutation.ModuleResult("workload/data/features.py", Counter(killed=9, **{"no tests": 1}))
    stamp = f"Measured at commit {'ab12' * 3} by `make mutation`."
    lines = [stamp, *mutation.table([(kept, ""), (other, "")]), "Survivors (1):",
             *mutation.survivor_lines([s for s in kept.survivors if not s.why]), "", "Equivalent (2), left out"]
    monkeypatch.setattr(mutation, "DOCS", tmp_path / "benchmarks.md")
    monkeypatch.setattr(mutation, "EXPLAINED", tmp_path / "mutation_explained.md")
    mutation.write_docs(lines)  # what --write records: the open survivors in the docs, the explained beside
    mutation.write_explained(stamp, [s for s in kept.survivors if s.why])
    recorded = mutation.recorded_results()
    assert mutation.recorded_rev() == "ab12" * 3
    assert sorted(recorded) == [other.module, kept.module]
    for before in (kept, other):
        after = recorded[before.module]
        assert (after.statuses, after.score, after.equivalent) == (+before.statuses, before.score, before.equivalent)
        assert [(s.name, s.before, s.after, s.why) for s in after.survivors] == [
            (s.name, s.before, s.after, s.why) for s in before.survivors]
    metrics = next(g for g in mutation.GROUPS if g.name == "metrics")
    features = next(g for g in mutation.GROUPS if g.name == "features")
    assert not mutation.stale(metrics, {"workload/data/features.py", "README.md"}, recorded)
    assert mutation.stale(features, {"workload/data/features.py"}, recorded)
    assert mutation.stale(metrics, {metrics.tests[-1]}, recorded)
    assert mutation.stale(metrics, set(), {})  # never recorded


def test_write_keeps_the_score_in_the_docs_and_the_explained_survivors_beside_the_tool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/benchmarks.md is for figures: --write records the score, the tables and the open survivors there,
    and the explained ones (hundreds of lines) in bench/mutation_explained.md, which the docs link to; `make
    bench`, which rewrites the docs, carries the block over."""
    from collections import Counter

    from bench import run

    docs, explained = tmp_path / "docs" / "benchmarks.md", tmp_path / "bench" / "mutation_explained.md"
    docs.parent.mkdir()
    explained.parent.mkdir()
    docs.write_text("# Benchmarks\n\nfigures\n")
    for name, value in (("ROOT", tmp_path), ("DOCS", docs), ("EXPLAINED", explained), ("STAGE", tmp_path / "stage")):
        monkeypatch.setattr(mutation, name, value)
    module = "workload/model/metrics.py"
    result = mutation.ModuleResult(module, Counter(killed=8, survived=2))
    result.survivors = [  # what collect() reads from mutmut's verdicts and diffs
        mutation._survivor("metrics.x_f__mutmut_1", module, ['-    return float("nan")', '+    return float("NAN")']),
        mutation._survivor("metrics.x_f__mutmut_2", module, ["-    return 0.0", "+    return 1.0"])]
    assert result.survivors[0].why and not result.survivors[1].why
    monkeypatch.setattr(mutation, "collect", lambda where, group: [result])
    (tmp_path / "stage" / "metrics").mkdir(parents=True)  # what run_group leaves: the commit it staged
    (tmp_path / "stage" / "metrics" / mutation.MARK).write_text('{"commit": "0123abcd"}')

    assert mutation.main(["--only", "metrics", "--no-run", "--write"]) == 1  # one open survivor: falls short

    block = docs.read_text().partition(mutation.BEGIN)[2].partition(mutation.END)[0]
    assert docs.read_text().startswith("# Benchmarks\n\nfigures\n")
    assert "Mutation score 88.9 %" in block and f"| {module} | 10 | 8 | 0 | 2 | 0 | 1 | 88.9 % |" in block
    assert "Survivors (1)" in block and "`metrics.x_f__mutmut_2`: `return 0.0` -> `return 1.0`" in block
    assert "metrics.x_f__mutmut_1" not in block
    assert "Equivalent (1), left out of the score: listed with their reasons in " \
           "[bench/mutation_explained.md](../bench/mutation_explained.md)." in block
    listed = explained.read_text()
    assert f"`metrics.x_f__mutmut_1`: `return float(\"nan\")` -> `return float(\"NAN\")`: " \
           f"{result.survivors[0].why}" in listed
    assert "metrics.x_f__mutmut_2" not in listed
    assert run.mutation_block(docs).strip() == f"{mutation.BEGIN}{block}{mutation.END}"


def _record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/benchmarks.md and the explained survivors in tmp_path, and build/mutation/ below it."""
    for name, value in (("ROOT", tmp_path), ("DOCS", tmp_path / "benchmarks.md"),
                        ("EXPLAINED", tmp_path / "mutation_explained.md"), ("STAGE", tmp_path / "stage")):
        monkeypatch.setattr(mutation, name, value)


def _staged(tmp_path: Path, group: str, commit: str, wall: float = 60.0) -> None:
    (tmp_path / "stage" / group).mkdir(parents=True)
    (tmp_path / "stage" / group / mutation.MARK).write_text(
        f'{{"commit": "{commit}", "wall": {wall}, "cpu": 50.0, "jobs": 1}}')


def test_partial_runs_accumulate_each_group_with_the_commit_it_was_measured_at(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--only X --write records X's figures beside the recorded ones of every other group, each group's row naming
    the commit its figures were measured at; a group never measured is listed as such, and the verdict falls short
    until every group is measured."""
    _record(tmp_path, monkeypatch)
    metrics = mutation.ModuleResult("workload/model/metrics.py", Counter(killed=9, survived=1))
    metrics.survivors = [mutation._survivor("workload.model.metrics.x_f__mutmut_1", metrics.module,
                                            ["-    return 0.0", "+    return 1.0"])]
    features = mutation.ModuleResult("workload/data/features.py", Counter(killed=20))
    found = {"metrics": [metrics], "features": [features]}
    monkeypatch.setattr(mutation, "collect", lambda where, group: found[group.name])
    _staged(tmp_path, "metrics", "aaaa1111")
    assert mutation.main(["--only", "metrics", "--no-run", "--write"]) == 1
    _staged(tmp_path, "features", "bbbb2222", wall=120.0)
    assert mutation.main(["--only", "features", "--no-run", "--write"]) == 1  # most groups never measured

    block = mutation._recorded_block()
    assert "| metrics | aaaa1111 | 10 | 1 | 1.0 min | 0.8 min |" in block  # kept as it was recorded
    assert "| features | bbbb2222 | 20 | 1 | 2.0 min | 0.8 min |" in block
    assert "| workload/model/metrics.py | 10 | 9 | 0 | 1 | 0 | 0 | 90.0 % |" in block
    assert "| workload/data/features.py | 20 | 20 | 0 | 0 | 0 | 0 | 100.0 % |" in block
    assert "- `workload.model.metrics.x_f__mutmut_1`: `return 0.0` -> `return 1.0`" in block  # still open
    queue = next(g for g in mutation.GROUPS if g.name == "queue")
    assert f"| queue | not measured: {mutation.NEVER} | | | | |" in block
    assert f"| {queue.modules[0]} | not measured: {mutation.NEVER} | | | | | | |" in block
    summary = next(line for line in block if "Mutation score" in line)
    assert "Mutation score 96.7 % over 2 module(s)" in summary and "falls short" in summary
    assert f"{len(mutation.GROUPS) - 2} group(s) not measured" in summary

    recorded = mutation.recorded_results()
    assert {n: rev for n, (rev, _) in mutation.recorded_groups(recorded).items()} == {
        "metrics": "aaaa1111", "features": "bbbb2222"}


def test_changed_since_recorded_judges_each_group_against_its_own_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _record(tmp_path, monkeypatch)
    metrics, features = (next(g for g in mutation.GROUPS if g.name == n) for n in ("metrics", "features"))
    rows = [mutation.ModuleResult(m, Counter(killed=5)) for m in (*metrics.modules, *features.modules)]
    mutation.write_docs(["Written at commit cccc3333 by `make mutation`.", *mutation.GROUPS_HEAD,
                         mutation.group_row("metrics", "aaaa1111", 5, None),
                         mutation.group_row("features", "bbbb2222", 5, mutation.Run(60.0, 30.0, 1)),
                         "", *mutation.table([(r, "") for r in rows])])
    recorded = mutation.recorded_results()
    commits = {n: rev for n, (rev, _) in mutation.recorded_groups(recorded).items()}
    assert commits == {"metrics": "aaaa1111", "features": "bbbb2222"}
    # Since aaaa1111 a test of metrics changed and features' module; since bbbb2222 nothing of either.
    changed = {"aaaa1111": {metrics.tests[0], features.modules[0]}, "bbbb2222": set()}
    asked: list[str] = []

    def since(rev: str) -> set[str]:
        asked.append(rev)
        return changed[rev]

    queue = next(g for g in mutation.GROUPS if g.name == "queue")
    rerun = mutation.to_rerun([metrics, features, queue], recorded, commits, "recorded", since)
    assert [g.name for g in rerun] == ["metrics", "queue"]  # queue: never measured
    assert asked == ["aaaa1111", "bbbb2222"]  # each commit's changes read once, and no commit for queue
    # An explicit revision judges every group against it.
    assert [g.name for g in mutation.to_rerun([metrics, features], recorded, commits, "aaaa1111", since)] == [
        "metrics", "features"]


def test_a_record_older_than_the_measured_at_column_names_one_commit_for_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table the issue 13 run recorded: one commit in the text, groups without their own; a group whose
    modules the record lacks (moved or split since) counts as never measured."""
    _record(tmp_path, monkeypatch)
    metrics = next(g for g in mutation.GROUPS if g.name == "metrics")
    worker = next(g for g in mutation.GROUPS if g.name == "worker")
    rows = [mutation.ModuleResult(m, Counter(killed=5)) for m in (*metrics.modules, worker.modules[0])]
    mutation.write_docs(["The run: a fresh clone of main at 8ac34d1, `make mutation ARGS=--write`.",
                         "| group | mutants | at once | wall | CPU |", "|---|---|---|---|---|",
                         "| metrics | 5 | 1 | 1.3 min | 1.3 min |", "| worker | 5 | 2 | 31.9 min | 29.0 min |",
                         "| all | 10 | | 33.0 min | 30.3 min |", "", *mutation.table([(r, "") for r in rows])])
    assert mutation.recorded_groups(mutation.recorded_results()) == {
        "metrics": ("8ac34d1", "| metrics | 8ac34d1 | 5 | 1 | 1.3 min | 1.3 min |")}


def test_a_recorded_open_survivor_that_a_rule_now_explains_reads_back_as_explained(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An EQUIVALENT rule added after a group's run applies to its recorded survivors: a re-report needs no rerun."""
    _record(tmp_path, monkeypatch)
    module = "workload/model/metrics.py"
    mutation.write_docs([*mutation.table([(mutation.ModuleResult(module, Counter(killed=8, survived=2)), "")]),
                         "- `workload.model.metrics.x_f__mutmut_1`: `return float(\"nan\")` -> `return float(\"NAN\")`",
                         "- `workload.model.metrics.x_f__mutmut_2`: `return 0.0` -> `return 1.0`"])
    result = mutation.recorded_results()[module]
    assert [bool(s.why) for s in result.survivors] == [True, False]
    assert (result.equivalent, result.score) == (1, 8 / 9 * 100)


def test_the_floor_holds_for_each_module_not_only_for_the_total(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _record(tmp_path, monkeypatch)
    weak = mutation.ModuleResult("workload/model/metrics.py", Counter(killed=8, survived=2))
    weak.survivors = [mutation.Survivor(f"workload.model.metrics.x_f__mutmut_{i}", weak.module, "a", "b")
                      for i in (1, 2)]
    strong = mutation.ModuleResult("workload/data/features.py", Counter(killed=100))
    found = {"metrics": [weak], "features": [strong]}
    monkeypatch.setattr(mutation, "collect", lambda where, group: found[group.name])
    monkeypatch.setattr(mutation, "GROUPS", tuple(g for g in mutation.GROUPS if g.name in found))
    for name in found:
        _staged(tmp_path, name, "cccc3333")
    assert mutation.main(["--no-run", "--write"]) == 1
    block = mutation._recorded_block()
    summary = next(line for line in block if "Mutation score" in line)
    assert "Mutation score 98.2 % over 2 module(s)" in summary and "falls short" in summary
    assert "below the floor of 90 %: workload/model/metrics.py" in block


def _stage_of(group: mutation.Group, where: Path, commit: str, codes: dict[str, int], tests=None) -> Path:
    """A group's stage as a run leaves it: the commit it was copied at, its mutmut settings, mutmut's verdicts."""
    stage = where / group.name
    (stage / "mutants" / Path(group.modules[0]).parent).mkdir(parents=True)
    (stage / mutation.MARK).write_text(json.dumps({"commit": commit, "wall": 60.0, "cpu": 50.0, "jobs": 1}))
    narrowed = mutation.Group(group.name, group.modules, tuple(tests if tests is not None else group.tests))
    (stage / "pyproject.toml").write_text(mutation.group_pyproject((ROOT / "pyproject.toml").read_text(), narrowed))
    (stage / "mutants" / f"{group.modules[0]}.meta").write_text(json.dumps({"exit_code_by_key": codes}))
    return stage


def test_survivors_are_retested_only_where_the_run_still_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    """--survivors keeps a run's verdicts and moves its row to this commit only when the modules it mutated and
    its test files are unchanged; otherwise it says why and leaves the stage as it was."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    head, first = git("rev-parse", "--short=12", "HEAD"), git("rev-list", "--max-parents=0", "HEAD").split()[0]
    monkeypatch.setattr(mutation, "STAGE", tmp_path)
    group = next(g for g in mutation.GROUPS if g.name == "queue")
    killed = {f"workload.queue.workqueue.x_claim__mutmut_{i}": 1 for i in range(1, 4)}

    results, run, problem = mutation.recheck(group, 1)  # no run to re-test
    assert problem == f"no run in {tmp_path}/queue/ to re-test: run the group whole"
    assert run.jobs == 0 and all(not r.statuses for r in results)

    if first != head:  # a shallow clone has no older commit
        stage = _stage_of(group, tmp_path, first, killed)  # the module did not exist at the first commit
        _, _, problem = mutation.recheck(group, 1)
        assert problem == (f"cannot re-test its survivors: {group.modules[0]} changed since its run at {first}; run "
                           "the group whole")
        assert json.loads((stage / mutation.MARK).read_text())["commit"] == first
        shutil.rmtree(stage)

    stage = _stage_of(group, tmp_path, head, killed, tests=group.tests[:1])
    _, _, problem = mutation.recheck(group, 1)
    assert problem == (f"cannot re-test its survivors: its test files are not the ones its run at {head} had; run "
                       "the group whole")

    shutil.rmtree(stage)
    stage = _stage_of(group, tmp_path, head, killed)  # nothing open: no mutmut, the verdicts kept, the row moved
    results, run, problem = mutation.recheck(group, 1)
    assert problem == "" and (run.wall, run.cpu, run.jobs) == (60.0, 50.0, 1)
    assert [dict(r.statuses) for r in results] == [{"killed": 3}]
    mark = json.loads((stage / mutation.MARK).read_text())
    assert (mark["commit"], mark["run_at"], mark["survivors_retested"]) == (mutation._head(), head, 0)
    assert (stage / group.tests[0]).read_text() == (ROOT / group.tests[0]).read_text()  # the tests as they are now
    assert not (stage / "mutmut.log").exists()
