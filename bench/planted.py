"""`make planted`: the bugs issue 13 names, planted by hand one at a time; the suite must catch each.

mutmut (`make mutation`) plants small mechanical bugs; these are the realistic ones a review found the
suite letting through (a worker that exits 0 while a peer holds a lease, writes in place, a window one
second too wide ...). Each entry of ``BUGS`` is the exact source text before and after, and the tests
that must fail. For each, a fresh copy of the checkout (the files git sees, as bench/mutation.py stages
them) gets the edit, and the named tests run there with pytest: at least one must FAIL (a pytest error,
such as an edit that breaks an import, does not count). The unplanted copy must pass them all first.

An edit whose ``before`` text is not found exactly once is reported as no longer applying: the code
moved, and the entry must follow it (tests/test_planted_table.py checks this in `make test`, so the
table cannot go stale unnoticed).

    python -m bench.planted                 # every bug (what `make planted` runs); exit 1 if one is missed
    python -m bench.planted --only 1 3a     # some of them
    python -m bench.planted --list          # the table, no runs
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.mutation import ROOT, copy_checkout

STAGE = ROOT / "build" / "planted"


@dataclass(frozen=True)
class Edit:
    """Replace ``before`` (found exactly once in ``file``) by ``after``."""

    file: str
    before: str
    after: str


@dataclass(frozen=True)
class Bug:
    id: str
    description: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # pytest node ids (file::function); at least one must fail


class Stale(Exception):
    """An edit's ``before`` text is not in its file exactly once: the table no longer matches the code."""


JOB = "tests/workload/test_job_semantics.py"
ATOMIC = "tests/workload/test_atomic_writes.py"
LAYERS = "tests/workload/test_refusal_layers.py"
BLIND = "tests/workload/test_blind_spots.py"

