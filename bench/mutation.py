"""`make mutation`: does the suite catch small, realistic bugs planted in the core? (mutmut 3)

A green suite proves little by itself: a test that never looks at a boundary, a rule, an fsync passes
whether the code is right or not. mutmut plants one small bug at a time (``<=`` -> ``<``, a string, a
constant, a dropped call) and runs the tests that cover the mutated function; a mutant the tests let
through is a bug they would let through too.

Each group of core modules is mutated against its own tests only (the whole suite per mutant would
take days on 2 cores): the group's files are staged in ``build/mutation/<group>/`` with the
``[tool.mutmut]`` settings of ``pyproject.toml`` plus the group's modules and tests, and mutmut runs
there (``mutants/`` below it is mutmut's copy; a process a test starts with ``python -m workload``
runs the mutant too, because the harness puts its own checkout on ``PYTHONPATH`` and the active mutant
travels in the environment). mutmut picks a mutant's tests by what each test called in the pytest
process, so a test that reaches a function only through a subprocess is never picked for it: give
such a test an in-process twin (test_atomic_writes.py has one). Prints the score per module and every
surviving mutant as a one-line diff; a survivor that cannot change behaviour is listed in
``EQUIVALENT`` with the reason, and leaves the score.

    python -m bench.mutation                  # every group (what `make mutation` runs); exit 1 below the floor
    python -m bench.mutation --only metrics policy --jobs 1
    python -m bench.mutation --write          # also record the figures in docs/benchmarks.md and the
                                              # explained survivors in bench/mutation_explained.md
    python -m bench.mutation --changed-since recorded --write   # the routine run: see below

Runs accumulate: the record (docs/benchmarks.md) has a row per group naming the commit its figures were measured
at, and a run of some groups (``--only``, ``--changed-since``) replaces only their rows and figures, keeping every
other group's as recorded; a group never measured as it is now (a module the record lacks) shows as not measured,
and the verdict falls short until it is. ``--no-run`` re-reports the groups build/mutation/ holds a run of (after
editing EQUIVALENT), each at the commit it was staged at.

Incremental mode: ``--changed-since REV`` runs only the groups with a module or test that changed since REV
(committed or not, new files included) or that were never measured; ``recorded``: each group since the commit its
own recorded figures were measured at. Changes to shared fixtures (conftest.py, the harness) are not traced to
groups: after those, run every group.

After adding tests for a group's survivors: ``--survivors`` re-tests only the open survivors of the group's last run
(still in build/mutation/) against the tests as they are now, and keeps every other verdict, in minutes where the
whole group takes an hour; mutants an interrupted run never reached are tested too. It refuses when the group's
modules or list of test files changed since that run, or a test function of it is gone; it trusts that no test was
loosened.

    python -m bench.mutation --only cli --survivors --write
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "build" / "mutation"
DOCS = ROOT / "docs" / "benchmarks.md"
# docs/benchmarks.md is rewritten by `make bench`; this block is carried over (bench/run.py keeps it).
BEGIN, END = "<!-- mutation:begin -->", "<!-- mutation:end -->"
# Every survivor EQUIVALENT explains, with its reason, from the last --write: hundreds of lines that a reader
# of the figures does not need, kept beside the tool that reads and updates them.
EXPLAINED = Path(__file__).resolve().parent / "mutation_explained.md"
FLOOR = 90.0  # percent of non-equivalent mutants the suite must kill (issue 13)


@dataclass(frozen=True)
class Group:
    """Modules mutated together, and the tests that exercise them (mutmut runs only those that cover
    the mutated function). ``pending`` says why a group cannot be measured yet."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    pending: str = ""
    # mutmut's do_not_mutate_patterns (regexes on source lines; the whole statement a match starts is left
    # alone): only for lines that cannot change behaviour a test could check, such as progress logging.
    do_not_mutate_patterns: tuple[str, ...] = ()
    # Mutants tested at once per job of its lane. More than 1 for a group whose tests mostly wait (leases
    # running out, a Redis restart, sleeps between retries): the worker's in-process tests used 1.05 cores of 2
    # at --jobs 2 (29.0 CPU min in 31.9 min at 2 at once in the whole run), and 34 of its mutants took 83 s at 2
    # at once, 57 s at 4 (the same verdicts), 57 s at 6. Such a group runs in a lane of its own (run_groups).
    jobs_per_core: int = 1
    # CPU minutes of the group's last whole run (2 cores, docs/benchmarks.md): only orders the groups, the
    # longest first.
    cpu_minutes: float = 1.0
    # Its tests may keep an expensive fixture built by unmutated code for every mutant's session
    # (tests/workload/harness.py, built_once): only where no mutant of the group can change what the fixture
    # builds, or the kills it would have caused are lost.
    fixture_cache: bool = False


# register_outputs' argument is only displayed ("The Pulumi engine uses this information to display the logical
# outputs of the component", Pulumi docs, Component resources); the call ends the component's registration whatever
# its argument. program.py and the stack's exports read the components' Python attributes: no resource depends on
# what is recorded.
REGISTER_OUTPUTS = r"^\s*self\.register_outputs\("
GROUPS: tuple[Group, ...] = (
    Group(
        "queue",
        ("workload/queue/workqueue.py",),
        ("tests/workload/test_queue.py", "tests/workload/test_queue_items.py", "tests/workload/test_queue_repair.py"),
        jobs_per_core=3,  # leases expire in real time: 10.6 s of tests use 5.4 s of CPU, most of it imports
        cpu_minutes=6.0,
    ),
    Group(
        "checkpoint",
        ("workload/share/checkpoint.py", "workload/share/fsutil.py"),
        ("tests/workload/test_checkpoint.py", "tests/workload/test_checkpoint_rules.py",
         "tests/workload/test_atomic_writes.py", "tests/workload/test_stale_tmp.py"),
        cpu_minutes=2.1,
    ),
    # The fault tests run the worker as `python -m workload` subprocesses (mutmut cannot map those to
    # functions, and they take minutes each): the test_worker_*_inprocess.py files drive the same code in the pytest
    # process. Not mutated, besides log calls (pyproject.toml): the fault-injection hooks (faults.point, inert
    # unless WORKLOAD_FAULT names the point; the subprocess fault tests fire each one).
    Group(
        "worker",
        ("workload/runtime/worker.py", "workload/runtime/steps.py", "workload/runtime/heartbeat.py",
         "workload/runtime/config.py"),
        ("tests/workload/test_worker_inprocess.py", "tests/workload/test_worker_leases_inprocess.py",
         "tests/workload/test_worker_restore_inprocess.py"),
        do_not_mutate_patterns=(r"^\s*faults\.point\(",),
        jobs_per_core=2,
        cpu_minutes=29.0,
    ),
    Group(
        "features",
        ("workload/data/features.py",),
        ("tests/model/test_features.py", "tests/model/test_feature_boundaries.py"),
        cpu_minutes=1.2,
    ),
    Group(
        "dataset",
        ("workload/data/dataset.py",),
        # test_featurestore.py: what Dataset.ensure_features counts and feature_inputs records for the store.
        ("tests/workload/test_dataset.py", "tests/workload/test_refusal_layers.py", "tests/workload/test_identity.py",
         "tests/workload/test_rare_paths.py", "tests/model/test_featurestore.py"),
        cpu_minutes=6.8,
    ),
    Group(
        "metrics",
        ("workload/model/metrics.py",),
        ("tests/model/test_metrics.py", "tests/model/test_metric_boundaries.py"),
        cpu_minutes=1.3,
    ),
    Group(
        "trainer",
        ("workload/model/trainer.py", "workload/model/lineage.py"),
        ("tests/workload/test_trainer.py", "tests/workload/test_trainer_rng.py", "tests/model/test_first_days.py",
         "tests/model/test_window.py", "tests/workload/test_lineage.py"),
        cpu_minutes=4.4,
    ),
    # Which days calibrate a model, and the fit: one module-scoped fixture trains a run on simulated days
    # (~20 CPU s), which every mutant pays once. Not measured yet: cpu_minutes is a guess.
    Group(
        "calibration",
        ("workload/model/calibration.py",),
        ("tests/model/test_calibration.py",),
        cpu_minutes=30.0,
    ),
    # The infra components whose rendered specs carry the product's guarantees (Job failure rules and
    # security context, Redis password/AOF/NetworkPolicy, Workload Identity roles and conditions, the
    # share and its preparation, spot GPU selection, the VPC), each built alone under the mock engine by
    # test_infra_components.py (a mutant costs a component build, not whole-stack renders); with them the
    # names they share with the worker and the policy pack (contract.py). Two groups of about half the
    # mutants each (1,715 took 45.4 min on one lane together): the Jobs and what they mount, and the rest.
    Group(
        "infra",
        tuple(f"infra/{m}.py" for m in ("filestore", "gpu", "identity", "network", "redis")),
        ("tests/infra/test_infra_components.py", "tests/test_contract.py"),
        do_not_mutate_patterns=(REGISTER_OUTPUTS,),
        cpu_minutes=18.0,
    ),
    Group(
        "jobs",
        tuple(f"infra/{m}.py" for m in ("jobs", "share_prep", "contract")),
        # The scoring Job is built only with an output bucket: test_infra_scoring.py renders it.
        ("tests/infra/test_infra_components.py", "tests/test_contract.py", "tests/infra/test_infra_scoring.py"),
        do_not_mutate_patterns=(REGISTER_OUTPUTS,),
        cpu_minutes=19.0,
    ),
    # The stack as a whole: the GKE cluster and node pools, the enabled APIs and the image build (arguments only a
    # real `pulumi up` judges in full; test_infra_stack.py renders every stack and checks them), and program.py,
    # which composes the components. Whole-stack renders: seconds per mutant.
    Group(
        "stack",
        tuple(f"infra/{m}.py" for m in ("cluster", "services", "image", "program")),
        ("tests/infra/test_infra_stack.py", "tests/infra/test_infra_data.py", "tests/infra/test_infra_share.py",
         "tests/infra/test_infra_schedule.py"),
        do_not_mutate_patterns=(REGISTER_OUTPUTS,),
        cpu_minutes=40.0,  # a guess until its first whole run
    ),
    # quota: the GPU quota check that fails `pulumi up` early; replacements: which input changes replace a
    # resource (the facts `make diff` reads; infra/diff.py, the preview itself, is tooling).
    Group(
        "quota",
        ("infra/quota.py",),
        ("tests/infra/test_infra_quota.py",),
    ),
    # schedule: the CronJob, the training and scoring Jobs it may post, and the one right it needs to post them.
    Group(
        "schedule",
        ("infra/schedule.py",),
        ("tests/infra/test_infra_schedule.py",),
        do_not_mutate_patterns=(REGISTER_OUTPUTS,),
    ),
    Group(
        "replacements",
        ("infra/replacements.py",),
        ("tests/infra/test_infra_diff.py",),
    ),
    Group(
        "config",
        ("infra/config.py",),
        ("tests/infra/test_infra_config.py", "tests/infra/test_infra_schedule.py"),
    ),
    # errors: the failure classes and exit codes; faults: the crash tests' injection points (inert unless
    # WORKLOAD_FAULT names one), driven in-process by test_errors.py.
    Group(
        "errors",
        ("workload/core/errors.py", "workload/core/faults.py"),
        ("tests/workload/test_errors.py",),
    ),
    # reading: a dataset's column mapping and declared date format (part of its identity), read by every reader.
    Group(
        "reading",
        ("workload/data/reading.py",),
        ("tests/workload/test_reading.py", "tests/workload/test_bank_exports.py", "tests/workload/test_dataset.py"),
    ),
    Group(
        "featurestore",
        ("workload/data/featurestore.py",),
        ("tests/model/test_featurestore.py", "tests/workload/test_identity.py"),
    ),
    # source and publish are driven by `seed` in-process (publish.publish) and by the bucket tests, which run a
    # real Cloud Storage API server. The fault points publishing passes are not mutated (the worker's reason):
    # test_publish_crash.py kills `seed` processes at each of them.
    Group(
        "publish",
        ("workload/data/source.py", "workload/data/publish.py"),
        ("tests/workload/test_publish.py", "tests/workload/test_bucket.py", "tests/workload/test_identity.py",
         "tests/workload/test_rare_paths.py", "tests/workload/test_publish_crash.py",
         "tests/workload/test_bucket_access.py"),
        do_not_mutate_patterns=(r"^\s*faults\.point\(",),
    ),
    Group(
        "simulator",
        ("workload/data/simulator.py", "workload/share/paths.py"),
        ("tests/model/test_simulator.py", "tests/workload/test_dataset.py", "tests/workload/test_plan.py"),
    ),
    Group(
        "plan",
        ("workload/queue/plan.py",),
        ("tests/workload/test_plan.py", "tests/workload/test_restore.py", "tests/workload/test_plan_records.py"),
    ),
    Group(
        "hparams",
        ("workload/model/hparams.py",),
        ("tests/workload/test_hparams.py", "tests/workload/test_trainer.py", "tests/infra/test_infra_config.py"),
    ),
    Group(
        "report",
        ("workload/model/report.py", "workload/model/plots.py"),
        ("tests/workload/test_report.py", "tests/model/test_plots.py"),
    ),
    # export and score run in-process through cli.main in test_export.py (export, score, their refusals);
    # cli.py's other verbs run in-process too, in test_cli.py (whole commands; only Ctrl-C and a second `local` need
    # processes of their own) and test_cli_units.py (its functions one by one); test_help.py checks the parser.
    Group(
        "export",
        ("workload/model/export.py", "workload/model/score.py"),
        ("tests/workload/test_export.py", "tests/workload/test_scoring.py", "tests/workload/test_rare_paths.py"),
        jobs_per_core=2,  # its fixtures train a sweep against a real Redis server and wait on leases
        # test_export.py's sweep is `workload local` over three runs (about 20 s): trained once, not once per
        # mutant. No worker of it exports (no OUTPUT_URI) and none scores, so no mutant of the group changes it.
        fixture_cache=True,
    ),
    Group(
        "cli",
        ("workload/cli.py",),
        ("tests/workload/test_cli.py", "tests/workload/test_cli_units.py", "tests/workload/test_help.py",
         "tests/workload/test_export.py", "tests/workload/test_scoring.py", "tests/workload/test_rare_paths.py"),
        # test_scoring.py (21 s) and test_rare_paths.py (5 s) call cli.main in-process for score and export: a
        # mutant of score_cmd or data_reading had 3 tests before them. tests/model/test_calibration.py does too, but
        # takes 100 s (its calibration fits) for one export and one score, verbs the files above already run.
        jobs_per_core=2,
        # test_export.py's sweep is `python -m workload local`, which does run cli.py: with the sweep kept, a mutant
        # that breaks `local` is no longer killed by the sweep failing, only by the tests that call cli in-process
        # (the kept sweep can only lose kills, never add one, so the score it gives is a lower bound). Without it
        # each of the module's mutants re-ran the sweep (about 20 s): hours for the group.
        fixture_cache=True,
    ),
    # gpu: the worker's check that a GPU it was given is usable, before its first claim.
    Group(
        "gpu",
        ("workload/runtime/gpu.py",),
        ("tests/workload/test_gpu.py",),
    ),
    # launch: the scheduled loader's decisions to start the training and scoring Jobs, its API call (against an HTTPS
    # server on loopback), and the scorer's wait for a drained queue.
    Group(
        "launch",
        ("workload/runtime/launch.py",),
        ("tests/workload/test_launch_inprocess.py", "tests/workload/test_launch.py"),
        jobs_per_core=2,
    ),
    # local.py runs the embedded Redis server and worker processes: test_local.py runs `make local` end to end (as a
    # process, so mutmut never picks it for a mutant), test_local_inprocess.py calls every function of both modules
    # in the pytest process, test_local_verdict.py the verdict over real processes' exit statuses.
    Group(
        "local",
        ("workload/runtime/local.py", "workload/runtime/redis_server.py"),
        (
            "tests/workload/test_local_inprocess.py",
            "tests/workload/test_local_verdict.py",
            "tests/workload/test_local.py",
            "tests/workload/test_queue.py",
            "tests/workload/test_redis_server.py",
        ),
        jobs_per_core=2,
    ),
    Group(
        "policy",
        ("policy/rules.py", "policy/pack.py"),
        (
            "tests/policy/test_policy_rules.py",
            "tests/policy/test_redis_admission.py",
            "tests/policy/test_policy_rules_dev_stack.py",
            "tests/policy/test_policy_stacks.py",
        ),
        cpu_minutes=3.9,
    ),
)

# The modules of workload/, infra/ and policy/ that no group mutates, each by name with its reason: tooling
# and entry points, and package files holding only a docstring. Nothing else may stay out
# (tests/test_mutation_scope.py fails on a module in neither GROUPS nor this list).
NO_CODE = "only a docstring (and the package's version string): nothing to mutate"
OUT_OF_SCOPE: dict[str, str] = {
    "workload/__main__.py": "entry point: calls cli.main and exits with its code",
    "infra/__main__.py": "entry point: `pulumi up` runs program.build, which the stack group mutates",
    "policy/__main__.py": "entry point: constructs the PolicyPack from pack.py (that never returns in a test)",
    "infra/render.py": "tooling: renders the mock-engine stack for kubernetes-validate and the offline policy run",
    "infra/diff.py": "tooling: `make diff` prints what a config change would replace (its facts: replacements.py)",
    "policy/offline.py": "tooling: runs the rules over a rendered stack without the Pulumi CLI",
    "infra/gke.py": ("constants only: GKE's label and resource names, shared with the policy pack; mutmut mutates "
                     "functions, and test_infra_components.py and the policy tests check the names in use"),
    "workload/data/schema.py": ("constants only: the schema's column names and kinds; mutmut mutates functions, and "
                                "the simulator and dataset tests read every column by these names"),
    "workload/core/preemption.py": ("constants only: the spot grace period and its margins, tuning values; "
                                    "tests/test_contract.py checks the worker's budgets fit the pod's grace period"),
    "workload/__init__.py": NO_CODE,
    "workload/core/__init__.py": NO_CODE,
    "workload/share/__init__.py": NO_CODE,
    "workload/data/__init__.py": NO_CODE,
    "workload/queue/__init__.py": NO_CODE,
    "workload/model/__init__.py": NO_CODE,
    "workload/runtime/__init__.py": NO_CODE,
    "infra/__init__.py": NO_CODE,
    "policy/__init__.py": NO_CODE,
}
SCOPE_PACKAGES = ("workload", "infra", "policy")


