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
``bench/mutation_equivalent.toml`` (``EQUIVALENT``) with the reason, and leaves the score.

    python -m bench.mutation                  # every group (what `make mutation` runs); exit 1 below the floor
    python -m bench.mutation --only metrics policy --jobs 1
    python -m bench.mutation --write          # also record the figures in docs/benchmarks.md and the
                                              # explained survivors in bench/mutation_explained.md
    python -m bench.mutation --changed-since recorded --write   # the routine run: see below

Runs accumulate: the record (docs/benchmarks.md) has a row per group naming the commit its figures were measured
at, and a run of some groups (``--only``, ``--changed-since``) replaces only their rows and figures, keeping every
other group's as recorded; a group never measured as it is now (a module the record lacks) shows as not measured,
and the verdict falls short until it is. ``--no-run`` re-reports the groups build/mutation/ holds a run of (after
editing bench/mutation_equivalent.toml), each at the commit it was staged at.

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
        ("tests/workload/test_queue.py", "tests/workload/test_queue_items.py", "tests/workload/test_queue_repair.py",
         "tests/workload/test_queue_lost_reply.py", "tests/workload/test_queue_packing.py"),
        jobs_per_core=3,  # leases expire in real time: 10.6 s of tests use 5.4 s of CPU, most of it imports
        cpu_minutes=6.0,
    ),
    Group(
        "checkpoint",
        ("workload/share/checkpoint.py", "workload/share/fsutil.py"),
        ("tests/workload/test_checkpoint.py", "tests/workload/test_checkpoint_rules.py",
         "tests/workload/test_checkpoint_flat.py", "tests/workload/test_atomic_writes.py",
         "tests/workload/test_stale_tmp.py"),
        cpu_minutes=2.1,
    ),
    # The fault tests run the worker as `python -m workload` subprocesses (mutmut cannot map those to
    # functions, and they take minutes each): the test_worker_*_inprocess.py files drive the same code in the pytest
    # process. Not mutated, besides log calls (pyproject.toml): the fault-injection hooks (faults.point, inert
    # unless WORKLOAD_FAULT names the point; the subprocess fault tests fire each one).
    Group(
        "worker",
        ("workload/runtime/worker.py", "workload/runtime/steps.py", "workload/runtime/heartbeat.py",
         "workload/runtime/config.py", "workload/runtime/packing.py"),
        ("tests/workload/test_worker_inprocess.py", "tests/workload/test_worker_leases_inprocess.py",
         "tests/workload/test_worker_restore_inprocess.py", "tests/workload/test_worker_packing_inprocess.py"),
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
        ("workload/data/dayfile.py", "workload/data/rules.py", "workload/data/manifest.py", "workload/data/dataset.py"),
        # test_featurestore.py: what Dataset.ensure_features counts and feature_inputs records for the store.
        ("tests/workload/test_dataset.py", "tests/workload/test_refusal_layers.py", "tests/workload/test_identity.py",
         "tests/workload/test_rare_paths.py", "tests/model/test_featurestore.py", "tests/workload/test_days.py"),
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
         "tests/model/test_window.py", "tests/workload/test_lineage.py", "tests/model/test_gpustep.py"),
        cpu_minutes=15.7,
    ),
    # The GPU-shaped step and the packed sweep (issue 33): the same function runs eagerly on CPU, where the tests
    # compare it with the trainer; the CUDA-only lines (recording, replay, where a tensor is made) are exercised only
    # by the tests that skip without a GPU, so their mutants survive on CPU and are explained (CPU_ONLY) in
    # bench/mutation_equivalent.toml. Its first whole run took 71 CPU min at one mutant at once.
    Group(
        "gpustep",
        ("workload/model/gpustep.py", "workload/model/packed.py"),
        ("tests/model/test_gpustep.py", "tests/model/test_packed.py"),
        cpu_minutes=71.0,
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
    # test_infra_redis.py, test_infra_platform.py and test_infra_workloads.py, through infra.program's own wiring
    # (tests/infra/components.py; a mutant costs a component build, not whole-stack renders); with them the
    # names they share with the worker and the policy pack (contract.py). Two groups of about half the
    # mutants each (1,715 took 45.4 min on one lane together): the Jobs and what they mount, and the rest.
    Group(
        "infra",
        tuple(f"infra/{m}.py" for m in ("filestore", "gpu", "identity", "network", "redis", "platform",
                                         "network_policy")),
        ("tests/infra/test_infra_redis.py", "tests/infra/test_infra_platform.py", "tests/test_contract.py",
         "tests/infra/test_infra_network_policy.py", "tests/infra/test_infra_hardening.py"),
        do_not_mutate_patterns=(REGISTER_OUTPUTS,),
        cpu_minutes=18.0,
    ),
    Group(
        "jobs",
        tuple(f"infra/{m}.py" for m in ("jobs", "share_prep", "contract")),
        # The scoring Job is built only with an output bucket: test_infra_scoring.py renders it.
        ("tests/infra/test_infra_workloads.py", "tests/infra/test_infra_platform.py", "tests/test_contract.py",
         "tests/infra/test_infra_scoring.py"),
        do_not_mutate_patterns=(REGISTER_OUTPUTS,),
        cpu_minutes=19.0,
    ),
    # The stack as a whole: the GKE cluster and node pools, the enabled APIs and the image build (arguments only a
    # real `pulumi up` judges in full; test_infra_stack.py renders every stack and checks them), and program.py,
    # which composes the components. Whole-stack renders: seconds per mutant.
    Group(
        "stack",
        tuple(f"infra/{m}.py" for m in ("cluster", "services", "image", "program", "perimeter")),
        ("tests/infra/test_infra_stack.py", "tests/infra/test_infra_data.py", "tests/infra/test_infra_share.py",
         "tests/infra/test_infra_schedule.py", "tests/infra/test_infra_hardening.py",
         "tests/infra/test_infra_network_policy.py", "tests/infra/test_infra_perimeter.py"),
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
    # binauthz: the stack's attestor, key, note and the project's policy, and the attestation of each image it runs.
    Group(
        "binauthz",
        ("infra/binauthz.py",),
        ("tests/infra/test_infra_binauthz.py",),
        do_not_mutate_patterns=(REGISTER_OUTPUTS,),
    ),
    # schedule: the loader's and the launcher's CronJobs, the training and scoring Jobs the launcher may post, the
    # rights it needs to post them and the admission policy that admits only those (infra/admission.py).
    Group(
        "schedule",
        ("infra/schedule.py", "infra/admission.py"),
        ("tests/infra/test_infra_schedule.py", "tests/infra/test_admission_cel.py"),
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
        ("tests/infra/test_infra_config.py", "tests/infra/test_infra_config_rules.py",
         "tests/infra/test_infra_schedule.py"),
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
    # The daily cycle's rules (roles by the rule, versions of a day, scored days retired): driven through `seed`,
    # the worker and `score` in-process, a week of nights against a real Redis.
    Group(
        "cycle",
        ("workload/data/cycle.py",),
        ("tests/workload/test_daily_cycle.py",),
        cpu_minutes=3.0,
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
        ("tests/workload/test_plan.py", "tests/workload/test_restore.py", "tests/workload/test_plan_records.py",
         "tests/workload/test_plan_stray.py"),
    ),
    Group(
        "hparams",
        ("workload/model/hparams.py",),
        ("tests/workload/test_hparams.py", "tests/workload/test_trainer.py", "tests/infra/test_infra_config.py"),
    ),
    Group(
        "report",
        ("workload/model/report.py", "workload/model/plots.py", "workload/model/report_html.py"),
        ("tests/workload/test_report.py", "tests/model/test_plots.py", "tests/workload/test_report_page.py"),
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
    # launch: the launcher's decisions to start the training and scoring Jobs, its API call (against an HTTPS
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
    "infra/kube.py": "one frozen dataclass (where Kubernetes objects go): no function for mutmut to mutate",
    "infra/gke.py": ("constants only: GKE's label and resource names, shared with the policy pack; mutmut mutates "
                     "functions, and the component tests (test_infra_platform.py) and the policy tests check the names "
                     "in use"),
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


# The rules live in a data file beside this one: hundreds of one-line reasons, edited by hand; loaded and checked
# once, at import (test_mutation_equivalent.py checks every entry).
EQUIVALENT_FILE = Path(__file__).resolve().parent / "mutation_equivalent.toml"
_ENTRY_KEYS = {"module", "before", "after", "why", "reason"}


def load_equivalent(path: Path = EQUIVALENT_FILE) -> tuple[Equivalent, ...]:
    """Every rule of `path`, one per `after` of each entry, in the file's order; ValueError naming the entry and
    what is wrong with it when one is malformed."""
    data = tomllib.loads(path.read_text())
    reasons = data.get("reasons", {})
    if not isinstance(reasons, dict) or not all(isinstance(v, str) and v for v in reasons.values()):
        raise ValueError(f"{path}: [reasons] must map names to non-empty texts")
    if set(data) - {"reasons", "equivalent"}:
        raise ValueError(f"{path}: unknown table(s) {sorted(set(data) - {'reasons', 'equivalent'})}")
    return tuple(rule for i, entry in enumerate(data.get("equivalent", []), 1)
                 for rule in _rules(entry, reasons, f"{path}: entry {i}"))


def _rules(entry: dict, reasons: dict[str, str], where: str) -> list[Equivalent]:
    """One entry's rules: `after` is one text or a list; `why` is given, or `reason` names a shared one."""
    extra = set(entry) - _ENTRY_KEYS
    if extra:
        raise ValueError(f"{where}: unknown key(s) {sorted(extra)}; an entry has {sorted(_ENTRY_KEYS)}")
    if not (isinstance(entry.get("module"), str) and entry["module"]):
        raise ValueError(f"{where}: module must be a path (or '*'), got {entry.get('module')!r}")
    if not (isinstance(entry.get("before"), str) and entry["before"]):
        raise ValueError(f"{where}: before must be the non-empty text mutmut changed, got {entry.get('before')!r}")
    afters = entry.get("after")
    afters = [afters] if isinstance(afters, str) else afters
    if not (isinstance(afters, list) and afters and all(isinstance(a, str) for a in afters)):
        raise ValueError(f"{where}: after must be a text or a non-empty list of texts, got {entry.get('after')!r}")
    if ("why" in entry) == ("reason" in entry):
        raise ValueError(f"{where}: give exactly one of why (a text) and reason (a name in [reasons])")
    why = entry["why"] if "why" in entry else reasons.get(entry["reason"], "")
    if not (isinstance(why, str) and why):
        raise ValueError(f"{where}: reason {entry.get('reason')!r} is not in [reasons]" if "reason" in entry
                         else f"{where}: why must be a non-empty text, got {why!r}")
    return [Equivalent(entry["module"], entry["before"], after, why) for after in afters]


EQUIVALENT: tuple[Equivalent, ...] = load_equivalent()

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
        f"{measured} Each mutant below survived the tests, and a rule of bench/mutation_equivalent.toml "
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--only", nargs="+", choices=[g.name for g in GROUPS], help="groups to run (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                        help="mutants tested at once (default: one per core), shared by the lanes running, times "
                        "a group's jobs_per_core")
    parser.add_argument("--lanes", type=int, default=2, help="groups run at once (1: one after the other)")
    parser.add_argument("--write", action="store_true", help="record the figures in docs/benchmarks.md")
    parser.add_argument("--floor", type=float, default=FLOOR, help="lowest acceptable score, percent")
    parser.add_argument("--no-run", action="store_true",
                        help="report the last run from build/mutation/ (after editing mutation_equivalent.toml, or "
                             "to --write)")
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
              "explain in bench/mutation_equivalent.toml.", *survivor_lines(survivors)]
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