BUGS: tuple[Bug, ...] = (
    Bug("1", "worker exits 0 when nothing is pending while a peer still holds a lease",
        (Edit("workload/runtime/worker.py", "            if counts.drained:\n",
              "            if counts.pending == 0:\n"),),
        (f"{JOB}::test_an_idle_worker_waits_for_a_leased_item_whose_holder_then_dies",)),
    Bug("2", "promotion trusts the heartbeat thread's flag, no synchronous lease check",
        (Edit("workload/runtime/steps.py", "may_promote=a.beat.confirm,",
              "may_promote=lambda: not a.beat.lost.is_set(),"),
         Edit("workload/runtime/steps.py", "may_promote=self.beat.confirm,",
              "may_promote=lambda: not self.beat.lost.is_set(),")),
        (f"{JOB}::test_a_worker_whose_heartbeat_has_not_noticed_the_takeover_does_not_promote",)),
    Bug("3a", "atomic write rewrites the target in place instead of temp file + rename",
        (Edit("workload/share/fsutil.py",
              'fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")',
              "fd, tmp = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666), str(path)"),),
        (f"{ATOMIC}::test_a_writer_killed_mid_write_leaves_the_old_file_whole",
         f"{ATOMIC}::test_the_new_file_replaces_the_old_one_instead_of_rewriting_it",
         f"{ATOMIC}::test_the_crash_window_holds_half_the_data_in_the_temp_file_and_the_old_target",
         f"{ATOMIC}::test_text_writes_take_the_same_path")),
    Bug("3b-data", "atomic write drops the fsync of the data before the rename",
        (Edit("workload/share/fsutil.py", "                os.fsync(f.fileno())\n", "                pass\n"),),
        (f"{ATOMIC}::test_data_is_fsynced_before_the_rename_and_the_folder_after",
         f"{ATOMIC}::test_a_failed_write_leaves_the_old_file_and_no_temp_file")),
    Bug("3b-folder", "atomic write drops the fsync of the folder after the rename",
        (Edit("workload/share/fsutil.py", "        raise\n    if durable:\n        fsync_dir(path.parent)\n",
              "        raise\n"),),
        (f"{ATOMIC}::test_data_is_fsynced_before_the_rename_and_the_folder_after",)),
    Bug("4", "the worker's dataset name check reduced to almost nothing (non-empty)",
        (Edit("workload/runtime/worker.py",
              "            try:\n"
              '                check_name(name, "dataset")\n'
              "            except ValueError as exc:\n"
              "                raise DatasetError(str(exc)) from None\n"
              "            root = (self.datasets_dir / name).resolve()\n"
              "            if not root.is_relative_to(self.datasets_dir.resolve()):\n"
              '                raise DatasetError(f"dataset name {name!r} is not a folder name under '
              '{self.datasets_dir}")\n',
              "            if not name:\n"
              '                raise DatasetError(f"dataset {name!r} is not allowed: use a folder name")\n'
              "            root = self.datasets_dir / name\n"),),
        (f"{JOB}::test_the_worker_refuses_a_bad_dataset_name_on_its_own",)),
    Bug("4-claim", "the claim-time dataset name check of a queue item removed (the worker's stays)",
        (Edit("workload/queue/workqueue.py", '            check_name(data["dataset"], "dataset")\n', ""),),
        (f"{LAYERS}::test_the_claim_dead_letters_a_bad_dataset_name_without_leasing_it",
         f"{JOB}::test_queue_items_with_bad_dataset_names_are_dead_lettered_at_claim")),
    Bug("5", "a customer window includes the row exactly w days earlier",
        (Edit("workload/data/features.py",
              "start = _search(keys, key[rows] - w * SECONDS_PER_DAY, by_key)",
              "start = _search(keys, key[rows] - w * SECONDS_PER_DAY - 1, by_key)"),),
        ("tests/model/test_feature_boundaries.py::test_a_row_exactly_w_days_earlier_is_outside_the_window",
         "tests/model/test_feature_boundaries.py::test_every_window_length_is_checked_on_its_boundary")),
    Bug("6", "recall at 1 % FPR with < instead of <=",
        (Edit("workload/model/metrics.py", "allowed = fps / n_neg <= max_fpr", "allowed = fps / n_neg < max_fpr"),),
        ("tests/model/test_metric_boundaries.py::test_two_false_positives_are_allowed_and_a_third_is_not",)),
    Bug("7", "the loader Job's preemption-ignore rule removed",
        (Edit("infra/jobs.py", '"podFailurePolicy": failure_policy(contract.LOADER),',
              '"podFailurePolicy": {"rules": failure_policy(contract.LOADER)["rules"][1:]},'),),
        ("tests/infra/test_infra_jobs.py::test_preemptions_never_fail_a_job",)),
    Bug("8", "Redis deployed with appendfsync everysec instead of always",
        (Edit("infra/redis.py", '"--appendfsync",\n            "always",',
              '"--appendfsync",\n            "everysec",'),),
        ("tests/infra/test_durability_pairs.py::test_the_stacks_redis_fsyncs_every_write_like_the_local_one",)),
    Bug("9", "the Redis NetworkPolicy rule ignores the app label of the pods it admits",
        (Edit("policy/rules.py", "    return name_ok and component_ok\n", "    return component_ok\n"),),
        ("tests/policy/test_redis_admission.py::test_pods_of_any_other_app_are_refused",)),
    Bug("10", "the trainer's RNG restore dropped",
        (Edit("workload/model/lineage.py", '        torch.set_rng_state(self.rng["torch"])\n', ""),),
        ("tests/workload/test_trainer_rng.py::test_restored_trainer_draws_what_the_uninterrupted_one_draws",)),
    Bug("11a-denylist", "check_suffix's pickle denylist removed (the allowlist stays)",
        (Edit("workload/data/dayfile.py",
              "    if suffix in _PICKLE_SUFFIXES:\n"
              "        raise DatasetError(\n"
              '            f"{where}: {suffix} files are never read (unpickling a file from a shared volume runs "\n'
              '            f"arbitrary code); convert it to Parquet or CSV")\n', ""),),
        (f"{LAYERS}::test_pickle_suffixes_are_refused_even_where_the_allowlist_would_admit_them",)),
    Bug("11a-read", "read_transactions opens a file without asking check_suffix",
        (Edit("workload/data/dayfile.py", "    check_suffix(path, where)\n    data = _read_bytes(path, where)\n",
              "    data = _read_bytes(path, where)\n"),),
        (f"{LAYERS}::test_read_transactions_never_opens_a_pickle",)),
    Bug("11a-resolve", "Dataset.resolve admits a listed pickle (no suffix check)",
        (Edit("workload/data/dataset.py", "        check_suffix(candidate)\n", ""),),
        (f"{LAYERS}::test_a_listed_pickle_inside_the_dataset_is_refused_by_resolve",)),
    Bug("11b-resolve", "Dataset.resolve admits a listed path outside the dataset",
        (Edit("workload/data/dataset.py",
              "        if Path(rel).is_absolute() or not candidate.is_relative_to(root):\n"
              '            raise DatasetError(f"item path {rel!r} is outside the datasets folder {root}; refused")\n',
              ""),),
        (f"{LAYERS}::test_a_listed_path_climbing_out_of_the_dataset_is_refused",
         f"{LAYERS}::test_a_listed_absolute_path_is_refused",
         f"{LAYERS}::test_a_listed_symlink_pointing_out_of_the_dataset_is_refused")),
    Bug("11b-claim", "a queue item's shard climbing out ('..', absolute) passes the claim-time check",
        (Edit("workload/queue/workqueue.py", """if shard.is_absolute() or ".." in shard.parts or not data["shard"]:""",
              """if not data["shard"]:"""),),
        (f"{LAYERS}::test_the_claim_dead_letters_a_shard_climbing_out_without_leasing_it",)),
    # Issue 34's blind spots: bugs no test failed on until tests/workload/test_blind_spots.py.
    Bug("34-lock", "a loader that finds the publish lock held carries on without it",
        (Edit("workload/data/publish.py", "            fcntl.lockf(fd, fcntl.LOCK_EX)\n", ""),),
        (f"{BLIND}::test_a_loader_that_finds_the_publish_lock_held_waits_its_turn",)),
    Bug("34-staging", "staging leftovers are cleared before the publish lock is taken (a live loader's staging)",
        (Edit("workload/data/publish.py", "    with _publishing(root):\n        _remove_staging(root)\n",
              "    _remove_staging(root)\n    with _publishing(root):\n"),),
        (f"{BLIND}::test_a_waiting_loader_leaves_the_lock_holders_staging_folder_alone",)),
    Bug("34-retention", "checkpoint retention deletes unnamed files of a higher lease token",
        (Edit("workload/share/checkpoint.py", "if parsed and path.name not in named and parsed[1] <= token:",
              "if parsed and path.name not in named:"),),
        (f"{BLIND}::test_retention_never_deletes_a_checkpoint_of_a_higher_lease_token",)),
    Bug("34-lookback", "a day's recorded feature inputs look back only the feature window, not the label delay too",
        (Edit("workload/data/dataset.py",
              '        first, last = pd.Timestamp(entry["first"]), pd.Timestamp(entry["last"])\n'
              "        start = first - pd.Timedelta(days=features.LOOKBACK_DAYS)\n",
              '        first, last = pd.Timestamp(entry["first"]), pd.Timestamp(entry["last"])\n'
              "        start = first - pd.Timedelta(days=max(features.WINDOWS_DAYS))\n"),),
        (f"{BLIND}::test_a_days_stored_features_depend_on_every_day_its_window_and_label_delay_reach",)),
    Bug("34-calibration", "the calibration refit leaves out the day just trained",
        (Edit("workload/model/calibration.py", "days = eligible_days(data, [*trainer.applied, shard])",
              "days = eligible_days(data, list(trainer.applied))"),),
        (f"{BLIND}::test_the_calibration_refit_includes_the_day_just_trained",)),
    # Issue 36's: the scheduled scoring Job named like the scheduled training Job; a second training Job.
    Bug("36-scheduled-name", "the scheduled scoring Job given the scheduled training Job's name",
        (Edit("infra/schedule.py", 'SCHEDULED_SCORING_JOB = f"{contract.APP}-{contract.SCORER}-scheduled"',
              "SCHEDULED_SCORING_JOB = SCHEDULED_JOB"),),
        ("tests/infra/test_infra_schedule.py::test_the_scheduled_jobs_have_names_of_their_own",)),
    Bug("36-one-training-job", "the launcher posts a training Job while the stack's own training Job runs",
        (Edit("workload/runtime/launch.py", "    if stack_job_running:\n", "    if False:\n"),),
        ("tests/workload/test_launch_inprocess.py::test_no_second_training_job_while_the_stacks_own_runs",)),
)