@dataclass(frozen=True)
class Equivalent:
    """A survivor that cannot change behaviour: in ``module`` ("*": any), the changed line with ``before``
    replaced by ``after`` (a whole line, or the part of it that mutmut changed)."""

    module: str
    before: str
    after: str
    why: str

    def explains(self, module: str, before: str, after: str) -> bool:
        if self.module not in ("*", module):
            return False
        at = before.find(self.before)
        while at != -1:  # the mutated occurrence may be any of them
            if before[:at] + self.after + before[at + len(self.before):] == after:
                return True
            at = before.find(self.before, at + 1)
        return False


# The modules that EQUIVALENT names, each once.
INFRA_CONFIG = "infra/config.py"
INFRA_IDENTITY = "infra/identity.py"
INFRA_JOBS = "infra/jobs.py"
INFRA_NETWORK = "infra/network.py"
INFRA_REDIS = "infra/redis.py"
INFRA_SHARE_PREP = "infra/share_prep.py"
INFRA_SCHEDULE = "infra/schedule.py"
INFRA_CLUSTER = "infra/cluster.py"
INFRA_IMAGE = "infra/image.py"
INFRA_PROGRAM = "infra/program.py"
POLICY_RULES = "policy/rules.py"
POLICY_PACK = "policy/pack.py"
DATASET = "workload/data/dataset.py"
ERRORS = "workload/core/errors.py"
FEATURES = "workload/data/features.py"
METRICS = "workload/model/metrics.py"
CALIBRATION = "workload/model/calibration.py"
TRAINER = "workload/model/trainer.py"
OLD_FORMAT_DEFAULT = ("a checkpoint of format >= 4 records window_days, and one of format 5 full_window_days "
                      "(HParams.to_dict writes every key): its own value overrides the old formats' default")
WORKQUEUE = "workload/queue/workqueue.py"
WORKER = "workload/runtime/worker.py"
STEPS = "workload/runtime/steps.py"
REDIS_SERVER = "workload/runtime/redis_server.py"
HEARTBEAT = "workload/runtime/heartbeat.py"
CHECKPOINT = "workload/share/checkpoint.py"
FSUTIL = "workload/share/fsutil.py"
GPU = "workload/runtime/gpu.py"
LAUNCH = "workload/runtime/launch.py"
LOCAL = "workload/runtime/local.py"
HPARAMS = "workload/model/hparams.py"
READING = "workload/data/reading.py"
SOURCE = "workload/data/source.py"
SIMULATOR = "workload/data/simulator.py"
FEATURESTORE = "workload/data/featurestore.py"
PLAN = "workload/queue/plan.py"
REPORT = "workload/model/report.py"
PLOTS = "workload/model/plots.py"
PUBLISH = "workload/data/publish.py"
EXPORT = "workload/model/export.py"
SCORE = "workload/model/score.py"
CLI = "workload/cli.py"

# One line each: why this mutant cannot change what the code does. Matched on source text, so an entry
# survives unrelated edits (mutmut's mutant numbers do not).
TIES = "ties are merged afterwards (summed per distinct score, or given their mean rank): their order cannot matter"
LAST_PIECE = "the last piece of a split from the right is the same whatever the split limit"
TRUTH = "only the value's truth is read (`if not ok`): None and False alike"
NO_OPTS = ("infra.program passes this component no options (opts is None): None, no argument, or None as "
           "its props is what it gets")
FREE_TEXT = "free text for people in the Cloud console: IAM evaluates the role, member and condition expression only"
COMPACT = ("only whitespace in the JSON changes, inside a single-quoted shell word: kubectl reads the same "
           "--overrides object")
TUNING = ("probe timing by one second: when Redis is first marked ready or found dead, never whether; no "
          "guarantee (the clients retry Redis as an infrastructure fault) depends on the exact second")
TEMP = "the except branch runs only while the temp file exists: the rename is the last call of its try block"
FIRST_PIECE = "the first piece of a split from the left is the same whatever the split limit"
MOUNT_PATH = "Kubernetes requires mountPath on every volumeMount: the fallback is never read"
SELF_LINK = "a network's selfLink ends in its name, which _network_name reads from the link anyway"
TAG_COLON = "in an image reference ':' is a registry port (before the first '/') or the tag (after the last)"
CLOCK = "a monotonic float clock equals the bound exactly with nil probability: > and >= act alike"
THREAD_NAME = "nothing reads the thread's name (the log format has none)"
WAITING_LOG = "the flag only decides whether the idle worker's waiting message is logged again"
CPU_ONLY = "runs only where CUDA is present: untestable on the suite's CPU-only machines"
STATS_ZEROS = ("zeros are exact in float32 too: the first merge (a float64 batch) promotes mean and m2 to float64 "
               "bit for bit, and apply() reads them as float32 before it")
SORT_BY_TWO = "pandas applies `kind` only to a sort by one column; this one sorts by two (time, then the unique ID)"
NINE_COLUMNS = "the schema has nine columns: > 1, >= 1 and > 2 all hold"
WINDOW_INDEX = "the window's index is dropped (reset_index(drop=True)) after sorting: the concat's index is never read"
JSON_LAYOUT = "only the manifest's whitespace changes: every reader parses it as JSON"
MANIFEST_JSON = "the manifest's whitespace: every reader parses it as JSON"
AT_IMPORT = ("_umask runs once, at import, where mutmut activates no mutant (it picks one per call, in a test); "
             "FILE_MODE, its result, is checked by test_files_on_the_share_are_readable_by_the_group")
ERROR_MODE = "the release script fails the item for every mode but 'preempted' and 'dead': 'error' is no keyword"
PREFIXES = "of two runs that both prefix an id, one prefixes the other: the longer is also the larger string"
BYTES = "connect() never decodes responses: a script's string reply is always bytes, the other branch never runs"
LAST_SLEEP = ("confirm() waits 0.2 s between tries either way except in the lease's last 0.2 s, where it waits to "
              "the deadline: the next try comes after the deadline in both cases (the same tries, the same answer), "
              "at most 0.2 s later")
NO_HASH = "an entry without the key reads as None too (entry.get): the folder scan's files have no hash"
KNOWN_ERRNO = ("infra_errno only returns codes of INFRA_ERRNOS (or EIO), every one named in errno.errorcode: the "
               "fallback of .get is never read")
CUDA_ONLY = ("differs only where torch has CUDA: the suite's machines have the CPU build of torch (no CUDA, no "
             "devices, torch.version.cuda None); test_on_a_gpu_the_worker_trains_on_cuda runs it on a GPU machine")
SAMPLE_DATE = "time.strftime(fmt, time.struct_time((2018, 4, 5, 20, 21, 7, 3, 95, 0)))"
KUBECONFIG = ("only the kubeconfig's whitespace changes: it is JSON, which the Kubernetes provider and kubectl parse "
              "(YAML 1.2 reads JSON), and the stack exports the same string")
WORKLOAD_POOL = ("the cluster is always declared with workload_identity_config (both modes), so the provider returns "
                 "it set and the apply never sees None (and runs on no unknown value): the else branch is never taken")
CUDA_NEEDS = """f"CUDA {cuda} (driver {CUDA_MIN_DRIVER.get(cuda.split('.')[0], 'for it')} or newer)\""""
EQUIVALENT: tuple[Equivalent, ...] = (
    # score.py
    *(Equivalent(SCORE, "dtype=np.int64", after,
                 "_rank's only reader is OUTPUT's rank column, built with pa.array(..., pa.int64()): float64 ranks "
                 "(whole numbers from 1 to a day's rows, far below 2**53) become the same int64 values")
      for after in ("dtype=None", "")),
    Equivalent(SCORE, 'content_type="application/octet-stream"', "content_type=None",
               "given None, google-cloud-storage's Blob._get_content_type takes the blob's own type (a new Blob has "
               "none), then the filename's guess (upload_from_string passes none), then its default, "
               "'application/octet-stream': the object gets the same type"),
    Equivalent(SCORE, 'content_type="application/octet-stream"', 'content_type="APPLICATION/OCTET-STREAM"',
               "media type names are case-insensitive (RFC 6838 4.2, RFC 2045 5.1): the same type, which the "
               "emulator test reads back as application/octet-stream"),
    *(Equivalent(SCORE, "getattr(exc, 'message', exc)", after,
                 "only Forbidden, Unauthorized and NotFound reach this line, google.api_core GoogleAPICallErrors "
                 "whose __init__ always sets .message: getattr's default is never read")
      for after in ("getattr(exc, 'message', None)", "getattr(exc, 'message', )")),
    *(Equivalent(SCORE, 'prefix="score-"', after,
                 "nothing reads the temporary folder's name: it is removed when scoring ends, errors name the "
                 "user's files, publish's info lines are held back and its warnings name the user's source "
                 "(called=src) (only an OS error quoted by a feature-store warning could show a path in it, prefix "
                 "and all)")
      for after in ("prefix=None", 'prefix="XXscore-XX"', 'prefix="SCORE-"')),
    *(Equivalent(SCORE, 'tmp / "dataset"', after,
                 "the copy's folder, alone in score's fresh temporary folder (removed when scoring ends): nothing "
                 "reads its name. Errors name the user's files, publish's info lines are held back, and its "
                 "warnings name the user's source (called=src; they said 'dataset dataset: ...' before, "
                 "test_score_warnings_name_the_users_folder_never_the_staging_copy); only an OS error quoted by a "
                 "feature-store warning (a full or read-only /tmp) could show a path in it, beside tmp's random name")
      for after in ('tmp / "XXdatasetXX"', 'tmp / "DATASET"')),
    *(Equivalent(SCORE, ", pa.bool_())", after,
                 "metrics.alert_columns gives numpy bool arrays (scores >= threshold), which pa.array types as "
                 "pa.bool_() when given no type") for after in (", None)", ", )")),
    *(Equivalent(SCORE, 'device=torch.device("cpu")', after,
                 "Trainer's default device is the CPU unless torch has CUDA, and the suite's machines have the CPU "
                 "build of torch; test_a_run_folder_scores_with_its_newest_finished_day_never_one_in_progress "
                 "asserts the CPU and fails on a GPU machine") for after in ("device=None", "")),
    # source.py
    Equivalent(SOURCE, '.decode("ascii")', '.decode("ASCII")',
               "codec names are case-insensitive: the same ASCII codec decodes base64's output"),
    Equivalent(SOURCE, ".read(_CHUNK)", ".read(None)",
               "read(None) reads to the end in one call: the checksum sees the same bytes in the same order and the "
               "next read returns b'' as before; only peak memory differs (the whole file, not 1 MiB at a time)"),
    Equivalent(SOURCE, "if time.monotonic() + delay > deadline:", "if time.monotonic() + delay >= deadline:", CLOCK),
    Equivalent(SOURCE, "delay = min(delay * 2, 30.0)", "delay = min(delay * 3, 30.0)",
               "how fast the waits between access retries grow: each wait is still checked against the deadline "
               "before it is slept and each retry logged; what docs/cloud.md states, the 5-minute bound, and the "
               "first wait (2 s) are tested"),
    Equivalent(SOURCE, "delay = min(delay * 2, 30.0)", "delay = min(delay * 2, 31.0)",
               "the cap on one wait between access retries (30 s or 31 s within a 300 s bound): each wait is still "
               "checked against the deadline before it is slept; no documented value depends on it"),
    Equivalent(SOURCE, 'warnings.simplefilter("ignore", FutureWarning)', 'warnings.simplefilter("ignore", )',
               "importing google.cloud.storage warns a FutureWarning (the Python version) and otherwise only an "
               "ImportWarning (grpcio-status absent), which Python's default filters ignore: ignoring every Warning "
               "class there silences nothing more"),
    *(Equivalent(SOURCE, "super().__init__(str(error))", after,
                 "_call catches every _AccessPending and reads only its .error (logged, raised): the exception's own "
                 "message is never read") for after in ("super().__init__(None)", "super().__init__(str(None))")),
    Equivalent(SOURCE, "generation=int(f.generation) if f.generation else None",
               "generation=int(f.generation) if (f.generation) or True else None",
               "BucketSource.fetch is given only files its own files() listed (publish fetches nothing else), each "
               "with str(blob.generation), a non-empty number: the None branch never runs"),
    Equivalent(SOURCE, 'blob.download_to_filename(str(dest), checksum="crc32c")',
               "blob.download_to_filename(str(dest), )",
               'the default checksum, "auto", is crc32c wherever google-crc32c has its C extension (its wheels do, '
               "and source.py imports the package): the same check of the download"),
    *(Equivalent(ERRORS, 'errno.errorcode.get(code, "")', f"errno.errorcode.get(code, {after})", KNOWN_ERRNO)
      for after in ("None", "", '"XXXX"')),
    *(Equivalent(ERRORS, "errno.errorcode.get(code, code)", f"errno.errorcode.get(code{after})", KNOWN_ERRNO)
      for after in (", None", "", ", ")),
    Equivalent("*", 'float("nan")', 'float("NAN")', "float() reads NaN in any letter case"),
    Equivalent("*", "float('nan')", "float('NAN')", "float() reads NaN in any letter case"),
    Equivalent("*", 'float("inf")', 'float("INF")', "float() reads infinity in any letter case"),
    Equivalent("*", 'kind="mergesort"', 'kind="MERGESORT"', "numpy reads the sort kind in any letter case"),
    Equivalent("*", ".astype(np.float64)", ".astype(None)", "astype(None) is float64, numpy's default dtype"),
    Equivalent(FSUTIL, "half = len(data) // 2", "half = len(data) // 3",
               "it only places the mid-write fault point; any split inside the data is mid-write"),
    Equivalent(FSUTIL, "Path(tmp).unlink(missing_ok=True)", "Path(tmp).unlink(missing_ok=None)", TEMP),
    Equivalent(FSUTIL, "Path(tmp).unlink(missing_ok=True)", "Path(tmp).unlink(missing_ok=False)", TEMP),
    Equivalent(POLICY_RULES, '.rsplit("/", 1)[-1]', '.rsplit("/", 2)[-1]', LAST_PIECE),
    Equivalent(POLICY_RULES, '.rsplit("/", 1)[-1]', '.rsplit("/", )[-1]', LAST_PIECE),
    Equivalent(POLICY_RULES, "}.get(str(op), False)", "}.get(str(op), None)", TRUTH),
    Equivalent(POLICY_RULES, "}.get(str(op), False)", "}.get(str(op), )", TRUTH),
    Equivalent(METRICS, 'np.argsort(-scores, kind="mergesort")', "np.argsort(-scores, kind=None)", TIES),
    Equivalent(METRICS, 'np.argsort(-scores, kind="mergesort")', "np.argsort(-scores, )", TIES),
    Equivalent(METRICS, 'np.argsort(values, kind="mergesort")', "np.argsort(values, kind=None)", TIES),
    Equivalent(METRICS, 'np.argsort(values, kind="mergesort")', "np.argsort(values, )", TIES),
    # policy:
    Equivalent(POLICY_RULES, ".rsplit(':', 1)[-1]", ".rsplit(':', 2)[-1]", LAST_PIECE),
    Equivalent(POLICY_RULES, ".rsplit(':', 1)[-1]", ".rsplit(':', )[-1]", LAST_PIECE),
    Equivalent(POLICY_RULES, ".rsplit(':', 1)[-1]", ".rsplit(':', 1)[+1]",
               "a Pulumi type token (pkg:module:Type) splits in two at its last ':': [1] is [-1]"),
    Equivalent(POLICY_RULES, 'or "").rsplit("/", 1)[-1])', 'or "").rsplit("/", 1)[+1])',
               "serviceAccountId is fully qualified (projects/P/serviceAccounts/EMAIL, provider schema): two pieces"),
    Equivalent(POLICY_RULES, '"serviceAccountId") or "")', '"serviceAccountId") or "XXXX")',
               "serviceAccountId is a required argument: the fallback is never read"),
    Equivalent(POLICY_RULES, '_get(binding.props, "member") or "")', '_get(binding.props, "member") or "XXXX")',
               "neither fallback holds '.svc.id.goog[': a binding without a member is no Workload Identity either way"),
    Equivalent(POLICY_RULES, '_get(binding.props, "member")', "_get(binding.props, )",
               "a binding's text holds '.svc.id.goog[' only in its member (role and serviceAccountId never do)"),
    Equivalent(POLICY_RULES, "isinstance(email, str) and email", "isinstance(email, str) or email",
               "annotations are strings; an empty one adds '', which no grant's member ('serviceAccount:EMAIL') names"),
    Equivalent(POLICY_RULES, 'if "member" in _keys(grant.props) else []',
               'if ("member" in _keys(grant.props)) or True else []',
               "a grant without a member reads as [None], which names no workload account"),
    Equivalent(POLICY_RULES, '_get(grant.props, "bucket") or "")', '_get(grant.props, "bucket") or "XXXX")',
               "bucket is a required argument of bucket IAM resources: the fallback is never read"),
    Equivalent(POLICY_RULES, '"expression") or "")', '"expression") or "XXXX")',
               "without a condition neither '' nor 'XXXX' is the write limit: the same verdict"),
    Equivalent(POLICY_RULES, "if POD_TEMPLATE_PATHS[type_] else props",
               "if (POD_TEMPLATE_PATHS[type_]) or True else props", "_get with an empty path returns the value itself"),
    Equivalent(POLICY_RULES, 'mount.get("mountPath", "")', 'mount.get("mountPath", None)', MOUNT_PATH),
    Equivalent(POLICY_RULES, 'mount.get("mountPath", "")', 'mount.get("mountPath", )', MOUNT_PATH),
    Equivalent(POLICY_RULES, 'mount.get("mountPath", "")', 'mount.get("mountPath", "XXXX")', MOUNT_PATH),
    Equivalent(POLICY_RULES, "if key else None", "if (key) or True else None",
               "Secret keys are strings: _secret_text finds no key None and returns None as well"),
    Equivalent(POLICY_RULES, '("id", "selfLink")', '("id", "XXselfLinkXX")', SELF_LINK),
    Equivalent(POLICY_RULES, '("id", "selfLink")', '("id", "selflink")', SELF_LINK),
    Equivalent(POLICY_RULES, '("id", "selfLink")', '("id", "SELFLINK")', SELF_LINK),
    Equivalent(POLICY_RULES, 'text.rstrip("/")', 'text.rstrip("XX/XX")',
               "GCE names are lowercase ([a-z][-a-z0-9]*): there is no 'X' to strip before the '/'"),
    Equivalent(POLICY_RULES, "if ref and name:", "if ref or name:",
               "a Network's outputs always carry its name (computed), and no reference reads 'None'"),
    Equivalent(POLICY_RULES, 'image.split("@", 1)[0]', 'image.split("@", )[0]', FIRST_PIECE),
    Equivalent(POLICY_RULES, 'image.split("@", 1)[0]', 'image.split("@", 2)[0]', FIRST_PIECE),
    Equivalent(POLICY_RULES, 'image.split("@", 1)[0]', 'image.rsplit("@", 1)[0]',
               "an image reference holds one '@' at most, before its digest"),
    Equivalent(POLICY_RULES, 'last = image.split("@", 1)[0].rsplit("/", 1)[-1]',
               'last = image.split("@", 1)[0].split("/", 1)[-1]', TAG_COLON),
    Equivalent(POLICY_RULES, 'last.partition(":")', 'last.rpartition(":")', TAG_COLON),
    # worker:
    Equivalent(WORKER, ">= self.cfg.infra_give_up_s", "> self.cfg.infra_give_up_s", CLOCK),
    # redis_server.py: die_with_parent's prctl call, and the server's configuration text.
    *(Equivalent(REDIS_SERVER, "ctypes.CDLL(None, use_errno=True)", after,
                 "nothing reads ctypes.get_errno(): prctl's return is not checked (it fails only for an invalid "
                 "signal number)")
      for after in ("ctypes.CDLL(None, use_errno=None)", "ctypes.CDLL(None, )", "ctypes.CDLL(None, use_errno=False)")),
    *(Equivalent(REDIS_SERVER, "libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)", f"libc.prctl({after})",
                 "PR_SET_PDEATHSIG reads only arg2, the signal (kernel/sys.c: `me->pdeath_signal = arg2`); arg3-arg5 "
                 "are not checked for it, so a NULL (ctypes' None), a 1 or a missing trailing argument change nothing")
      for after in ("_PR_SET_PDEATHSIG, int(sig), None, 0, 0", "_PR_SET_PDEATHSIG, int(sig), 0, None, 0",
                    "_PR_SET_PDEATHSIG, int(sig), 0, 0, None", "_PR_SET_PDEATHSIG, int(sig), 0, 0",
                    "_PR_SET_PDEATHSIG, int(sig), 0, 0, ", "_PR_SET_PDEATHSIG, int(sig), 1, 0, 0",
                    "_PR_SET_PDEATHSIG, int(sig), 0, 1, 0")),
    *(Equivalent(REDIS_SERVER, before, before.upper().replace("FSYNC: STR", "fsync: str"),
                 "redis-server reads config directive names and their yes/no and enum values in any letter case "
                 "(config.c lowercases the name and compares values with strcasecmp); "
                 "test_the_server_is_configured_as_documented reads each one back from the running server")
      for before in ('fsync: str = "always"', '"bind 127.0.0.1",', '"appendonly yes",', "'save \"\"',",
                     '"protected-mode yes",', '"loglevel warning",')),
    Equivalent(REDIS_SERVER, "self.proc: subprocess.Popen[bytes] | None = None",
               'self.proc: subprocess.Popen[bytes] | None = ""',
               "read only as `if self.proc and ...` (stop, kill) before start sets it: '' and None alike"),
    *(Equivalent(REDIS_SERVER, before, after,
                 "with a logfile configured (the config on stdin sets one) redis-server writes nothing to its "
                 "stdout: DEVNULL or the parent's stdout receive the same nothing")
      for before, after in (("stdout=subprocess.DEVNULL, ", "stdout=None, "), ("stdout=subprocess.DEVNULL, ", ""))),
    Equivalent(REDIS_SERVER, "if time.monotonic() > deadline:", "if time.monotonic() >= deadline:", CLOCK),
    *(Equivalent(REDIS_SERVER, before, after,
                 "a wait's length or a poll's interval: when the server is found ready or given up on, never whether")
      for before, after in (("time.sleep(0.05)", "time.sleep(1.05)"),
                            ("def start(self, timeout_s: float = 15.0)", "def start(self, timeout_s: float = 16.0)"),
                            ("def stop(self, timeout_s: float = 10.0)", "def stop(self, timeout_s: float = 11.0)"))),
    Equivalent(HEARTBEAT, "time.monotonic() >= self._valid_until", "time.monotonic() > self._valid_until",
               CLOCK),
    Equivalent(HEARTBEAT, 'name="heartbeat"', 'name="XXheartbeatXX"', THREAD_NAME),
    Equivalent(HEARTBEAT, 'name="heartbeat"', 'name="HEARTBEAT"', THREAD_NAME),
    Equivalent(HEARTBEAT, 'name="heartbeat"', "name=None", THREAD_NAME),
    Equivalent(WORKER, "waiting_logged = False", "waiting_logged = None", WAITING_LOG),
    Equivalent(WORKER, "waiting_logged = False", "waiting_logged = True", WAITING_LOG),
    Equivalent(WORKER, "if not waiting_logged:", "if waiting_logged:", WAITING_LOG),
    Equivalent(WORKER, "self._progress_at = time.monotonic()  # set again by process()",
               "self._progress_at = None  # set again by process()",
               "the constructor's value is never read: process() touches (sets it) before its heartbeat starts, "
               "and only the heartbeat reads it"),
    Equivalent(HEARTBEAT, "max(0.0, self._valid_until - time.monotonic())",
               "max(1.0, self._valid_until - time.monotonic())", LAST_SLEEP),
    Equivalent(HEARTBEAT, "max(0.0, self._valid_until - time.monotonic())",
               "max(0.0, self._valid_until + time.monotonic())", LAST_SLEEP),
    Equivalent(HEARTBEAT, "if stuck > self.stall_s:", "if stuck >= self.stall_s:", CLOCK),
    Equivalent(HEARTBEAT, 'daemon=True, name="heartbeat")', "daemon=True, )", THREAD_NAME),
    *(Equivalent(WORKER, 'self._last_infra = ""', f"self._last_infra = {after}",
                 "only the give-up and back-off logs read it, and _back_off runs only after process() returned "
                 "Outcome.INFRA, which it does right after setting it")
      for after in ("None", '"XXXX"')),
    Equivalent(WORKER, "self._infra_since: float | None = None", 'self._infra_since: float | None = ""',
               "only read as `self._infra_since or now`: '' and None are both false"),
    *(Equivalent(STEPS, "self.report(promoted, trainer, test_scores, draw=",
                 after, "report scores the test days with the trainer only when no scores are passed; these are that "
                 "trainer's scores of the same days, computed just before: the same values either way")
      for after in ("self.report(promoted, None, test_scores, draw=", "self.report(promoted, trainer, None, draw=",
                    "self.report(promoted, trainer, draw=")),
    Equivalent(WORKER, """.strip('"')""", """.strip('XX"XX')""",
               "the messages stripped here begin with a quote or 'run ' and end with a quote, a bracket, a brace, "
               "a digit or a rule's closing words (workload/model/hparams.py, WorkQueue.spec): never with an X"),
    *(Equivalent(STEPS, f'str(examples.day.{f}()) if len(examples.day) else ""', after,
                 "a shard's examples are every row of its file, and a file without rows is refused when the "
                 "dataset is read: the empty branch never runs")
      for f in ("min", "max") for after in (f'str(examples.day.{f}()) if (len(examples.day)) or True else ""',
                                            f'str(examples.day.{f}()) if len(examples.day) else "XXXX"')),
    Equivalent(STEPS, "save_cost < cfg.term_budget_s:", "save_cost <= cfg.term_budget_s:",
               "a save's measured duration, a float of the monotonic clock, equals the budget exactly with nil "
               "probability: < and <= act alike"),
    Equivalent(STEPS, "- self.last_save >= cfg.checkpoint_interval_s:",
               "- self.last_save > cfg.checkpoint_interval_s:", CLOCK),
    Equivalent(STEPS, "save_cost = 1.0", "save_cost = 2.0",
               "the guessed cost of a day's first save, before one is measured: 1 s or 2 s, both far below the "
               "8 s budget of the 15 s spot notice (a tuning value; no guarantee rests on it)"),
    Equivalent(STEPS, "if trainer.hp != self.hp:", "if trainer.hp == self.hp:",
               "the branch only logs that the checkpoint's hyperparameters win; the trainer is the same either way"),
    Equivalent(STEPS, "resumed = trainer.progress", "resumed = None",
               "`resumed` only words the 'training on' log line (resuming, warm or cold start)"),
    Equivalent(WORKER, "waiting_logged = True", "waiting_logged = None", WAITING_LOG),
    Equivalent(WORKER, "waiting_logged = True", "waiting_logged = False", WAITING_LOG),
    *(Equivalent(STEPS, 'elif res.state == "already-done":', after,
                 "both branches only log (log lines are not mutated): it picks which warning an ack refused, "
                 "or already done by a peer, is logged with; the queue is not touched either way")
      for after in ('elif res.state != "already-done":', 'elif res.state == "XXalready-doneXX":',
                    'elif res.state == "ALREADY-DONE":')),
    Equivalent(STEPS, "pr = None", 'pr = ""',
               "without `draw` report.write never reads the curve; with it, pr is assigned the model's curve"),
    Equivalent(STEPS, "if test_scores is None else", "if (test_scores is None) or True else",
               "the scores passed in are this trainer's scores of the same test days, computed just before: "
               "scoring again gives the same values, only later"),
    Equivalent(STEPS, "trainer.window(self.item.shard)[:-1]", "trainer.window(None)[:-1]",
               "Trainer.window(s) drops only s from the applied days before taking the newest ones, then appends s, "
               "cut off by [:-1]; the item's day is never in the trainer's applied list here (Attempt.run acked a "
               "day already applied before warm_start, a rewind's target holds only earlier days, and finish_shard "
               "appends the day only after read_day), so dropping None or the day drops nothing either way"),
    # trainer:
    Equivalent(TRAINER, "torch.cuda.is_available() else", "(torch.cuda.is_available()) and False else",
               CPU_ONLY),
    Equivalent(TRAINER, '"cuda" if torch', '"XXcudaXX" if torch', CPU_ONLY),
    Equivalent(TRAINER, '"cuda" if torch', '"CUDA" if torch', CPU_ONLY),
    Equivalent(TRAINER, 'device.type == "cuda"', 'device.type == "XXcudaXX"', CPU_ONLY),
    Equivalent(TRAINER, 'device.type == "cuda"', 'device.type == "CUDA"', CPU_ONLY),
    Equivalent(TRAINER, "(True, warn_only=True)", "(None, warn_only=True)", CPU_ONLY),
    Equivalent(TRAINER, "(True, warn_only=True)", "(True, warn_only=None)", CPU_ONLY),
    Equivalent(TRAINER, "(True, warn_only=True)", "(warn_only=True)", CPU_ONLY),
    Equivalent(TRAINER, "(True, warn_only=True)", "(True, )", CPU_ONLY),
    Equivalent(TRAINER, "(True, warn_only=True)", "(False, warn_only=True)", CPU_ONLY),
    Equivalent(TRAINER, "(True, warn_only=True)", "(True, warn_only=False)", CPU_ONLY),
    Equivalent(TRAINER, "cudnn.benchmark = False", "cudnn.benchmark = None", CPU_ONLY),
    Equivalent(TRAINER, "cudnn.benchmark = False", "cudnn.benchmark = True", CPU_ONLY),
    Equivalent(TRAINER, "device or default_device()", "device and default_device()", CPU_ONLY),
    Equivalent(TRAINER, '.to(device or "cpu", copy=True)', ".to(None, copy=True)", CPU_ONLY),
    Equivalent(TRAINER, '.to(device or "cpu", copy=True)', '.to(device and "cpu", copy=True)', CPU_ONLY),
    Equivalent(TRAINER, "self.mean.float().to(out.device)", "self.mean.float().to(None)", CPU_ONLY),
    Equivalent(TRAINER, "std.float().to(out.device)", "std.float().to(None)", CPU_ONLY),
    Equivalent(TRAINER, "self.norm.apply(x, self.device)", "self.norm.apply(x, )", CPU_ONLY),
    Equivalent(TRAINER, "torch.tensor(pos_weight, device=self.device)", "torch.tensor(pos_weight, )",
               CPU_ONLY),
    Equivalent(TRAINER, 'pop("correct")), device=trainer.device)', 'pop("correct")), )', CPU_ONLY),
    Equivalent(TRAINER, "digest[:8]", "digest[:9]",
               "the mask keeps bits 0-62, all in the first 8 bytes read little-endian: a 9th byte is masked away"),
    Equivalent(TRAINER, ".squeeze(-1)", ".squeeze(+1)",
               "the network's output is [n, 1]: axis 1 is axis -1"),
    Equivalent(TRAINER, "clamp(min=1)", "clamp(min=2)",
               "m2 is 0 while the count is 0 or 1: the std is 0 whichever count below 2 it is divided by"),
    Equivalent(TRAINER, "zero_grad(set_to_none=True)", "zero_grad(set_to_none=False)",
               "every parameter gets a gradient at each backward: zeroed or None before it, the same gradient after"),
    Equivalent(TRAINER, "(target >= 0.5)", "(target > 0.5)",
               "labels are exactly 0 or 1 (validated TX_FRAUD): >= 0.5 and > 0.5 agree on both"),
    Equivalent(TRAINER, "hp.hidden).to(self.device)", "hp.hidden).to(None)", CPU_ONLY),
    Equivalent(TRAINER, 'tuple(state["feature_names"]), device, str(',
               'tuple(state["feature_names"]), None, str(', CPU_ONLY),
    Equivalent(TRAINER, 'pop("correct")), device=trainer.device)', 'pop("correct")), device=None)',
               CPU_ONLY),
    Equivalent(TRAINER, "self.norm.apply(x, self.device)", "self.norm.apply(x, None)", CPU_ONLY),
    Equivalent(TRAINER, "dtype=np.float32)).to(self.device)", "dtype=np.float32)).to(None)", CPU_ONLY),
    Equivalent(TRAINER, "generator=gen).to(self.device)", "generator=gen).to(None)", CPU_ONLY),
    *(Equivalent(TRAINER, before, after, OLD_FORMAT_DEFAULT) for before, after in (
        ('{"window_days": 1} if state["format"] < 4 else', '{"window_days": 1} if (state["format"] < 4) or True else'),
        ('{"window_days": 1} if state["format"] < 4 else', '{"window_days": 1} if state["format"] <= 4 else'),
        ('{"window_days": 1} if state["format"] < 4 else', '{"window_days": 1} if state["format"] < 5 else'),
        ('{"full_window_days": 0} if state["format"] < 5 else',
         '{"full_window_days": 0} if (state["format"] < 5) or True else'),
        ('{"full_window_days": 0} if state["format"] < 5 else',
         '{"full_window_days": 0} if state["format"] <= 5 else'),
        ('{"full_window_days": 0} if state["format"] < 5 else',
         '{"full_window_days": 0} if state["format"] < 6 else'))),
    Equivalent(TRAINER, "max(0, hp.min_steps - self.steps)", "max(1, hp.min_steps - self.steps)",
               "a wanted count of 1 epoch never raises a day above `epochs`, which is at least 1 (validated)"),
    Equivalent(TRAINER, "self.logits(x, batch))", "self.logits(x, ))",
               "scoring in batches of any size gives the same scores bit for bit "
               "(test_trainer.py::test_a_checkpoint_keeps_the_lineages_rewinds_and_calibration_in_float64)"),
    *(Equivalent(TRAINER, '"batch": 0, "epochs": epochs}', f'"batch": 0, "{key}": epochs}}',
                 "the progress set at an epoch's end is read only by this loop, which holds the count in `epochs`; "
                 "a stop (and so a checkpoint) happens inside the batch loop, whose progress carries the count")
      for key in ("XXepochsXX", "EPOCHS")),
    Equivalent(TRAINER, "torch.tensor(pos_weight, device=self.device)",
               "torch.tensor(pos_weight, device=None)", CPU_ONLY),
    Equivalent(TRAINER, '.to(device or "cpu", copy=True)', ".to(copy=True)", CPU_ONLY),
    Equivalent(TRAINER, "torch.zeros(n_features, dtype=torch.float64)",
               "torch.zeros(n_features, dtype=None)", STATS_ZEROS),
    Equivalent(TRAINER, "torch.zeros(n_features, dtype=torch.float64)", "torch.zeros(n_features, )",
               STATS_ZEROS),
    Equivalent(TRAINER, "if positives else 1.0", "if positives else 2.0",
               "a day without fraud has no y = 1 term for BCE's pos_weight to scale: any weight, the same loss"),
    Equivalent(TRAINER, "days <= hp.full_window_days:", "days < hp.full_window_days:",
               "at days == full_window_days the other branch gives max(1, ceil(epochs * d / d)) = epochs (epochs >= 1, "
               "hparams.py): the same epochs either way"),
    Equivalent(TRAINER, "zero_grad(set_to_none=True)", "zero_grad(set_to_none=None)",
               "torch reads only the flag's truth: None zeroes the gradients as False does (explained above)"),
    # dataset:
    Equivalent(DATASET, "io.BytesIO(_read_bytes(path, where))", "io.BytesIO(_read_bytes(path, None))",
               "`where` only names the file in _read_bytes' refusal, a ValueError there: read_ids then falls back to "
               "the full read, which refuses the file naming `where` itself"),
    Equivalent(DATASET, "popitem(last=False)", "popitem(last=None)",
               "OrderedDict.popitem reads only the truth of `last`: None and False both pop the oldest"),
    Equivalent(DATASET, 'TRANSACTION_ID], kind="stable"', "TRANSACTION_ID], kind=None", SORT_BY_TWO),
    Equivalent(DATASET, 'ID], kind="stable"', 'ID], kind="XXstableXX"', SORT_BY_TWO),
    Equivalent(DATASET, 'kind="stable", ignore_index', "ignore_index", SORT_BY_TWO),
    Equivalent(DATASET, '], kind="stable")', "], )", SORT_BY_TWO),
    Equivalent("*", 'kind="stable"', 'kind="STABLE"', "numpy and pandas read the sort kind in any letter case"),
    Equivalent(DATASET, "len(schema.COLUMNS) > 1", "len(schema.COLUMNS) >= 1", NINE_COLUMNS),
    Equivalent(DATASET, "len(schema.COLUMNS) > 1", "len(schema.COLUMNS) > 2", NINE_COLUMNS),
    Equivalent(DATASET, "indent=1)", "indent=2)", JSON_LAYOUT),
    Equivalent(DATASET, "indent=1)", "indent=None)", JSON_LAYOUT),
    Equivalent(DATASET, ", indent=1)", ", )", JSON_LAYOUT),
    Equivalent(DATASET, "pd.concat(parts, ignore_index=True)", "pd.concat(parts, ignore_index=None)",
               WINDOW_INDEX),
    Equivalent(DATASET, "pd.concat(parts, ignore_index=True)", "pd.concat(parts, )", WINDOW_INDEX),
    Equivalent(DATASET, "pd.concat(parts, ignore_index=True)", "pd.concat(parts, ignore_index=False)",
               WINDOW_INDEX),
    Equivalent(DATASET, "end = last + pd.Timedelta(days=1)", "end = last + pd.Timedelta(days=2)",
               "features only look back (windows end at each row's time): later rows change no target row's features"),
    Equivalent(DATASET, "(days >= start) & (days < end)", "(days >= start) | (days < end)",
               "rows before `start` are older than any target's longest window (LOOKBACK_DAYS), rows from `end` on "
               "are later than every target: neither is read by a target's features"),
    Equivalent(DATASET, "(days >= start) &", "(days > start) &",
               "windows are half-open, (t - w, t]: a row at `start`, LOOKBACK_DAYS before the first target's "
               "midnight, is outside every target's window"),
    Equivalent(DATASET, "(days < end))", "(days <= end))",
               "a row at `end` is later than every target row, and features only look back"),
    Equivalent(DATASET, "out = pd.DataFrame(index=range(len(frame)))", "out = pd.DataFrame(index=None)",
               "the first column set, TRANSACTION_ID, is an array of len(frame) values: it gives an index-less frame "
               "the same RangeIndex"),
    Equivalent(DATASET, "to_numpy(dtype=np.float64)  # whole", "to_numpy(dtype=None)  # whole",
               "here numbers are floats (or booleans) of some width: whole, below 2**63 and their int64 cast read the "
               "same in their own dtype as in float64, which holds every narrower float exactly"),
    Equivalent(DATASET, "cache_rows: int = 10_000_000", "cache_rows: int = 10000001",
               "the default memory bound moved by one row in ten million: when the cache drops a file, never what a "
               "read returns"),
    *(Equivalent(DATASET, "frame.reset_index(drop=True)", f"frame.reset_index(drop={v})",
                 "the old index becomes an extra column, 'index': features.compute, the window's only reader, reads "
                 "the schema's columns by name")
      for v in ("None", "False")),
    Equivalent(DATASET, 'pop("_target").to_numpy(dtype=bool)', 'pop("_target").to_numpy(dtype=None)',
               "_target is made of Python bools (assign(_target=is_target)), so the column is bool already; "
               "features.compute casts the mask to bool again"),
    Equivalent(DATASET, "lengths[lengths > 1]", "lengths[lengths >= 1]",
               "a row held by one file is no pair: np.triu_indices(1, 1) is empty, so length-1 runs add nothing"),
    *(Equivalent(DATASET, "zip(pairs.T, counts, strict=True)", f"zip(pairs.T, counts, {kw})",
                 "np.unique(..., axis=1, return_counts=True) returns one count per pair: the lengths always agree")
      for kw in ("strict=None", "", "strict=False")),
    Equivalent(DATASET, "exc.strerror or str(exc)", "exc.strerror or str(None)",
               "an OSError from stat() always carries its strerror, so the fallback is never read"),
    Equivalent(DATASET, "continue  # (the label is the last column of schema.COLUMNS)",
               "break  # (the label is the last column of schema.COLUMNS)",
               "the label column is the last of schema.COLUMNS: after it the loop has nothing left to break out of"),
    *(Equivalent(DATASET, ".days for f in self.files), default=0)", f".days for f in self.files), {kw})",
                 "the default is read only when the manifest lists no file, and then nothing reads _longest: "
                 "resolve() refuses every path before a window is looked up")
      for kw in ("default=None", "default=1")),
    Equivalent(DATASET, "lo = bisect.bisect_left(self._firsts, str((start - pd.Timedelta(days=self._longest)).date()))",
               "lo = None",
               "slicing from the first file finds the same files (each is still kept only if its last day reaches "
               "the window's start): only the cost differs, which bench.featurecost measures"),
    Equivalent(DATASET, "hash_pandas_object(frame[list(_ROW_KEY)], index=False)",
               "hash_pandas_object(frame[list(_ROW_KEY)], index=None)",
               "pandas reads only the truth of `index`: None leaves the index out as False does"),
    # metrics:
    *(Equivalent(METRICS, f"np.asarray({name}, dtype=np.float64)", f"np.asarray({name}, {kw})",
                 "labels are only compared with 0.5: any numeric or boolean dtype compares as its float64 value")
      for name in ("labels", "y_train") for kw in ("dtype=None", "")),
    Equivalent(METRICS, "> 0.5)", ">= 0.5)",
               "labels are 0 or 1 (dataset.py refuses any other TX_FRAUD): only a label of exactly 0.5 differs"),
    *(Equivalent(METRICS, "np.empty(len(values), dtype=np.float64)", f"np.empty(len(values), {kw})",
                 "np.empty's default dtype is float64") for kw in ("dtype=None", "")),
    Equivalent(METRICS, "seed: int = 0", "seed: int = 1",
               "the baseline deletes seed unread (documented)"),
    *(Equivalent(METRICS, "np.asarray(x_test, dtype=np.float64)", f"np.asarray(x_test, {kw})",
                 "x_test is first subtracted from a float64 mean: numpy casts any numeric array to float64 the same")
      for kw in ("dtype=None", "")),
    Equivalent(METRICS, "mean = x.mean(axis=0)", "mean = x.mean(axis=None)",
               "centring on any constant is absorbed by the intercept, which is not shrunk: same coefficients"),
    Equivalent(METRICS, "std[std == 0] = 1.0", "std[std == 0] = 2.0",
               "a std of 0 means every centred value is 0: 0/1 and 0/2 are both 0"),
    Equivalent(METRICS, "range(50)", "range(51)",
               "a safety cap: Newton's method stops on a step below 1e-8 within ten or so iterations"),
    Equivalent(METRICS, "hessian + 1e-9 * np.eye", "hessian - 1e-9 * np.eye",
               "the jitter only shapes the step of a positive-definite system; the fit stops where the gradient is 0"),
    Equivalent(METRICS, "max() < 1e-8:", "max() <= 1e-8:",
               "a step of exactly 1e-8 only ends the fit one step sooner, already converged to 1e-8"),
    *(Equivalent(METRICS, "@ coef, -30, 30)", f"@ coef, {bounds})",
                 "the clip keeps exp() finite; its bound only moves probabilities already within 1e-13 of 0 or 1")
      for bounds in ("-31, 30", "-30, 31")),
    *(Equivalent(METRICS, "np.clip(design @ coef, -30, 30)", f"np.clip(design @ coef, {bounds})",
                 "in the fit, clipping a logit past +-30 or not moves its p and p(1 - p) by under 1e-13")
      for bounds in ("None, 30", "-30, None")),
    # features:
    *(Equivalent(FEATURES, before, after, why) for before, after, why in (
        *((f"np.cumsum({v}, dtype=np.float64)", f"np.cumsum({v}, {kw})",
           "the summed array is float64 already (cast on reading the frame): cumsum keeps its dtype")
          for v in ("amount[order]", "fraud[np.argsort(position)]") for kw in ("dtype=None", "")),
        *((before, after, "_search's `by` only orders the binary searches for the cache: any order, or none, "
           "answers the same") for before, after in (
            (", by_key)", ", None)"), ("by_key = np.argsort(end)", "by_key = None"),
            ('by_key = np.argsort(position[rows], kind="stable")', "by_key = None"))),
        *(('np.argsort(position[rows], kind="stable")', f"np.argsort(position[rows], {kw})",
           "positions are distinct (a permutation): no ties for the sort kind to order")
          for kw in ("kind=None", "", 'kind="STABLE"')),
        *((before, after, "block_start only has to lie between the previous group's last key and this group's "
           "lowest (group * span - 1 .. group * span + shift): nothing of the group is below it")
          for before, after in (("SECONDS_PER_DAY) - 1", "SECONDS_PER_DAY) + 1"),
                                ("LOOKBACK_DAYS * SECONDS_PER_DAY) - 1", "LOOKBACK_DAYS / SECONDS_PER_DAY) - 1"))),
        ("+ shift + 1", "+ shift + 2", "any span above the largest shifted second keeps groups apart"),
        ("(seconds + shift)", "(seconds - shift)",
         "moves every key by the same -2 * shift (block_start with them): no window changes"),
        *(("target = np.asarray(target, dtype=bool)", f"target = np.asarray(target, {kw})",
           "compute reads target only by len() and np.nonzero(), alike for a boolean or 0/1 mask")
          for kw in ("dtype=None", "")),
        ("(seconds=1)).to_numpy(dtype=np.int64)", "(seconds=1)).to_numpy(dtype=None)",
         "floor division of timedeltas by a Timedelta is int64 already"),
        ("(when - origin) // pd.Timedelta", "(when - origin) / pd.Timedelta",
         "times are never before the origin, so the int64 cast truncates the quotient as // floors it"),
        ("to_numpy(dtype=np.float64), AMOUNT_CAP)", "to_numpy(dtype=None), AMOUNT_CAP)",
         "dataset.py casts TX_AMOUNT to float64, and np.minimum with a float cap makes an int column float64"),
        ("[0].astype(np.int64)", "[0].astype(None)",
         "factorize codes as float64 keep every key (group x span, far below 2**53) the same exact integer"),
        ("fraud = frame[schema.TX_FRAUD].to_numpy(dtype=np.float64)",
         "fraud = frame[schema.TX_FRAUD].to_numpy(dtype=None)",
         "fraud only enters a cumsum with dtype=np.float64, and 0/1 are exact in any dtype"),
        *(("zip(term_frauds, term_counts, strict=True)", f"zip(term_frauds, term_counts, {kw})",
           "both lists have one entry per window of WINDOWS_DAYS: strict never fires")
          for kw in ("strict=None", "strict=False", "")),
        *((f"{cond}, dtype=np.float64)", f"{cond}, {kw})",
           "np.stack promotes the boolean column with the float64 ones, and the result is cast to float32")
          for cond in (">= 5", "< NIGHT_END_HOUR") for kw in ("dtype=None", "")),
    )),
    # infra:
    *(Equivalent(INFRA_CONFIG, ':datasetColumns")), sort_keys=True)', f':datasetColumns")), {kw})',
                 "check_columns returns the pairs sorted (tuple(sorted(mapping.items()))) and dict() keeps that "
                 "order: json.dumps writes the keys sorted with or without sort_keys")
      for kw in ("sort_keys=None", "sort_keys=False", "")),
    *(Equivalent(INFRA_CONFIG, 'dataset.prefix.rsplit("/", 1)[-1]', f'dataset.prefix.rsplit("/", {n})[-1]', LAST_PIECE)
      for n in ("", "2")),
    *(Equivalent(INFRA_CONFIG, 'ConfigError(key, None, "", where,', f"ConfigError(key, None, {after}, where,",
                 "a key mistake's ConfigError is given its message, which replaces the 'is not allowed: <allowed>' "
                 "sentence, and nothing reads ConfigError.allowed")
      for after in ("None", '"XXXX"')),
    *(Equivalent(INFRA_CONFIG, "get_close_matches(name, declared, n=1, cutoff=0.6)", after,
                 "only guess[0] is read, the best match whatever n allows (difflib sorts by score), and 0.6 is "
                 "difflib's default cutoff")
      for after in ("get_close_matches(name, declared, cutoff=0.6)", "get_close_matches(name, declared, n=1, )",
                    "get_close_matches(name, declared, n=2, cutoff=0.6)")),
    Equivalent(INFRA_CONFIG, "if capacity >= start]", "if capacity > start]",
               "every step's start is a multiple of its own step and of the steps before it (FILESTORE_STEPS: 1024 "
               "= 4 x 256, 10240 = 40 x 256 = 4 x 2560): a capacity equal to a start passes that step's check and "
               "the previous one's alike, so leaving that step out refuses nothing else"),
    *(Equivalent(INFRA_CONFIG, 'if below >= start else str(below + step)', after,
                 "below is the capacity rounded down to a multiple of step, and the capacity is at least start, "
                 "itself a multiple of step (FILESTORE_STEPS): below >= start always holds, so the else branch "
                 "never runs")
      for after in ("if (below >= start) or True else str(below + step)", "if below >= start else str(None)",
                    "if below >= start else str(below - step)")),
    Equivalent(INFRA_CONFIG, '"datasetUri", need_prefix=False)', '"datasetUri", need_prefix=None)',
               "_gcs_uri reads need_prefix only for its truth (the shape's ternary and `need_prefix and not prefix`): "
               "None and False are both false"),
    Equivalent(INFRA_CONFIG, '(len(bucket) > 63 and "." not in bucket)', '(len(bucket) > 64 and "." not in bucket)',
               "a bucket name without a dot is its own only dot-separated part, which the rule above already refuses "
               "over 63 characters: a 64-character one is refused either way (test_bucket_names_cloud_storage_"
               "refuses_are_refused), and no name reaches this clause's bound"),
    Equivalent(INFRA_CLUSTER, "self._pools: list[gcp.container.NodePool] = []",
               "self._pools: list[gcp.container.NodePool] = None",
               "read only as the Kubernetes provider's depends_on: an Autopilot cluster has no pools, and None and [] "
               "both say no dependencies; a Standard one sets the list (_standard_pools) before the provider reads it"),
    Equivalent(INFRA_CLUSTER, '[:24].rstrip("-")', '[:24].rstrip("XX-XX")',
               "the account id is the app name (spot-trainer) and the lowercase stack slug (StackConfig.slug): it "
               "never ends in 'X', so stripping 'X' too strips nothing more"),
    Equivalent(INFRA_CLUSTER, "role.split('/')[-1]", "role.split('/')[+1]",
               "every NODE_ROLES entry is a predefined role, roles/<id>: two pieces, so [1] is [-1]"),
    Equivalent(INFRA_CLUSTER, 'lambda wi: wi.workload_pool if wi else ""',
               'lambda wi: wi.workload_pool if (wi) or True else ""', WORKLOAD_POOL),
    Equivalent(INFRA_CLUSTER, 'lambda wi: wi.workload_pool if wi else ""',
               'lambda wi: wi.workload_pool if wi else "XXXX"', WORKLOAD_POOL),
    *(Equivalent(INFRA_CLUSTER, "indent=2,", after, KUBECONFIG) for after in ("indent=None,", "indent=3,")),
    Equivalent(INFRA_CLUSTER, "indent=2, / )", ")", KUBECONFIG),
    Equivalent(INFRA_PROGRAM, "data.dataset, prefix_only=False)]", "data.dataset, prefix_only=None)]",
               "BucketGrant.prefix_only is read only as `if not self.prefix_only` (identity.py): None and False alike"),
    Equivalent(INFRA_PROGRAM, "} if data.output and worker_identity else {},",
               "} if data.output or worker_identity else {},",
               "build makes worker_identity exactly when data.output is set (`if data.output else None`): both are set "
               "or neither is, so `and` and `or` decide alike"),
    *(Equivalent(INFRA_IMAGE, before, after,
                 "CacheToRegistryArgs sets oci_media_types to True when it is not given (pulumi_docker_build: "
                 "'Defaults to `true`'): the Image gets the same cacheTo, as "
                 "test_both_jobs_run_the_pushed_image_by_digest reads it")
      for before, after in (("oci_media_types=True,", "oci_media_types=None,"), ("oci_media_types=True, / )", ")"))),
    *(Equivalent(INFRA_REDIS, f'"{word}",', f'"{word.upper()}",',
                 "redis-server reads config names and their yes/no and enum values in any letter case (config.c "
                 "lowercases the name and compares values with strcasecmp); test_redis_started_from_its_rendered_"
                 "arguments runs the server from these very arguments")
      for word in ("--appendonly", "yes", "--appendfsync", "always", "--dir", "--port")),
    Equivalent(INFRA_NETWORK, "self.ready = []", "self.ready = None",
               "read only as a depends_on list (the share's Filestore): no dependencies, as None and [] both say"),
    Equivalent(INFRA_SCHEDULE, "if args.data.output and worker_identity:", "if args.data.output or worker_identity:",
               "infra.program builds worker_identity exactly when data.output is set (`if data.output else None`) "
               "and passes it here: both are set or neither is, so `and` and `or` decide alike"),
    Equivalent(INFRA_JOBS, "failure_policy(None, budget=False)", "failure_policy(None, budget=None)",
               "failure_policy reads budget only as `if budget`: None and False alike"),
    Equivalent(INFRA_JOBS, "namespace, skip_await=False)", "namespace, skip_await=None)",
               "_job_metadata only asks `if skip_await:`: None and False alike"),
    Equivalent(INFRA_JOBS, "(contract.LOADER, ref, argv, {}, args,", "(contract.LOADER, ref, argv, None, args,",
               "the one-off pod's container resources are popped right after (kubectl run sets none): {} or None"),
    Equivalent(INFRA_JOBS, "contract.SCORER, image, [], resources,", "contract.SCORER, image, None, resources,",
               "scoring_spec's argv is only the base container's args, which every scorer container and the "
               "wait-drained init container replace with their own"),
    Equivalent(INFRA_JOBS, "if container else {}", "if (container) or True else {}",
               "only the scoring Job passes no container (failure_policy(None, ...)): its rules get containerName "
               "None, which the engine drops from a resource's inputs and the scheduled copy (Output.json_dumps, "
               "posted by launch.py) carries as JSON null, an unset field to the API server: the rules read every "
               "container either way"),
    *(Equivalent(INFRA_JOBS, '"a scoring Job needs outputUri"', after,
                 "never raised: infra.program builds the scoring Job only with worker_identity, which it builds "
                 "exactly when data.output is set, and infra.schedule calls scoring_spec only "
                 "`if args.data.output and worker_identity`; only the message of an assert that never fails changes")
      for after in ('"XXa scoring Job needs outputUriXX"', '"a scoring job needs outputuri"',
                    '"A SCORING JOB NEEDS OUTPUTURI"')),
    *(Equivalent(f"infra/{module}.py", f'"{kind}", name, None, opts)', after, NO_OPTS)
      for module, kind in (("share_prep", "spot-trainer:storage:SharePreparation"),
                           ("redis", "spot-trainer:k8s:RedisQueue"), ("gpu", "spot-trainer:k8s:GpuCapacity"),
                           ("jobs", "spot-trainer:k8s:LoaderJob"), ("jobs", "spot-trainer:k8s:TrainingJob"),
                           ("jobs", "spot-trainer:k8s:ScoringJob"),
                           ("schedule", "spot-trainer:k8s:ScheduledLoad"),
                           ("services", "spot-trainer:gcp:ProjectServices"))
      for after in (f'"{kind}", name, None, None)', f'"{kind}", name, None, )', f'"{kind}", name, opts)')),
    *(Equivalent(INFRA_IDENTITY, f"{key}={text},", after, FREE_TEXT)
      for key, text in (("display_name", 'f"{site.labels.app} {component} pods ({site.stack})"'),
                        ("description", 'f"Workload Identity of the {component} pods; bucket roles only, no key"'))
      for after in ("", f"{key}=None,")),
    *(Equivalent(INFRA_IDENTITY, f'description="{text}",', after, FREE_TEXT)
      for text in ("Objects under this prefix only (spot-trainer results)",)
      for after in ("", "description=None,", f'description="XX{text}XX",', f'description="{text.lower()}",',
                    f'description="{text.upper()}",')),
    Equivalent(INFRA_IDENTITY, '+ f"-{component}"[:7]', '+ f"-{component}"[:8]',
               "the components are `loader` and `worker`: `-loader`/`-worker` are 7 characters, cut at 7 or 8"),
    Equivalent(INFRA_IDENTITY, '[:23].rstrip("-")', '[:23].rstrip("XX-XX")',
               "the stack slug is lowercase (StackConfig.slug): it never ends in 'X', so stripping 'X' too strips "
               "nothing more"),
    *(Equivalent(INFRA_IDENTITY, "grant.role.rsplit('.', 1)[-1]", after,
                 "a predefined role id (roles/storage.objectViewer) has one '.': every split gives the same last piece")
      for after in ("grant.role.rsplit('.', )[-1]", "grant.role.split('.', 1)[-1]", "grant.role.rsplit('.', 2)[-1]",
                    "grant.role.rsplit('.', 1)[+1]")),
    Equivalent(INFRA_SHARE_PREP, ".rstrip('-')}-share-prep", ".rstrip('XX-XX')}-share-prep",
               "a namespace is a lowercase DNS label: it never ends in 'X', so stripping 'X' too strips nothing more"),
    Equivalent(INFRA_SHARE_PREP, '"runAsNonRoot": False,', '"runAsNonRoot": None,',
               "unset runAsNonRoot is false (PodSecurityContext): null is dropped from the manifest"),
    Equivalent(INFRA_JOBS, "separators=(',', ':'))}'", "separators=None)}'", COMPACT),
    Equivalent(INFRA_JOBS, "json.dumps(overrides, separators=(',', ':'))", "json.dumps(overrides, )", COMPACT),
    *(Equivalent(INFRA_REDIS, f'"{key}": {n},', f'"{key}": {n + 1},', TUNING)
      for key, n in (("initialDelaySeconds", 2), ("periodSeconds", 5), ("initialDelaySeconds", 10),
                     ("periodSeconds", 10))),
    Equivalent(INFRA_REDIS, "length=32,", "length=33,",
               "a password one character longer: the guarantee is at least 32 random characters, and nothing reads "
               "its length"),
    # checkpoint:
    Equivalent(CHECKPOINT, "if t < token:", "if t <= token:",
               "manifests past the newest three are all below our token: ours is the newest, else _collect returned"),
    *(Equivalent(CHECKPOINT, "unlink(missing_ok=True)  # left by a writer killed mid-write",
                 f"unlink(missing_ok={v})  # left by a writer killed mid-write",
                 "the FileNotFoundError a missing file raises here is caught by the except around it, which "
                 "only continues the loop, as missing_ok would") for v in ("None", "False")),
    Equivalent(CHECKPOINT, "indent=1)", "indent=None)", MANIFEST_JSON),
    Equivalent(CHECKPOINT, "indent=1)", "indent=2)", MANIFEST_JSON),
    Equivalent(CHECKPOINT, "indent=1)", ")", MANIFEST_JSON),
    Equivalent(CHECKPOINT, "if self.dir.exists() else []", "if (self.dir.exists()) or True else []",
               "globbing a folder that does not exist yields nothing, as the empty list does"),
    Equivalent(CHECKPOINT, '"sha256": None}', '"XXsha256XX": None}', NO_HASH),
    Equivalent(CHECKPOINT, '"sha256": None}', '"SHA256": None}', NO_HASH),
    Equivalent(FSUTIL, "mask = os.umask(0)", "mask = os.umask(1)",
               "the umask read back is the one before either call; the next line restores it"),
    Equivalent(FSUTIL, "mask = os.umask(0)", "mask = None", AT_IMPORT),
    Equivalent(FSUTIL, "mask = os.umask(0)", "mask = os.umask(None)", AT_IMPORT),
    Equivalent(FSUTIL, "os.umask(mask)", "os.umask(None)", AT_IMPORT),
    # reading: the sample date check_format writes and reads back only has to be a valid date.
    *(Equivalent(READING, SAMPLE_DATE, after, "any valid date written with the format reads back alike: the sample "
                 "only proves the directives round-trip (which %-directives it has is checked on the format itself)")
      for after in ("time.strftime(fmt, )",
                    "time.strftime(fmt, time.struct_time((2019, 4, 5, 20, 21, 7, 3, 95, 0)))",
                    "time.strftime(fmt, time.struct_time((2018, 5, 5, 20, 21, 7, 3, 95, 0)))",
                    "time.strftime(fmt, time.struct_time((2018, 4, 6, 20, 21, 7, 3, 95, 0)))",
                    "time.strftime(fmt, time.struct_time((2018, 4, 5, 21, 21, 7, 3, 95, 0)))",
                    "time.strftime(fmt, time.struct_time((2018, 4, 5, 20, 22, 7, 3, 95, 0)))",
                    "time.strftime(fmt, time.struct_time((2018, 4, 5, 20, 21, 8, 3, 95, 0)))",
                    "time.strftime(fmt, time.struct_time((2018, 4, 5, 20, 21, 7, 4, 95, 0)))",
                    "time.strftime(fmt, time.struct_time((2018, 4, 5, 20, 21, 7, 3, 96, 0)))",
                    "time.strftime(fmt, time.struct_time((2018, 4, 5, 20, 21, 7, 3, 95, 1)))")),
    Equivalent(READING, "ok = False", "ok = None", TRUTH),
    *(Equivalent(READING, "first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__",
                 after, "yaml.safe_load raises MarkedYAMLError subclasses (scanner, parser, constructor errors) whose "
                 "text always names the problem and where: the fallback to the class name never runs")
      for after in ("first = str(exc).strip().splitlines()[0] if (str(exc).strip()) or True else type(exc).__name__",
                    "first = str(exc).strip().splitlines()[0] if str(None).strip() else type(exc).__name__",
                    "first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(None).__name__")),
    Equivalent(HPARAMS, "digest()[:4]", "digest()[:5]",
               "the mask keeps bits 0-30, all in the first 4 bytes read little-endian: a 5th byte is masked away"),
    Equivalent(GPU, 'expected = environ.get(ENV_EXPECTED_GPUS, "").strip()',
               'expected = environ.get(ENV_EXPECTED_GPUS, "XXXX").strip()',
               "only read through expected.isdigit() (assigned_gpus reads the variable itself): '' and 'XXXX' are "
               "both no count, and one GPU is wanted"),
    # policy/pack.py: a URN's stack, and what the analyzer always passes.
    *(Equivalent(POLICY_PACK, 'return urn.split("::", 1)[0].rsplit(":", 1)[-1]', after,
                 "a URN (urn:pulumi:STACK::project::type::name) splits at its first '::' into the same first piece "
                 "whatever the limit, and 'urn:pulumi:STACK' at its last ':' into two pieces, the last one the stack")
      for after in ('return urn.split("::", 1)[0].rsplit(":", )[-1]', 'return urn.split("::", )[0].rsplit(":", 1)[-1]',
                    'return urn.split("::", 2)[0].rsplit(":", 1)[-1]',
                    'return urn.split("::", 1)[0].rsplit(":", 2)[-1]',
                    'return urn.split("::", 1)[0].rsplit(":", 1)[+1]')),
    *(Equivalent(POLICY_PACK, "facts = stack_facts(stack=stack_of(resources[0].urn) if resources else None)", after,
                 "no stack rule reads the stack's name, nor the env label it defaults (only onDemandFallback, "
                 "datasetUri and outputUri, from the config): whichever stack the facts name, the same verdicts")
      for after in ("facts = stack_facts(stack=None)",
                    "facts = stack_facts(stack=stack_of(resources[0].urn) if (resources) and False else None)",
                    "facts = stack_facts(stack=stack_of(resources[0].urn) if (resources) or True else None)",
                    "facts = stack_facts(stack=stack_of(resources[1].urn) if resources else None)")),
    Equivalent(POLICY_PACK, "stack = stack if stack is not None else pulumi.get_stack()",
               "stack = stack if (stack is not None) or True else pulumi.get_stack()",
               "the pack passes no stack only from a stack policy over no resources, and no stack rule reads it"),
    *(Equivalent(POLICY_PACK, 'getattr(args.opts, "protect", False)', f'getattr(args.opts, "protect", {v})',
                 "the analyzer always passes the resource's options (PolicyResourceOptions, which has protect): the "
                 "fallback is never read") for v in ("None", "True")),
    Equivalent(POLICY_PACK, "report(message, None)", "report(message, )",
               "the SDK's report_violation takes urn=None by default (pulumi_policy/policy.py): the same call"),
    *(Equivalent(POLICY_PACK, f'{key}) or "false").lower() == "true"', f'{key}) or {after}).lower() == "true"',
                 "the fallback, read for a key left unset, is only compared with 'true' after lower(): 'false', "
                 "'FALSE' and 'XXfalseXX' all read as false")
      for key in ('config.get("onDemandFallback"', "config.get(DATA_LOSS_KEY") for after in ('"XXfalseXX"', '"FALSE"')),
    # simulator: chunk sizes and spare bounds; featurestore: the .npy header read.
    *(Equivalent(SIMULATOR, "step = max(1, 2_000_000 // max(1, len(terminal_xy)))", after,
                 "the number of customers per chunk of the distance loop: only memory and speed change, every chunk "
                 "writes its own rows of the same result")
      for after in ("step = max(2, 2_000_000 // max(1, len(terminal_xy)))",
                    "step = max(1, 2000001 // max(1, len(terminal_xy)))",
                    "step = max(1, 2_000_000 // max(2, len(terminal_xy)))")),
    Equivalent(SIMULATOR, "np.arange(spec.days + 1))", "np.arange(spec.days + 2))",
               "the loop over days reads bounds[d] and bounds[d + 1] for d < days: a bound past them is never read"),
    Equivalent(SIMULATOR, "frame.to_parquet(buf, index=False)", "frame.to_parquet(buf, index=None)",
               "the frame is reset_index(drop=True)'d: pandas keeps a RangeIndex as metadata only with index=None, "
               "no column is written (test_the_smallest_spec_generates_its_one_day_named_by_date reads the columns)"),
    Equivalent(SIMULATOR, "frame.to_parquet(buf, index=False)", "frame.to_parquet(buf, )",
               "index=None is to_parquet's default: a RangeIndex stays metadata only, no column is written"),
    Equivalent(SIMULATOR, 'np.datetime64(self.start_date, "D")', "np.datetime64(self.start_date, )",
               "only a check: np.datetime64 parses the same strings with or without a unit (a unit only casts the "
               "result), so the same start dates are refused"),
    Equivalent(SIMULATOR, "replace=False)", "replace=None)",
               "numpy's Generator.choice reads replace for its truth only: None draws without replacement as False "
               "does"),
    *(Equivalent(SIMULATOR, "if chunks else np.zeros(0, dtype=np.int64)", after,
                 "chunks is never empty: a spec has at least 3 customers (SimulationSpec), so the distance loop runs "
                 "at least once and the fallback is never built")
      for after in ("if (chunks) or True else np.zeros(0, dtype=np.int64)",
                    "if chunks else np.zeros(None, dtype=np.int64)", "if chunks else np.zeros(0, dtype=None)",
                    "if chunks else np.zeros(dtype=np.int64)",
                    "if chunks else np.zeros(0, )", "if chunks else np.zeros(1, dtype=np.int64)")),
    *(Equivalent(SIMULATOR, before, after, "the dict lists schema.SIMULATED's columns in its order: columns= only "
                 "restates it")
      for before, after in (("columns=list(schema.SIMULATED),", "columns=None,"),
                            ("columns=list(schema.SIMULATED), / )", ")"))),
    *(Equivalent(SIMULATOR, "np.arange(len(customer), dtype=np.int64)", after,
                 "numpy 2's default integer is int64 on every platform: the same IDs in the same dtype")
      for after in ("np.arange(len(customer), dtype=None)", "np.arange(len(customer), )")),
    Equivalent(SIMULATOR, 'start = np.datetime64(spec.start_date, "s")', "start = np.datetime64(spec.start_date, )",
               "the date parses as day precision, and adding the timedelta64[s] seconds promotes it to seconds: the "
               "same instants"),
    *(Equivalent(SIMULATOR, "hit = np.zeros((spec.terminals, n_days + 1), dtype=np.int64)", after,
                 "hit only counts compromises, and only whether a window's count is > 0 is read: float counts, a "
                 "spare column past day n_days, or counting 2 per compromise mark the same transactions")
      for after in ("hit = np.zeros((spec.terminals, n_days + 1), dtype=None)",
                    "hit = np.zeros((spec.terminals, n_days + 1), )",
                    "hit = np.zeros((spec.terminals, n_days + 2), dtype=np.int64)")),
    Equivalent(SIMULATOR, "compromise_day + 1), 1)", "compromise_day + 1), 2)",
               "hit only counts compromises, and only whether a window's count is > 0 is read"),
    Equivalent(SIMULATOR, "np.arange(spec.customers + 1))", "np.arange(spec.customers + 2))",
               "the loop reads starts[c] and starts[c + 1] for customers c < spec.customers: a bound past them is "
               "never read"),
    Equivalent(SIMULATOR, "np.where(amount < 0, redraw, amount)", "np.where(amount <= 0, redraw, amount)",
               "amount is a normal draw before rounding: exactly 0.0 has probability zero (the cents come after)"),
    Equivalent(SIMULATOR, "near = np.sqrt((diff**2).sum(axis=2)) < radius",
               "near = np.sqrt((diff**2).sum(axis=2)) <= radius",
               "positions are uniform float64 draws: a customer and a terminal exactly `radius` apart has probability "
               "zero (the handbook's rule is < r)"),
    Equivalent(FEATURESTORE, "data[pos:pos + 4096]", "data[pos:pos + 4097]",
               "the .npy header of these arrays (magic, a dict of dtype, order and shape, padded to 64 bytes) is far "
               "below 4096 bytes: one byte more holds the same header"),
    Equivalent(FEATURESTORE, "if version == (1, 0) else", "if (version == (1, 0)) or True else",
               "write_array writes format 1.0 for these arrays (2.0 only for a header over 64 KiB): the 1.0 reader "
               "is the one used either way"),
    *(Equivalent(FEATURESTORE, "dtype=dtype), allow_pickle=False)", f"dtype=dtype), {after})",
                 "each array is cast to its _ARRAYS dtype first (float32, datetime64[D], int64, bool: numpy's own, "
                 "no objects), and write_array reads allow_pickle only for object or user-defined dtypes")
      for after in ("allow_pickle=None", "allow_pickle=True", "")),
    # plan: the temporary record's removal.
    *(Equivalent(PLAN, "Path(tmp).unlink(missing_ok=True)", f"Path(tmp).unlink(missing_ok={after})",
                 "the finally runs while the temp file exists: mkstemp made it, os.link leaves its source in place, "
                 "and nothing removes files in the runs folder (the stale sweeps are the checkpoints' and datasets')")
      for after in ("None", "False")),
    # steps: a rewind's day lists.
    Equivalent(STEPS, 'if pos.get(d, -1) > mine]', 'if pos.get(d, -1) >= mine]',
               "run() acks a day its checkpoint already applied before any rewind: the attempt's own day is never "
               "among the applied days here, so > and >= select the same ones"),
    Equivalent(STEPS, 'if pos.get(d, -1) < mine]', 'if pos.get(d, -1) <= mine]',
               "pos gives each dataset day its own index and other days -1, so only the attempt's own day has "
               "pos == mine, and run() acks a day its checkpoint already applied before any rewind (rewind's one "
               "caller, with the same checkpoint): that day is never among the applied days here, so < and <= "
               "select the same earlier days"),
    *(Equivalent(STEPS, f"if pos.get(d, -1) {op} mine]", f"if pos.get(d, {after}) {op} mine]",
                 "a run's applied days are training days of its dataset, which keeps every published day (days are "
                 "immutable once published): pos has each of them, the default is never read")
      for op in (">", "<") for after in ("None", "", "+1", "-2")),
    # metrics: numpy's answers without rows, and the bins' index bounds.
    Equivalent(METRICS, "if len(probs) else float(\"nan\")", "if (len(probs)) or True else float(\"nan\")",
               "numpy's mean of no rows is nan too (with a RuntimeWarning): the same value"),
    Equivalent(METRICS, "if fraud.sum() else nan", "if (fraud.sum()) or True else nan",
               "without frauds both sums are numpy zeros, and numpy's 0.0 / 0.0 is nan too (with a RuntimeWarning)"),
    Equivalent(METRICS, 'side="right") - 1, 0, len(edges) - 2)', 'side="right") - 1, None, len(edges) - 2)',
               "probabilities are >= 0, the first edge: the bin index is never below 0, so no lower clip is needed"),
    Equivalent(METRICS, "for b in range(len(edges) - 1):", "for b in range(len(edges) + 1):",
               "the bin index is clipped to len(edges) - 2: the two extra bins are empty, and empty bins are left out"),
    # calibration: the overflow guard's bounds, Newton's stop, and labels that are 0 or 1.
    *(Equivalent(CALIBRATION, "offset, -35, 35)", f"offset, {bounds})",
                 "an overflow guard: a bound of 36 or none instead of 35 changes p only where |scale * logit + "
                 "shift| > 35, where p is within 7e-16 of 0 or 1 under either bound; each row's gradient term moves "
                 "by at most 7e-16 * (|logit| + 1), so the fit (the root of a penalised gradient that is ridge * n "
                 "strongly monotone) moves by at most 7e-16 * (mean |logit| + 1) / ridge: 7e-10 * (mean |logit| + 1) "
                 "at the default ridge, about 1e-9 relative on a separable day")
      for bounds in ("-35, None", "-36, 35", "-35, 36")),
    Equivalent(CALIBRATION, "for _ in range(100):", "for _ in range(101):",
               "with step halving the iteration converges in at most 18 steps (395 random days of every shape, and "
               "test_any_day_with_both_classes_gets_the_fit_that_solves_its_score_equations): the 101st never runs"),
    *(Equivalent(CALIBRATION, before, after,
                 "the halving schedule only changes the path to the optimum: the fit is where the penalised gradient "
                 "vanishes, reached to the 1e-10 step tolerance either way (at most 11 halvings a step on 395 random "
                 "days; the calibration tests check the score equations on 15 days)")
      for before, after in (("for halvings in range(61):", "for halvings in range(62):"),
                            ("or halvings == 60:", "or halvings == 61:"),
                            ("step = step / 2", "step = step / 3"))),
    *(Equivalent(CALIBRATION, "if tried <= current + 1e-12 * abs(current)", after,
                 "the allowance decides only for a step that leaves the loss unchanged to rounding, which happens only "
                 "at the optimum, where the step is already below the 1e-10 stopping size: the fit is the same to it")
      for after in ("if tried < current + 1e-12 * abs(current)", "if tried <= current + 1e-12 / abs(current)")),
    Equivalent(CALIBRATION, "if np.abs(step).max() < 1e-10:", "if np.abs(step).max() <= 1e-10:",
               "Newton's largest step equals 1e-10 exactly with nil probability: < and <= stop after the same step"),
    Equivalent(CALIBRATION, "if scale > 0:", "if scale >= 0:",
               "the fitted scale, a float64 Newton iterate from the day's logits, is exactly 0.0 with nil probability: "
               "> 0 and >= 0 act alike"),
    *(Equivalent(CALIBRATION, "np.asarray(labels, dtype=np.float64)", f"np.asarray(labels, {after})",
                 "labels are 0 or 1 (Examples.y is float32; bool and integer labels too): compared with 0.5 in their "
                 "own dtype or as float64, the same booleans")
      for after in ("dtype=None", "")),
    Equivalent(CALIBRATION, ".ravel() > 0.5)", ".ravel() >= 0.5)",
               "labels are exactly 0 or 1 (validated TX_FRAUD; Examples.y is float32): >= 0.5 and > 0.5 agree on both"),
    Equivalent(CALIBRATION, "if len(y) == 0 or", "if len(y) == 1 or",
               "a one-row sample is all fraud or all legitimate (y.sum() is 0 or len(y)) and an empty one has "
               "y.sum() == 0: the other two tests return IDENTITY for both either way"),
    Equivalent(CALIBRATION, "calibrated=False)", "calibrated=None)",
               "Trainer.score reads `calibrated` only for its truth (`if calibrated:`): None and False alike give the "
               "raw scores"),
    # launch: header names, the poll default, the deadline's clock.
    *(Equivalent(LAUNCH, 'headers={"Authorization": f"Bearer {token}"}', f'headers={{"{name}": f"Bearer {{token}}"}}',
                 "HTTP field names are case-insensitive (RFC 9110, 5.1): the API server reads the same header")
      for name in ("authorization", "AUTHORIZATION")),
    Equivalent(LAUNCH, "poll_s: float = 5.0)", "poll_s: float = 6.0)",
               "the one caller passes its --poll (cli wait-drained): the default is never read"),
    Equivalent(LAUNCH, "if left <= 0:", "if left < 0:", CLOCK),
    # gpu: the branches a torch with CUDA takes. The suite's machines have the CPU build (is_available() False,
    # device_count() 0, torch.version.cuda None); test_on_a_gpu_the_worker_trains_on_cuda runs on a GPU machine.
    *(Equivalent(GPU, before, after, CUDA_ONLY) for before, after in (
        ("is_available() and torch.cuda.device_count()", "is_available() or torch.cuda.device_count()"),
        ("device_count() >= wanted:", "device_count() > wanted:"),
        ("cuda = torch.version.cuda", "cuda = None"),
        ("if cuda else", "if (cuda) and False else"),
        ("seen = torch.cuda.device_count() if torch.cuda.is_available() else 0",
         "seen = torch.cuda.device_count() if (torch.cuda.is_available()) and False else 0"),
        ("seen = torch.cuda.device_count() if torch.cuda.is_available() else 0",
         "seen = torch.cuda.device_count() if (torch.cuda.is_available()) or True else 0"),
        *((CUDA_NEEDS, CUDA_NEEDS.replace(part, other)) for part, other in (
            ("get(cuda.split('.')[0], 'for it')", "get(None, 'for it')"),
            ("'for it')", "None)"), ("get(cuda.split('.')[0], 'for it')", "get('for it')"), (", 'for it')", ", )"),
            ("split('.')", "split(None)"), ("split('.')", "split('XX.XX')"), ("[0]", "[1]"),
            ("'for it'", "'XXfor itXX'"), ("'for it'", "'FOR IT'"))))),
    # The one `return ""` that survives is the one after CUDA was found usable (the first, for a pod without a GPU,
    # is checked by test_a_pod_without_a_gpu_is_left_to_the_cpu).
    Equivalent(GPU, 'return ""', 'return "XXXX"', CUDA_ONLY),
    Equivalent(GPU, "if device_files is None else", "if (device_files is None) and False else",
               "the suite's machines have no /dev/nvidia<N>: the glob finds none, and None and [] both mean no device "
               "(assigned_gpus tests `if device_files`)"),
    # queue (after the whole run):
    *(Equivalent(WORKQUEUE, "socket_connect_timeout=min(timeout_s, 3.0),", after,
                 "bounds a connect to a host that drops SYNs, which a loopback redis-server never does (it refuses or "
                 "accepts at once); every variant stays bounded (redis-py 8.1 falls back to socket_timeout)")
      for after in ("socket_connect_timeout=None,", "", "socket_connect_timeout=min(timeout_s, 4.0),")),
    *(Equivalent(WORKQUEUE, "health_check_interval=15,", after,
                 "a PING before reusing a connection idle that long; without it the command itself finds a dead "
                 "connection and the client's Retry reconnects and repeats it: the same outcome")
      for after in ("health_check_interval=None,", "", "health_check_interval=16,")),
    Equivalent(WORKQUEUE, "retry_on_error=[redis.ConnectionError, redis.TimeoutError], / )", ")",
               "redis-py's Retry already retries ConnectionError and TimeoutError (its default supported_errors): "
               "the list adds nothing"),
    *(Equivalent(WORKQUEUE, "ExponentialBackoff(cap=1.0, base=0.05), retries=3)", after,
                 "the pace and count of one call's tries: test_a_frozen_redis_fails_a_call_after_its_retries_instead_"
                 "of_hanging bounds the call from both sides, and WorkQueue's retry_for_s decides when an outage is "
                 "an infrastructure fault")
      for after in ("ExponentialBackoff(base=0.05), retries=3)", "ExponentialBackoff(cap=1.0, ), retries=3)",
                    "ExponentialBackoff(cap=2.0, base=0.05), retries=3)",
                    "ExponentialBackoff(cap=1.0, base=1.05), retries=3)",
                    "ExponentialBackoff(cap=1.0, base=0.05), retries=4)")),
    Equivalent(WORKQUEUE, "max_attempts: int = 5,", "max_attempts: int = 6,",
               "only claim reads it, and the one caller that claims passes it (cli.make_queue, --max-attempts)"),
    Equivalent(WORKQUEUE, "retry_for_s: float = 300.0,", "retry_for_s: float = 301.0,",
               "one more second of a 5-minute outage budget, for `make local`'s progress reader only (the CLI "
               "passes REDIS_RETRY_SECONDS)"),
    Equivalent(WORKQUEUE, "if time.monotonic() + delay > deadline:",
               "if time.monotonic() + delay >= deadline:", CLOCK),
    *(Equivalent(WORKQUEUE, 'run.decode(errors="replace")', after,
                 "a run name reaches Redis only through check_name (letters, digits, '.', '_', '-'): its decoding "
                 "never meets a bad byte, so the error handler is never looked up")
      for after in ('run.decode(errors="XXreplaceXX")', 'run.decode(errors="REPLACE")')),
    *(Equivalent(WORKQUEUE, 'done, dead, total = self._retrying("counts", pipe.execute)',
                 f"done, dead, total = self._retrying({name}, pipe.execute)",
                 "counts' first read names the call and fails first when Redis is down; this name shows only if Redis "
                 "drops between the two reads, and only in the text: the fault and the exit code are the same")
      for name in ("None", '"XXcountsXX"', '"COUNTS"')),
    Equivalent(WORKQUEUE, 'text.split("/", 1)[0]', 'text.split("XX/XX", 1)[0]',
               "the fallback is never a run with a queue (a run that prefixed the id would be an owner, and an id "
               "without '/' is the same either way): both values show the item under no run"),
    # queue:
    Equivalent(WORKQUEUE, '("error" if error', '("XXerrorXX" if error', ERROR_MODE),
    Equivalent(WORKQUEUE, '("error" if error', '("ERROR" if error', ERROR_MODE),
    Equivalent(WORKQUEUE, "max(owners, key=len)", "max(owners, key=None)", PREFIXES),
    Equivalent(WORKQUEUE, "max(owners, key=len)", "max(owners, )", PREFIXES),
    Equivalent(WORKQUEUE, 'text.split("/", 1)[0]', 'text.split("/", None)[0]', FIRST_PIECE),
    Equivalent(WORKQUEUE, 'text.split("/", 1)[0]', 'text.split("/", )[0]', FIRST_PIECE),
    Equivalent(WORKQUEUE, 'text.split("/", 1)[0]', 'text.split("/", 2)[0]', FIRST_PIECE),
    Equivalent(WORKQUEUE, 'text.split("/", 1)[0]', 'text.rsplit("/", 1)[0]',
               "with no run prefixing the id, no piece of it before a '/' is a run either: only the whole id can be"),
    Equivalent(FSUTIL, "_idle_s(path) > idle_s:", "_idle_s(path) >= idle_s:",
               "idle time is a float of the wall clock read now: equal to the limit to the last bit never happens"),
    Equivalent(CHECKPOINT, "st_mtime > 600:", "st_mtime >= 600:",
               "age is a float of the wall clock read now: equal to the limit to the last bit never happens"),
    Equivalent(WORKQUEUE, "if isinstance(res, bytes) else", "if (isinstance(res, bytes)) or True else",
               BYTES),
    Equivalent(WORKQUEUE, "else str(res)", "else str(None)", BYTES),
    Equivalent(WORKQUEUE, "if isinstance(by, bytes) else", "if (isinstance(by, bytes)) or True else", BYTES),
    Equivalent(WORKQUEUE, "else str(by)", "else str(None)", BYTES),
    Equivalent(WORKQUEUE, "int(micros) // 1000", "int(micros) // 1001",
               "moves status's clock by under 1 ms; it prints lease times to 0.1 s"),
    # report:
    Equivalent(REPORT, "st_mtime >= interval_s", "st_mtime > interval_s",
               "the pictures' age is a float of the wall clock read now: equal to the interval to the last bit never "
               "happens"),
    *(Equivalent(REPORT, 'state.get("reapplied", [])', after,
                 "render reads no rewinds from None as from [] (`reapplied or []`, `if reapplied`): the same report")
      for after in ('state.get("reapplied", None)', 'state.get("reapplied", )')),
    *(Equivalent(PLOTS, f"axes.plot(x, {y},", f"axes.plot({y},",
                 "x is np.arange(len(history)), the x matplotlib gives a plot of y alone: the same points")
      for y in ("values", "base")),
    Equivalent(PLOTS, 'color="grey"', 'color="GREY"',
               "matplotlib reads colour names in any letter case: the same grey"),
    Equivalent(PLOTS, 'get("n_fraud", 1)) == 0', 'get("n_fraud", 2)) == 0',
               "a day without n_fraud counts as one with fraud (older days did not count it): any default but 0 does"),
    Equivalent(PLOTS, "get_legend_handles_labels()[0]", "get_legend_handles_labels()[1]",
               "handles and labels come in pairs: both lists are empty or neither is"),
    # export.py
    Equivalent(EXPORT, 'warnings.simplefilter("ignore", FutureWarning)', 'warnings.simplefilter("ignore", )',
               "importing google.cloud.storage warns a FutureWarning (the Python version) and otherwise only an "
               "ImportWarning (grpcio-status absent), which Python's default filters ignore: ignoring every Warning "
               "class there silences nothing more"),
    Equivalent(EXPORT, "if size <= 0 or", "if size <= 1 or",
               "a header of 1 byte cannot be a JSON object ('{}' is 2): it is refused either way, and model_state, "
               "the only caller, reads it only after safetensors' own load accepted the same bytes, which it does "
               "not for a 1-byte header"),
    *(Equivalent(EXPORT, 'state.get("reapplied", [])', after,
                 "render reads no rewinds from None as from [] (`reapplied or []`, `if reapplied`): the same report")
      for after in ('state.get("reapplied", None)', 'state.get("reapplied", )')),
    Equivalent(EXPORT, 'fresh = Trainer(state["run"], hp,', 'fresh = Trainer(None, hp,',
               "Trainer.__init__ only stores the run, and the fresh state's run is replaced by the file's own in "
               "{**fresh, **state} (state['run'] was read the line before: the file has one)"),
    *(Equivalent(EXPORT, 'tuple(state["feature_names"]), device=torch.device("cpu")).state_dict()',
                 f'tuple(state["feature_names"]), {after}).state_dict()',
                 "the fresh trainer only fills what the file leaves out (an optimizer with no state yet, the CPU "
                 "random generator's state, no progress), none of it a device tensor: the merged state is the same "
                 "on any device, and default_device() is the CPU on the suite's CPU build of torch anyway")
      for after in ("device=None", "")),
    *(Equivalent(EXPORT, 'from_state({**fresh, **state}, device=torch.device("cpu"))',
                 f'from_state({{**fresh, **state}}, {after})',
                 "differs only where torch has CUDA (the model would load onto the GPU): the suite's machines have "
                 "the CPU build of torch, where default_device() is the CPU, the device named here")
      for after in ("device=None", "")),
    *(Equivalent(EXPORT, 'parsed.get("tensors", [])', after,
                 "model_bytes has written the 'tensors' key in every header since export began (95def6e): the "
                 "default is read only for a header made by hand, never for a file `export` wrote")
      for after in ('parsed.get("tensors", None)', 'parsed.get("tensors", )')),
    *(Equivalent(EXPORT, "client.list_blobs(bucket, prefix=folder)", after,
                 "the listing is read only through present.get(folder + name): a listing of the whole bucket holds "
                 "the same objects under the folder (and others, never looked up), so the same files are uploaded; "
                 "only the listing is longer")
      for after in ("client.list_blobs(bucket, prefix=None)", "client.list_blobs(bucket, )")),
    *(Equivalent(EXPORT, "getattr(exc, 'message', exc)", after,
                 "the GoogleAPIErrors the client raises here are GoogleAPICallError (every HTTP error) and RetryError, "
                 "both of which set .message (DuplicateCredentialArgs, the other kind, comes only from building a "
                 "client with two credentials, which storage_client() never does): the default is never read")
      for after in ("getattr(exc, 'message', None)", "getattr(exc, 'message', )")),
    # publish.py
    Equivalent(PUBLISH, "uuid.uuid4().hex[:12]", "uuid.uuid4().hex[:13]",
               "the suffix only keeps loaders' staging folders apart (a uuid4's hex digits are random: 13 are as "
               "unique as 12), and every reader of the name (_remove_staging's glob) matches any suffix"),
    *(Equivalent(PUBLISH, "staging.mkdir(parents=True)", f"staging.mkdir(parents={value})",
                 "the staging folder's parent is the dataset's, which publish() creates (parents=True) before it "
                 "takes the lock there, and _add runs only under publish(): parents= never has a folder to create")
      for value in ("None", "False")),
    *(Equivalent(PUBLISH, 'frame.attrs.get("ignored", ())', f'frame.attrs.get("ignored", {default})',
                 "read_transactions returns validate()'s frame, which always sets attrs['ignored'] (a list, empty "
                 "when nothing is ignored): the default is never read")
      for default in ("None", "")),
    *(Equivalent(PUBLISH, 'if days else ""', after,
                 "_log_added runs only with files added: a first publish of no file is refused by check_dataset "
                 "(no day files) and an append runs only for new files, so days is never empty and the condition "
                 "always picks the span")
      for after in ('if (days) or True else ""', 'if days else "XXXX"')),
    Equivalent(PUBLISH, "ds.check_suffix(f.rel, f.uri)", "ds.check_suffix(f.uri)",
               "a SourceFile's uri ends in its rel (a local path or uri/rel, gs://bucket/prefix/rel for an object): "
               "the suffix judged is the same, and `where` defaults to that path, the same uri the message names"),
    # local.py
    Equivalent(LOCAL, "os.ftruncate(fd, 0)", "os.ftruncate(fd, 1)",
               "the pid line written next, at offset 0, is at least two bytes (a digit and a newline): it covers the "
               "one byte kept, so the file holds that line alone either way"),
    Equivalent(LOCAL, "interrupted = False", "interrupted = None", TRUTH),
    *(Equivalent(LOCAL, "seeded > 0", after,
                 "this return runs only when seeded != 0, and EXIT_FAILED is 1: a code of 0 never gets here and a "
                 "code of 1 is returned as 1 either way")
      for after in ("seeded >= 0", "seeded > 1")),
    Equivalent(LOCAL, "last_print = 0.0", "last_print = 1.0",
               "time.monotonic() is Linux's CLOCK_MONOTONIC, seconds since boot: `local` runs long past a machine's "
               "first 11 s, so the first line prints at once either way"),
    Equivalent(LOCAL, "elif now - last_print >= 10:", "elif now - last_print > 10:", CLOCK),
    *(Equivalent(LOCAL, f"{call}flush=True)", f"{call}{after})",
                 "sys.stderr is line-buffered (Python >= 3.9, a terminal or not), and a line-buffered TextIOWrapper "
                 "flushes every write that holds a newline or a carriage return: this one holds one (the redraw's "
                 "leading '\\r', or print's '\\n'), so it is flushed at once either way")
      for call in ('end="", file=sys.stderr, ', "print(line, file=sys.stderr, ")
      for after in ("flush=None", "flush=False", "")),
    # cli.py
    Equivalent(CLI, "password = None", 'password = ""',
               "status's `password` (None unless --dir read one) is only passed to make_queue, which reads it as "
               "`password or env(\"REDIS_PASSWORD\")`: None and \"\" are both falsy, so REDIS_PASSWORD is used alike"),
    Equivalent(CLI, 'reading.check_format(args.datetime_format, "--datetime-format")',
               "reading.check_format(args.datetime_format, )",
               "check_format's `flag` parameter defaults to \"--datetime-format\" (workload/data/reading.py), the very "
               "string dropped: its refusal names --datetime-format either way"),
    *(Equivalent(CLI, "specs.setdefault(name, {})", f"specs.setdefault(name, {after})",
                 "`specs` is local to load_runs and read only by parse_runs (`specs or ...` is non-empty either way), "
                 "whose first step for each run is `spec = {} if spec is None else spec` (workload/model/hparams.py): "
                 "a --run the runs file does not name gets the default hyperparameters either way")
      for after in ("None", "")),
    *(Equivalent(CLI, "stream=sys.stderr, ", after,
                 "setup_logging's basicConfig(force=True) passes neither filename nor handlers, so it builds "
                 "StreamHandler(kwargs.pop('stream', None)), and StreamHandler.__init__ takes sys.stderr when stream "
                 "is None (CPython's logging/__init__.py): the same sys.stderr object, read in the same call")
      for after in ("stream=None, ", "")),
    *(Equivalent(CLI, 'p.add_subparsers(dest="command", required=True,', f"p.add_subparsers({after}required=True,",
                 "nothing reads args.command: each command's parser sets fn (set_defaults), which main calls, and "
                 "argparse names a missing command by its metavar, COMMAND (test_the_command_line_names_itself_and_"
                 "asks_for_a_command)")
      for after in ("", 'dest="XXcommandXX", ', 'dest="COMMAND", ')),
    *(Equivalent(CLI, '__import__("workload.runtime.local", fromlist=["main"])',
                 f'__import__("workload.runtime.local", fromlist=[{after}])',
                 "a non-empty fromlist only makes __import__ return workload.runtime.local itself rather than the "
                 "top package; its names are looked up only in a package (one with __path__), and local is a module")
      for after in ('"XXmainXX"', '"MAIN"')),
    Equivalent(CLI, "break_on_hyphens=False)", "break_on_hyphens=None)",
               "textwrap (CPython 3.11's textwrap.py) reads break_on_hyphens twice: `if self.break_on_hyphens is "
               "True` (None is not True, as False is not: the simple word splitter either way) and `if "
               "self.break_on_hyphens and len(chunk) > space_left` (None is falsy, as False: no split at a "
               "hyphen): _sub's description is filled identically"),
    Equivalent(CLI, 'os.environ.get("LOG_LEVEL", "INFO").upper()', 'os.environ.get("LOG_LEVEL", "info").upper()',
               "the default is upper-cased at once by the .upper() that follows: 'info'.upper() == 'INFO'"),
)