def plant(where: Path, bug: Bug) -> None:
    """Apply ``bug``'s edits to the copy at ``where``; Stale when a ``before`` text is not there exactly once."""
    for e in bug.edits:
        path = where / e.file
        text = path.read_text()
        found = text.count(e.before)
        if found != 1:
            raise Stale(f"{e.file}: the text to replace is found {found} times, not once: {e.before.strip()[:70]!r}")
        path.write_text(text.replace(e.before, e.after))


def stage(name: str) -> Path:
    """A fresh copy of the checkout's files (tracked and new, not ignored) under build/planted/."""
    return copy_checkout(STAGE / name)


@dataclass
class Outcome:
    returncode: int
    failed: list[str]
    seconds: float
    tail: str
    why: str = ""  # the first failure's first ``E`` line: what the test saw (behaviour, or only a message?)


def run_tests(where: Path, tests: tuple[str, ...], first_failure: bool) -> Outcome:
    """pytest on ``tests`` in the copy (its own modules: the copy is the working folder and nothing else
    is on PYTHONPATH); the failed node ids from pytest's ``-rf`` summary."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *(["-x"] if first_failure else []),
           *tests]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    out = proc.stdout + proc.stderr
    failed = [m.group(1) for m in re.finditer(r"^FAILED (\S+)", out, re.MULTILINE)]
    why = next((m.group(1).strip() for m in re.finditer(r"^E +(.+)$", out, re.MULTILINE)), "")
    return Outcome(proc.returncode, failed, seconds, "\n".join(out.strip().splitlines()[-15:]),
                   why if len(why) <= 110 else why[:107] + "...")


def check(bug: Bug, keep: bool) -> tuple[str, Outcome | None]:
    """The verdict on one planted bug: caught, MISSED, edit no longer applies, or a pytest error."""
    where = stage(bug.id)
    try:
        try:
            plant(where, bug)
        except Stale as exc:
            return f"edit no longer applies: {exc}", None
        out = run_tests(where, bug.tests, first_failure=True)
        if out.returncode == 1 and out.failed:
            return "caught", out
        if out.returncode == 0:
            return "MISSED", out
        return f"pytest error (exit {out.returncode}), not a failing test", out
    finally:
        if not keep:
            shutil.rmtree(where, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--only", nargs="+", choices=[b.id for b in BUGS], help="bugs to plant (default: all)")
    parser.add_argument("--list", action="store_true", help="print the table and exit")
    parser.add_argument("--keep", action="store_true", help="keep each planted copy under build/planted/")
    args = parser.parse_args(argv)
    bugs = [b for b in BUGS if not args.only or b.id in args.only]
    if args.list:
        for b in bugs:
            print(f"{b.id}: {b.description}")
            for e in b.edits:
                print(f"    {e.file}: {e.before.strip()[:80]!r} -> {e.after.strip()[:80]!r}")
            for t in b.tests:
                print(f"    must fail: {t}")
        return 0

    tests = tuple(dict.fromkeys(t for b in bugs for t in b.tests))
    print(f"unplanted copy: {len(tests)} test function(s) must pass ...", flush=True)
    clean = run_tests(stage("unplanted"), tests, first_failure=False)
    shutil.rmtree(STAGE / "unplanted", ignore_errors=True)
    if clean.returncode != 0:
        print(f"the unplanted checkout fails them (exit {clean.returncode}); a planted bug would prove nothing:\n"
              f"{clean.tail}")
        return 1
    print(f"unplanted copy passes them ({clean.seconds:.0f} s)", flush=True)

    rows = []
    for bug in bugs:
        verdict, out = check(bug, args.keep)
        failed = ", ".join(t.split("::", 1)[1] for t in out.failed) if out and out.failed else "-"
        seconds = f"{out.seconds:.0f}" if out else "-"
        why = out.why.replace("|", "\\|") if out else ""
        rows.append((bug, verdict, failed, why, seconds))
        detail = f": {why}" if verdict == "caught" else "\n" + (out.tail if out else "")
        print(f"{bug.id}: {verdict} ({seconds} s){detail}", flush=True)

    print()
    print("| bug | planted | tests that must fail | failed | first assertion | verdict | s |")
    print("|---|---|---|---|---|---|---|")
    for bug, verdict, failed, why, seconds in rows:
        names = "<br>".join(t.replace("tests/", "", 1) for t in bug.tests)
        print(f"| {bug.id} | {bug.description} | {names} | {failed} | `{why}` | {verdict} | {seconds} |")
    caught = sum(1 for row in rows if row[1] == "caught")
    print(f"\n{caught} of {len(rows)} planted bugs caught.")
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