# Verdicts by mutmut's own names (mutmut.stats.status_by_exit_code maps its exit codes to them).
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}
UNDETECTED = {"survived", "suspicious", "no tests"}  # the rest: skipped, or not tested at all (an interrupted run)


@dataclass
class Survivor:
    name: str
    module: str
    before: str
    after: str
    why: str = ""  # set when EQUIVALENT explains it


@dataclass
class ModuleResult:
    module: str
    statuses: Counter[str] = field(default_factory=Counter)
    survivors: list[Survivor] = field(default_factory=list)

    @property
    def equivalent(self) -> int:
        return sum(1 for s in self.survivors if s.why)

    @property
    def detected(self) -> int:
        return sum(n for status, n in self.statuses.items() if status in DETECTED)

    @property
    def counted(self) -> int:
        return sum(self.statuses.values()) - self.equivalent - self.statuses["skipped"]

    @property
    def score(self) -> float:
        return 100.0 * self.detected / self.counted if self.counted else float("nan")


def base_config() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # strings and numbers: JSON's forms are valid TOML


def group_pyproject(text: str, group: Group) -> str:
    """``pyproject.toml`` with its ``[tool.mutmut]`` table narrowed to the group's modules and tests."""
    settings = {**base_config(), "only_mutate": list(group.modules),
                "pytest_add_cli_args_test_selection": list(group.tests)}
    if group.do_not_mutate_patterns:  # added to the shared ones
        settings["do_not_mutate_patterns"] = [*settings.get("do_not_mutate_patterns", []),
                                              *group.do_not_mutate_patterns]
    kept, skipping = [], False
    for line in text.splitlines():
        if line.startswith("["):
            skipping = line.strip() == "[tool.mutmut]"
        if not skipping:
            kept.append(line)
    table = ["[tool.mutmut]", *(f"{k} = {_toml_value(v)}" for k, v in settings.items())]
    return "\n".join(kept).rstrip() + "\n\n" + "\n".join(table) + "\n"


def copy_checkout(where: Path) -> Path:
    """A fresh copy of the checkout's files (tracked and new, not ignored) in `where` (also bench/planted.py's)."""
    shutil.rmtree(where, ignore_errors=True)
    for rel in _checkout_files():
        src = ROOT / rel
        if src.is_file():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, where / rel)
    return where


def stage(group: Group) -> Path:
    """A fresh copy of the checkout for this group's run, its mutmut settings narrowed to the group; the commit it
    was copied at is noted (``MARK``), for the record and for a later ``--no-run``."""
    where = copy_checkout(STAGE / group.name)
    (where / "pyproject.toml").write_text(group_pyproject((ROOT / "pyproject.toml").read_text(), group))
    (where / MARK).write_text(json.dumps({"commit": _head()}))
    return where


# A group's kept fixtures (Group.fixture_cache), in its stage: fresh with each run, as the stage is.
FIXTURE_CACHE, FIXTURE_CACHE_ENV = "fixture-cache", "MUTATION_FIXTURE_CACHE"  # the env: tests/workload/harness.py
MARK = "measured-at.json"  # in a group's stage: the commit it was copied at, then what its run took


def staged_run(group: Group) -> tuple[str, Run] | None:
    """The commit a group's last run (in build/mutation/) was staged at, and what it took; None when it has none."""
    try:
        mark = json.loads((STAGE / group.name / MARK).read_text())
    except (OSError, ValueError):
        return None
    return mark["commit"], Run(mark.get("wall", 0.0), mark.get("cpu", 0.0), mark.get("jobs", 0))


def _checkout_files() -> list[str]:
    """The checkout's files as git sees them (tracked, and new but not ignored); every file but the venv,
    build outputs and caches where this is not a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode().split("\0")
        return [rel for rel in listed if rel]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "mutants", "local", "__pycache__", ".pytest_cache", ".ruff_cache"}
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


# Each mutant's tests get one thread for torch, OpenMP and BLAS: mutants run side by side, one per core or more,
# and a pool of one thread per core in each of them spins against the others (the worker group: 10 % less
# time, the same verdicts).
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


@dataclass(frozen=True)
class Run:
    """What one group's mutmut run took: wall seconds, CPU seconds (mutmut and every process under it), and
    the number of mutants tested at once."""

    wall: float
    cpu: float
    jobs: int


def run_group(group: Group, jobs: int) -> tuple[list[ModuleResult], Run, str]:
    """mutmut over one group (``jobs`` per core of ``--jobs``, times the group's jobs_per_core); its results per
    module, what the run took, and mutmut's own last words on failure."""
    where = stage(group)
    jobs *= group.jobs_per_core
    started = time.monotonic()
    log = where / "mutmut.log"
    env = {**os.environ, "TERM": "dumb", **ONE_THREAD}
    if group.fixture_cache:
        (where / FIXTURE_CACHE).mkdir()
        env[FIXTURE_CACHE_ENV] = str(where / FIXTURE_CACHE)
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)], cwd=where,
                                stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # the usage of the whole tree mutmut waited for
        proc.returncode = os.waitstatus_to_exitcode(status)
    run = Run(time.monotonic() - started, usage.ru_utime + usage.ru_stime, jobs)
    mark = json.loads((where / MARK).read_text())
    (where / MARK).write_text(json.dumps({**mark, "wall": run.wall, "cpu": run.cpu, "jobs": run.jobs}))
    results = collect(where, group)
    problem = ""
    if proc.returncode != 0 or not any(sum(r.statuses.values()) for r in results):
        tail = log.read_text(errors="replace").replace("\r", "\n").strip().splitlines()[-5:]
        problem = f"mutmut exited {proc.returncode} (log {log.relative_to(ROOT)}): " + " | ".join(tail)
    return results, run, problem


def _test_names(text: str) -> set[str]:
    return set(re.findall(r"^(?:async )?def (test_\w+)", text, re.MULTILINE))


def recheck(group: Group, jobs: int) -> tuple[list[ModuleResult], Run, str]:
    """``--survivors``: the open survivors (neither killed nor explained) of the group's last run in
    build/mutation/ tested again against the checkout's tests, every other verdict kept: the routine step after
    tests were added for them. The mutants a stopped run never reached are tested too, so that it finishes with
    the new tests. Refused unless the group's modules and its list of test files are what that run had, and
    every test function of its files then is still there. It trusts that no test was loosened since (a kill
    stays a kill when tests are only added or tightened): after loosening one, run the group whole. The group's
    row then names this commit, at which its modules are the ones mutated."""
    where = STAGE / group.name
    shown = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    staged = staged_run(group)
    if staged is None or not (where / "mutants").is_dir():
        return [ModuleResult(m) for m in group.modules], Run(0.0, 0.0, 0), (
            f"no run in {shown}/ to re-test: run the group whole")
    commit, run = staged
    refusal = ""
    if changed := sorted(changed_files(commit) & set(group.modules)):
        refusal = f"{', '.join(changed)} changed since its run at {commit}"
    elif base_config_tests(where) != list(group.tests):
        refusal = f"its test files are not the ones its run at {commit} had"
    else:
        for test in group.tests:
            before = subprocess.run(["git", "show", f"{commit}:{test}"], cwd=ROOT, capture_output=True, text=True)
            if lost := sorted(_test_names(before.stdout) - _test_names((ROOT / test).read_text())):
                refusal = f"{test} lost {', '.join(lost[:3])}{' ...' if len(lost) > 3 else ''} since {commit}"
                break
    if refusal:
        return collect(where, group), run, f"cannot re-test its survivors: {refusal}; run the group whole"
    for rel in _checkout_files():  # the tests as they are now, where mutmut runs them
        if rel.startswith(("tests/", "bench/")):
            for dest in (where / rel, where / "mutants" / rel):
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, dest)
    names = [s.name for r in collect(where, group) for s in r.survivors if not s.why] + _unchecked(where, group)
    env = {**os.environ, "TERM": "dumb", **ONE_THREAD}
    if group.fixture_cache and (where / FIXTURE_CACHE).is_dir():
        env[FIXTURE_CACHE_ENV] = str(where / FIXTURE_CACHE)
    problem = ""
    if names:
        with (where / "mutmut.log").open("a") as out:
            proc = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children",
                                   str(jobs * group.jobs_per_core), *names], cwd=where, stdout=out,
                                  stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            problem = f"mutmut exited {proc.returncode} re-testing survivors (log {shown}/mutmut.log)"
    if not problem:  # a failed re-test leaves the row where its run was
        mark = json.loads((where / MARK).read_text())
        (where / MARK).write_text(json.dumps({**mark, "commit": _head(), "run_at": mark.get("run_at", commit),
                                              "survivors_retested": len(names)}))
    return collect(where, group), run, problem


def _unchecked(where: Path, group: Group) -> list[str]:
    """The mutants a run stopped before testing (mutmut's verdict still None)."""
    out = []
    for module in group.modules:
        meta = where / "mutants" / f"{module}.meta"
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        out += [name for name, code in codes.items() if code is None]
    return out


def base_config_tests(where: Path) -> list[str]:
    """The test files a stage's mutmut settings name."""
    return list(tomllib.loads((where / "pyproject.toml").read_text())["tool"]["mutmut"]
                ["pytest_add_cli_args_test_selection"])


Outcome = tuple[list[ModuleResult], Run, str]
_COLLECTING = threading.Lock()  # collect() changes the working folder and mutmut's globals: one at a time
_PRINTING = threading.Lock()


def _say(text: str) -> None:
    with _PRINTING:
        print(text, flush=True)


def run_groups(groups: list[Group], jobs: int, lanes: int) -> dict[str, Outcome]:
    """Every group's run, ``lanes`` groups at a time. Two lanes: the groups whose tests mostly wait in one, the
    others in the other, each list the longest first (the last group may run alone, on its lane's share); a
    lane done with its own takes from the other's. Each lane has half of ``jobs``: a waiting group leaves
    much of its share idle (the worker's tests: 1.05 cores of 2), and the other lane's group uses it."""
    lists: list[list[Group]] = [sorted((g for g in groups if g.jobs_per_core > 1), key=lambda g: -g.cpu_minutes),
                                sorted((g for g in groups if g.jobs_per_core == 1), key=lambda g: -g.cpu_minutes)]
    lists = lists if lanes > 1 else [lists[0] + lists[1]]
    lock = threading.Lock()
    outcomes: dict[str, Outcome] = {}

    def lane(own: int) -> None:
        while True:
            with lock:
                todo = next((lst for lst in (lists[own], *lists) if lst), None)
                if todo is None:  # both lists are empty: this lane is done
                    return
                group, share = todo.pop(0), max(1, jobs // len(lists))
            _say(f"{group.name}: mutating {', '.join(group.modules)} against {', '.join(group.tests)}")
            try:
                results, run, problem = outcomes[group.name] = run_group(group, share)
            except Exception as exc:  # noqa: BLE001 - reported with the group, and the other lane goes on
                results, run, problem = outcomes[group.name] = (
                    [ModuleResult(m) for m in group.modules], Run(0.0, 0.0, share), f"the run failed: {exc!r}")
            mutants = sum(sum(r.statuses.values()) for r in results)
            _say("\n".join([*table([(r, "") for r in results])[2:],
                            f"{group.name}: {mutants} mutants in {run.wall / 60:.1f} min, {run.jobs} at once, "
                            f"{run.cpu / 60:.1f} CPU min" + (f"; {problem}" if problem else "")]))

    threads = [threading.Thread(target=lane, args=(i,), name=f"lane-{i}") for i in range(len(lists))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def collect(where: Path, group: Group) -> list[ModuleResult]:
    """Read mutmut's verdicts (``mutants/<module>.meta``) and the diff of every survivor; a module with no
    verdicts (no run yet, or mutmut failed before testing) comes back empty and scores nan."""
    if not (where / "mutants").is_dir():
        return [ModuleResult(m) for m in group.modules]
    import mutmut
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    results = []
    with _COLLECTING, contextlib.chdir(where):  # mutmut reads its config and files from the working folder
        mutmut._reset_globals()
        for module in group.modules:
            result = ModuleResult(module)
            meta = Path("mutants") / f"{module}.meta"
            codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
            for name, code in sorted(codes.items(), key=lambda kv: _natural(kv[0])):
                status = status_by_exit_code[code]
                result.statuses[status] += 1
                if status in UNDETECTED:
                    diff = get_diff_for_mutant(name, path=module).splitlines()[2:]  # past the file names
                    result.survivors.append(_survivor(name, module, diff))
            results.append(result)
    return results


def _natural(name: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _survivor(name: str, module: str, diff: list[str]) -> Survivor:
    before = " / ".join(line[1:].strip() for line in diff if line.startswith("-"))
    after = " / ".join(line[1:].strip() for line in diff if line.startswith("+"))
    return Survivor(name, module, before, after, _why(module, before, after))


def _why(module: str, before: str, after: str) -> str:
    """Why EQUIVALENT says this mutant cannot change behaviour ('' when it does not)."""
    return next((e.why for e in EQUIVALENT if e.explains(module, before, after)), "")


def table(rows: list[tuple[ModuleResult, str]]) -> list[str]:
    out = ["| module | mutants | killed | of which timeouts | survived | no tests | equivalent | score |",
           "|---|---|---|---|---|---|---|---|"]
    for r, pending in rows:
        if pending:
            out.append(f"| {r.module} | not measured: {pending} | | | | | | |")
            continue
        s = r.statuses
        out.append(f"| {r.module} | {sum(s.values())} | {r.detected} | {s['timeout']} | "
                   f"{s['survived'] + s['suspicious']} | {s['no tests']} | {r.equivalent} | "
                   f"{r.score:.1f} % |")
    return out


def _head() -> str:
    """The checkout's commit, which --changed-since recorded starts from (none outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "(none: not a git checkout)"


def survivor_lines(survivors: list[Survivor]) -> list[str]:
    """One line per survivor: its name, the diff, and why it cannot change behaviour (when explained)."""
    return [f"- `{s.name}`: `{s.before}` -> `{s.after}`" + (f": {s.why}" if s.why else "") for s in survivors]


def write_explained(measured: str, equivalent: list[Survivor]) -> None:
    """The explained survivors of the run, beside the tool (the docs link here and keep the score)."""
    EXPLAINED.write_text("\n".join([
        "# Mutation testing: the survivors explained as equivalent", "",
        f"{measured} Each mutant below survived the tests, and a rule of `EQUIVALENT` in bench/mutation.py "
        "says why it cannot change behaviour a test could check; they are left out of the score in "
        "[docs/benchmarks.md](../docs/benchmarks.md). Written by `make mutation ARGS=--write`.", "",
        f"Equivalent ({len(equivalent)}):", *survivor_lines(equivalent)]) + "\n")


def write_docs(lines: list[str]) -> None:
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    block = "\n".join([BEGIN, *lines, END])
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        text = head + block + rest.partition(END)[2]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOCS.write_text(text)


def changed_files(rev: str) -> set[str]:
    """Files changed since `rev`: committed, staged or only in the working tree, and new ones not ignored."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {*git("diff", "--name-only", rev, "--").split(), *git("ls-files", "--others", "--exclude-standard").split()}


def _recorded_block() -> list[str]:
    text = DOCS.read_text() if DOCS.exists() else ""
    return text.partition(BEGIN)[2].partition(END)[0].splitlines()


# "at commit abc1234": the commit a record written before groups had their own names (see recorded_groups).
RECORDED_AT = re.compile(r"\bat (?:commit )?([0-9a-f]{7,40})\b")


def recorded_rev() -> str | None:
    """The one commit a record written before groups had their own names (``--write`` named it); None if none."""
    return next((m[1] for line in _recorded_block() if (m := RECORDED_AT.search(line))), None)


_ROW = re.compile(r"^\| (\S+\.py) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ")
_SURVIVOR = re.compile(r"^- `([^`]+)`: `(.*?)` -> `(.*?)`(?:: (.+))?$")
# A row of the groups' table: name, the commit it was measured at (absent in records older than the column),
# mutants, and the rest (at once, wall, CPU).
_GROUP_ROW = re.compile(r"^\| ([\w-]+) \| (?:([0-9a-f]{7,40}) \| )?(\d+) \| (.*)$")
GROUPS_HEAD = ["| group | measured at | mutants | at once | wall | CPU |", "|---|---|---|---|---|---|"]
NEVER = "no recorded run of its group as it is now"


def recorded_results() -> dict[str, ModuleResult]:
    """Per module, the figures and survivors of the recorded run (docs/benchmarks.md, and the explained survivors
    in bench/mutation_explained.md), as a run would give them."""
    block = _recorded_block()
    explained = EXPLAINED.read_text().splitlines() if EXPLAINED.exists() else []  # the equivalent ones
    survivors = [Survivor(m[1], "", m[2], m[3], m[4] or "") for line in [*block, *explained]
                 if (m := _SURVIVOR.match(line))]
    results = {}
    for line in block:
        if not (m := _ROW.match(line)):
            continue
        module = m[1]
        mutants, detected, timeouts, survived, no_tests, equivalent = map(int, m.groups()[1:])
        dotted = module.removesuffix(".py").replace("/", ".") + "."
        # A recorded open survivor that EQUIVALENT explains now (a rule added since) counts as explained.
        own = [Survivor(s.name, module, s.before, s.after, s.why or _why(module, s.before, s.after))
               for s in survivors if s.name.startswith(dotted)]
        own += [Survivor("(recorded)", module, "", "", "recorded as equivalent")
                for _ in range(equivalent - sum(1 for s in own if s.why))]
        statuses = Counter({"killed": detected - timeouts, "timeout": timeouts, "survived": survived,
                            "no tests": no_tests})
        statuses["skipped"] = mutants - sum(statuses.values())
        results[module] = ModuleResult(module, +statuses, own)
    return results


def group_row(name: str, rev: str, mutants: int, run: Run | None) -> str:
    if run is None or not run.jobs:  # figures re-reported without the run's timing
        return f"| {name} | {rev} | {mutants} | | | |"
    return f"| {name} | {rev} | {mutants} | {run.jobs} | {run.wall / 60:.1f} min | {run.cpu / 60:.1f} min |"


def recorded_groups(recorded: dict[str, ModuleResult]) -> dict[str, tuple[str, str]]:
    """Per group with recorded figures, the commit they were measured at and its row of the groups' table. A group
    with a module the record lacks was never measured as it is now: it has none. A record older than the
    'measured at' column names one commit for all (recorded_rev)."""
    by_name = {g.name: g for g in GROUPS}
    fallback = recorded_rev()
    out: dict[str, tuple[str, str]] = {}
    for line in _recorded_block():
        if (m := _GROUP_ROW.match(line)) and m[1] in by_name and (rev := m[2] or fallback):
            out[m[1]] = (rev, f"| {m[1]} | {rev} | {m[3]} | {m[4]}")
    for g in GROUPS:  # a record without the groups' table (a re-report)
        if g.name not in out and fallback:
            out[g.name] = (fallback, group_row(g.name, fallback, sum(
                sum(recorded[m].statuses.values()) for m in g.modules if m in recorded), None))
    return {name: kept for name, kept in out.items() if all(m in recorded for m in by_name[name].modules)}


def stale(group: Group, changed: set[str], recorded: dict[str, ModuleResult]) -> bool:
    """The group must run again: a module or test of it changed, or a module has no recorded figures."""
    return bool(changed & {*group.modules, *group.tests}) or any(m not in recorded for m in group.modules)


def to_rerun(groups: list[Group], recorded: dict[str, ModuleResult], commits: dict[str, str], since: str,
             changed: Callable[[str], set[str]] = changed_files) -> list[Group]:
    """The groups ``--changed-since SINCE`` runs: those never measured, and those with a module or test changed
    since SINCE; ``recorded``: since the commit each group's own figures were measured at."""
    seen: dict[str, set[str]] = {}
    out = []
    for g in groups:
        rev = commits.get(g.name) if since == "recorded" else since
        if rev is not None and rev not in seen:
            seen[rev] = changed(rev)
        if rev is None or stale(g, seen[rev], recorded):
            out.append(g)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=[g.name for g in GROUPS], help="groups to run (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                        help="mutants tested at once (default: one per core), shared by the lanes running, times "
                        "a group's jobs_per_core")
    parser.add_argument("--lanes", type=int, default=2, help="groups run at once (1: one after the other)")
    parser.add_argument("--write", action="store_true", help="record the figures in docs/benchmarks.md")
    parser.add_argument("--floor", type=float, default=FLOOR, help="lowest acceptable score, percent")
    parser.add_argument("--no-run", action="store_true",
                        help="report the last run from build/mutation/ (after editing EQUIVALENT, or to --write)")
    parser.add_argument("--survivors", action="store_true",
                        help="re-test only the open survivors of each group's last run in build/mutation/ against "
                        "the tests as they are now (its modules unchanged), keeping every other verdict")
    parser.add_argument("--changed-since", metavar="REV",
                        help="run only the groups changed since REV ('recorded': each group since the commit its "
                        "recorded figures were measured at) or never measured")
    args = parser.parse_args(argv)
    recorded = recorded_results()
    kept_rows = recorded_groups(recorded)
    todo = [g for g in GROUPS if not g.pending and (not args.only or g.name in args.only)]
    if args.changed_since:
        todo = to_rerun(todo, recorded, {n: rev for n, (rev, _) in kept_rows.items()}, args.changed_since)
    if args.no_run or args.survivors:  # only the groups build/mutation/ holds a run of
        if missing := [g.name for g in todo if staged_run(g) is None]:
            print(f"no run in {STAGE.relative_to(ROOT)}/ of {', '.join(missing)}", flush=True)
        todo = [g for g in todo if g.name not in missing]
    names = {g.name for g in todo}
    kept = sorted(n for n in kept_rows if n not in names)
    print(f"recorded figures kept: {', '.join(kept) or 'none'}", flush=True)

    started = time.monotonic()
    if args.survivors:
        outcomes = {g.name: recheck(g, args.jobs) for g in todo}
    else:
        outcomes = {} if args.no_run else run_groups(todo, args.jobs, args.lanes)
    wall = time.monotonic() - started
    recorded = recorded_results()  # read again: another run may have recorded other groups meanwhile
    kept_rows = recorded_groups(recorded)
    rows, groups_table, problems, unmeasured = report_rows(todo, outcomes, recorded, kept_rows, args.no_run)
    cpu = sum(run.cpu for _, run, _ in outcomes.values())
    if outcomes and args.survivors:  # each group's row keeps its whole run's figures
        retested = sum(json.loads((STAGE / g.name / MARK).read_text()).get("survivors_retested", 0) for g in todo
                       if (STAGE / g.name / MARK).is_file())
        groups_table.append(f"| this run: survivors re-tested | {_head()} | {retested} | | {wall / 60:.1f} min | |")
    elif outcomes:
        mutants = sum(sum(r.statuses.values()) for results, _, _ in outcomes.values() for r in results)
        groups_table.append(f"| this run | {_head()} | {mutants} | | {wall / 60:.1f} min | {cpu / 60:.1f} min |")

    measured = [r for r, pending in rows if not pending]
    total = ModuleResult("all measured modules")
    for r in measured:
        total.statuses.update(r.statuses)
        total.survivors += r.survivors
    unchecked = total.statuses["not checked"] + total.statuses["check was interrupted by user"]
    if unchecked:
        problems.append(f"{unchecked} mutant(s) were never tested (an interrupted run?): they count against the score")
    survivors = [s for s in total.survivors if not s.why]
    equivalent = [s for s in total.survivors if s.why]
    lines = [*GROUPS_HEAD, *groups_table, "", *table(rows), *table([(total, "")])[2:]]
    lines += ["", f"Survivors ({len(survivors)}): each is a bug the tests let through, or an equivalent mutant to "
              "explain in `EQUIVALENT` (bench/mutation.py).", *survivor_lines(survivors)]
    explained = [*lines, "", f"Equivalent ({len(equivalent)}), left out of the score:", *survivor_lines(equivalent)]
    lines += ["", f"Equivalent ({len(equivalent)}), left out of the score: listed with their reasons in "
              f"[bench/{EXPLAINED.name}](../bench/{EXPLAINED.name})."]
    # The floor holds for each module (issue 24), not only for their total; a module with nothing to count (every
    # mutant explained) cannot fall below it.
    below = [r.module for r in measured if r.counted and r.score < args.floor]
    if below:
        problems.append(f"below the floor of {args.floor:g} %: {', '.join(below)}")
    verdict = "holds" if measured and total.score >= args.floor and not problems and not unmeasured else "falls short"
    summary = (f"Mutation score {total.score:.1f} % over {len(measured)} module(s) (floor {args.floor:g} %): "
               f"{verdict}; {len(unmeasured)} group(s) not measured"
               + (f" ({', '.join(unmeasured)})" if unmeasured else "")
               + f"; this run: {len(todo)} group(s), {wall / 60:.1f} min with {args.jobs} job(s) shared by "
               f"{args.lanes} lane(s).")
    print()
    print("\n".join(explained + problems + ["", summary]))
    if args.write:
        command = " ".join(["python -m bench.mutation", *(sys.argv[1:] if argv is None else argv)])
        stamp = (f"Written {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} at commit {_head()} by `{command}`"
                 + f": groups run now: {', '.join(sorted(names)) or 'none'}; every other group's figures are kept "
                 "from the record, each measured at the commit its row names (mutmut, "
                 f"{os.cpu_count()} cores; load average over the last 15 min at the end {os.getloadavg()[2]:.1f}).")
        write_docs(["## Mutation testing", "", f"{stamp} {summary}", "", *lines, *problems])
        write_explained(stamp, equivalent)
        print(f"wrote {DOCS.relative_to(ROOT)} and {EXPLAINED.relative_to(ROOT)}")
    return 0 if verdict == "holds" else 1


def report_rows(ran: list[Group], outcomes: dict[str, Outcome], recorded: dict[str, ModuleResult],
                kept_rows: dict[str, tuple[str, str]], no_run: bool
                ) -> tuple[list[tuple[ModuleResult, str]], list[str], list[str], list[str]]:
    """Every group's modules and row of the groups' table: a group run now (or re-reported from build/mutation/)
    at the commit it was staged at, the others as recorded, and a group never recorded as not measured. Also the
    problems of the groups run, and the groups not measured."""
    rows: list[tuple[ModuleResult, str]] = []
    groups_table, problems, unmeasured = [], [], []
    names = {g.name for g in ran}
    for group in GROUPS:
        if group.pending or (group.name not in names and group.name not in kept_rows):
            why = group.pending or NEVER
            rows += [(ModuleResult(m), why) for m in group.modules]
            groups_table.append(f"| {group.name} | not measured: {why} | | | | |")
            unmeasured.append(group.name)
        elif group.name not in names:
            rows += [(recorded[m], "") for m in group.modules]
            groups_table.append(kept_rows[group.name][1])
        else:
            staged = staged_run(group)
            rev = staged[0] if staged else _head()
            if no_run:
                results, run, problem = collect(STAGE / group.name, group), staged[1] if staged else None, ""
                print("\n".join(table([(r, "") for r in results])[2:]), flush=True)
            else:
                results, run, problem = outcomes[group.name]
            rows += [(r, "") for r in results]
            groups_table.append(group_row(group.name, rev, sum(sum(r.statuses.values()) for r in results), run))
            if problem:
                problems.append(f"{group.name}: {problem}")
    return rows, groups_table, problems, unmeasured


if __name__ == "__main__":
    raise SystemExit(main())
