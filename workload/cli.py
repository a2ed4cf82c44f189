"""Command line (also the container entrypoint): seed, launch, worker, status, requeue, export, score,
wait-drained, local.

Every flag the Kubernetes Jobs use has an environment variable, so a Job configures the same code by env;
`--help` on each command names them, with defaults and an example.
The Redis password is read from REDIS_PASSWORD only: never a flag, never logged. Exit codes are
workload.core.errors' (0 done, 2 bad configuration, 3 infrastructure, 4 dead letters, 5 stalled, 143 SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from workload.core import preemption
from workload.core.errors import (
    EXIT_BAD_CONFIG,
    EXIT_DEAD_LETTERS,
    EXIT_DONE,
    EXIT_GPU_UNUSABLE,
    EXIT_INFRA,
    EXIT_TERMINATED,
)
from workload.data import dataset as ds
from workload.data import publish, reading, simulator, source
from workload.data.cycle import Cycle
from workload.data.dayfile import SCORING, DatasetError
from workload.data.manifest import MANIFEST, read_manifest
from workload.model import report
from workload.model.hparams import HParams, parse_runs
from workload.queue import plan
from workload.queue.workqueue import CALL_TIMEOUT_S, QueueInterrupted, QueueUnavailable, WorkQueue, connect
from workload.runtime import launch
from workload.share.fsutil import clean_stale_tmp, tmp_dir_for
from workload.share.paths import NAME, REPORT_TXT, check_name, share_paths

if TYPE_CHECKING:
    from workload.runtime.worker import WorkerConfig

log = logging.getLogger("workload")

DEFAULT_DATASET = "fraud"
DEFAULT_RUN = "main"


class UsageError(Exception):
    """Bad configuration: exit 2 with a message naming the flag/variable, the value and what is allowed."""


def env(name: str, default: Any = None) -> Any:
    return os.environ.get(name, default)


def setup_logging(worker_id: str | None = None) -> None:
    who = f" [{worker_id}]" if worker_id else ""
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO").upper(), stream=sys.stderr, force=True,
                        format=f"%(asctime)s %(levelname)s %(name)s{who}: %(message)s")


class FromEnv(str):
    """A flag's default read from the environment, as text: argparse converts a string default with the flag's
    ``type`` when the flag is not given, so a bad variable is a usage error (exit 2) naming the variable, as a bad
    flag is, not a traceback from converting it while the parser is built."""

    variable: str

    def __new__(cls, variable: str, default: str | None = None) -> Any:
        text = env(variable, default)
        if text is None:
            return None
        made = super().__new__(cls, text)
        made.variable = variable
        return made


KIND_WORDS = {int: "an integer", float: "a number"}


def positive(kind: type, what: str) -> Any:
    def parse(text: str) -> Any:
        # From the environment (FromEnv, unless its default was taken): the variable is what the user set.
        said = f"env {text.variable}" if isinstance(text, FromEnv) else what
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{said} must be {KIND_WORDS[kind]}, got {text!r}") from None
        if not value > 0:  # NaN too: every comparison with it is False, so `<= 0` would let it through
            raise argparse.ArgumentTypeError(f"{said} must be > 0, got {text!r}")
        return value
    return parse


def add_share(p: argparse.ArgumentParser) -> None:
    p.add_argument("--share", type=Path, default=Path(env("SHARE_DIR", "/mnt/share")),
                   help="the shared volume: datasets/, runs/, output/ (env SHARE_DIR; default /mnt/share)")


def add_redis(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis-url", default=env("REDIS_URL", "redis://localhost:6379/0"),
                   help="Redis URL without the password, which comes from env REDIS_PASSWORD only "
                        "(env REDIS_URL; default redis://localhost:6379/0)")
    p.add_argument("--queue-prefix", default=env("QUEUE_PREFIX", "spottrain"),
                   help="prefix of the queue's Redis keys (env QUEUE_PREFIX; default spottrain)")


def add_attempts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-attempts", type=positive(int, "--max-attempts"), default=FromEnv("MAX_ATTEMPTS", "5"),
                   help="failed attempts before an item is dead-lettered (env MAX_ATTEMPTS; default 5)")


def env_seconds(name: str, default: float) -> float:
    text = env(name)
    try:
        value = float(text) if text is not None else default
    except ValueError:
        raise UsageError(f"{name}={text!r} is not a number of seconds") from None
    if not value > 0:  # NaN too
        raise UsageError(f"{name}={text!r} is not allowed: it must be > 0")
    return value


def make_queue(args: argparse.Namespace, password: str | None = None, retry_for_s: float | None = None,
               call_timeout_s: float = CALL_TIMEOUT_S) -> WorkQueue:
    retry = retry_for_s if retry_for_s is not None else env_seconds("REDIS_RETRY_SECONDS", 300)
    return WorkQueue(connect(args.redis_url, password or env("REDIS_PASSWORD"), timeout_s=call_timeout_s),
                     args.queue_prefix, max_attempts=getattr(args, "max_attempts", 5), retry_for_s=retry)


# -- seed -------------------------------------------------------------------------------------------
def load_runs(args: argparse.Namespace) -> dict[str, HParams]:
    """The runs to seed: --runs-file's sweep plus --run names (default hyperparameters), or 'main'."""
    specs: dict[str, Any] = {}
    where = "--run"
    if args.runs_file:
        where = f"--runs-file {args.runs_file}"
        try:
            loaded = json.loads(Path(args.runs_file).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"{where}: cannot read it as JSON {{run name: {{hyperparameters}}}}: {exc}") from exc
        if not isinstance(loaded, dict) or not loaded:  # never the default run in place of a sweep
            raise UsageError(f"{where}: expected a non-empty object {{run name: {{hyperparameters}}}}, "
                             f"got {json.dumps(loaded)[:80]}")
        specs.update(loaded)
    for name in args.run or []:
        specs.setdefault(name, {})
    try:
        return parse_runs(specs or {DEFAULT_RUN: {}}, where)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def simulation_spec(args: argparse.Namespace) -> simulator.SimulationSpec:
    if args.preset not in simulator.PRESETS:
        raise UsageError(f"--preset {args.preset!r} is unknown; allowed: {sorted(simulator.PRESETS)}")
    spec = simulator.PRESETS[args.preset]
    overrides = {k: getattr(args, k) for k in ("customers", "terminals", "train_days", "test_days", "start_date")
                 if getattr(args, k) is not None}
    if args.sim_seed is not None:
        overrides["seed"] = args.sim_seed
    return replace(spec, **overrides)


def simulated_source(spec: simulator.SimulationSpec) -> str:
    """The source a simulated dataset records: the simulator and every parameter of the draw."""
    return "simulator:" + ",".join(f"{k}={v}" for k, v in asdict(spec).items())


def data_reading(args: argparse.Namespace) -> reading.Reading:
    """How the user's files are read: `--columns FILE` (else env DATASET_COLUMNS, the mapping itself as
    JSON: the stack's setting), `--datetime-format` (else env DATASET_DATETIME_FORMAT) and `--timezone`
    (else env DATASET_TIMEZONE)."""
    try:
        inline = None if args.columns else env("DATASET_COLUMNS")
        return reading.reading(args.columns, args.datetime_format, timezone=getattr(args, "timezone", None),
                               inline=json.loads(inline) if inline else None)
    except ValueError as exc:  # ReadingError, or DATASET_COLUMNS that is not JSON
        raise UsageError(str(exc) if isinstance(exc, reading.ReadingError) else
                         f"DATASET_COLUMNS: not a JSON mapping of your column names to ours ({exc})") from None


def add_reading(p: argparse.ArgumentParser) -> None:
    p.add_argument("--columns",
                   help="YAML or JSON file mapping your column names to ours, e.g. {card_id: CUSTOMER_ID, ts: "
                        "TX_DATETIME} (env DATASET_COLUMNS holds the mapping itself as JSON; default: our names)")
    p.add_argument("--datetime-format", default=env("DATASET_DATETIME_FORMAT"),
                   help="how your timestamps are written when not ISO 8601, e.g. '%%d/%%m/%%Y %%H:%%M', or epoch-s / "
                        "epoch-ms for numbers; dates are never guessed (env DATASET_DATETIME_FORMAT; default: "
                        "ISO 8601 only)")
    p.add_argument("--timezone", default=env("DATASET_TIMEZONE"),
                   help="the zone your timestamps without an offset are local times in (Europe/Berlin; or UTC), and "
                        "whose calendar days are the dataset's days; a mapped export must declare it (env "
                        "DATASET_TIMEZONE; default: the mapping file's timezone, else UTC for our own column names)")


def place_dataset(args: argparse.Namespace, root: Path) -> int:
    """Publish the dataset from `--datasets` (a folder or gs://bucket/prefix) or simulate it (see
    workload.data.publish for the rules: one source per dataset, immutable days, appended new days).
    Returns how many scoring/ days this publish added (the simulator makes none)."""
    window = int(args.test_window) if args.test_window else None
    if args.datasets:
        outcome = publish.publish(root, source.open_source(args.datasets), data_reading(args),
                                  cycle=Cycle(window) if window else None)
        log.info("synced %s into %s: %d file(s) copied, %d unchanged", outcome.source, root, len(outcome.copied),
                 outcome.unchanged)
        return sum(rel.startswith(f"{SCORING}/") for rel in outcome.copied)
    if window:
        raise UsageError("--test-window: the daily cycle needs your days (--datasets); the simulator's test days "
                         "are a fixed holdout (--test-days)")
    spec = simulation_spec(args)
    uri = simulated_source(spec)
    if (root / MANIFEST).exists():
        recorded = publish.recorded_source(root)
        if recorded is None:  # laid out by hand before sources were recorded
            log.info("dataset %s is already on the share: not touching it", root)
            return 0
        publish.check_source(root, read_manifest(root), uri)
        log.info("dataset %s (%s) is already on the share", root, uri)
        return 0
    log.info("simulating transactions: %s", spec)
    started = time.monotonic()
    # Named for this host and process, so the next seed can tell a killed seeder's leftovers from a live one's.
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=tmp_dir_for(root).name + "-") as tmp:
        simulator.generate(Path(tmp), spec)
        log.info("simulated %d days in %.1fs", spec.train_days + spec.test_days, time.monotonic() - started)
        publish.publish(root, source.LocalSource(Path(tmp), uri=uri))
    return 0


def store_features(root: Path) -> None:
    """Every training and testing day's features, computed here once (on the loader's CPU) and
    stored next to the day, so that no GPU worker of any run computes them."""
    from workload.data import features

    started = time.monotonic()
    computed, kept = ds.Dataset(root).ensure_features()
    log.info("features (version %s): %d day(s) computed in %.1fs, %d already stored", features.FEATURE_VERSION,
             computed, time.monotonic() - started, kept)


def _history_days(root: Path) -> set[str] | None:
    """The history/ days of a published dataset; None before its first publish."""
    if not (root / MANIFEST).exists():
        return None
    return {f["path"] for f in read_manifest(root)["files"] if f.get("role") == "history"}


def late_history(share: Path, name: str, new: set[str]) -> None:
    """History days published after a run trained days whose feature windows read them: those days' features
    change (recomputed), the run's model does not (nothing retrains). Said in one line per run, with the fix."""
    if not new:
        return
    from workload.model import lineage  # torch: only when history arrived late

    dataset = ds.Dataset(share_paths(share)[0] / name)
    affected = [d for d in dataset.training_shards() if any(f["path"] in new for f in dataset.feature_inputs(d))]
    for run, spec in plan.live(share).items():
        trained = set(lineage.applied_days(share_paths(share)[1] / run)) if spec.dataset == name else set()
        days = [d for d in affected if d in trained]
        if days:
            log.warning("run %s trained %d day(s) (%s) before history day(s) %s that their feature windows read were "
                        "published: those days' features changed, this run's model did not (nothing retrains). To "
                        "train with them, seed the same hyperparameters under a new run name", run, len(days),
                        ", ".join(days[:3]) + (f" and {len(days) - 3} more" if len(days) > 3 else ""),
                        ", ".join(sorted(new)))


def seed(args: argparse.Namespace) -> int:
    runs = load_runs(args)
    name = args.dataset
    try:
        check_name(name, "--dataset")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    datasets_dir, _ = share_paths(args.share)
    datasets_dir.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(datasets_dir)  # a seeder killed mid-simulation left its temporary folder behind
    history = _history_days(datasets_dir / name)
    new_scoring = place_dataset(args, datasets_dir / name)
    store_features(datasets_dir / name)
    if history is not None:
        late_history(args.share, name, _history_days(datasets_dir / name) - history)
    queue = make_queue(args)
    for run, hp in runs.items():
        try:
            plan.record(args.share, plan.RunSpec(run=run, dataset=name, hparams=hp.to_dict()))
            queue.put_spec(run, hp.to_dict())
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    # Every recorded run, not only those named now: days appended to a dataset reach every run.
    items = plan.items(args.share)
    added = queue.enqueue(items)
    superseded = queue.mark_done(plan.retired_items(args.share))
    if superseded:  # the daily cycle: a day's new version arrived before its old one was trained
        log.info("%d queued item(s) of day versions that new labels replaced: marked done, their new versions "
                 "are queued", superseded)
    queue.mark_seeded()
    c = queue.counts()
    log.info("queued %d new item(s) (%d already known) for run(s) %s; queue: %d pending, %d leased, %d done, "
             "%d dead", added, len(items) - added, ", ".join(runs), c.pending, c.leased, c.done, c.dead)
    if args.request_launch:  # the scheduled loader: the launcher reads what it added (infra/schedule.py)
        queue.request_launch(added, new_scoring)
        log.info("launch requested: %d new item(s), %d new scoring day(s)", added, new_scoring)
    return 0


def launch_jobs(args: argparse.Namespace) -> int:
    """The launcher's pod (infra/schedule.py): the scheduled load's request in, the Jobs out."""
    launch.run(make_queue(args), Path(args.job), Path(args.scoring) if args.scoring else None, args.stack_job,
               args.load_wait, args.drain_timeout, args.poll)
    return 0


def wait_drained(args: argparse.Namespace) -> int:
    """The scoring pod's first step: the newest models are the ones trained from every day of the share's plan."""
    drained = launch.wait_drained(make_queue(args), args.share, args.timeout, args.poll)
    return 0 if drained else EXIT_INFRA


# -- worker -----------------------------------------------------------------------------------------
def worker_config(args: argparse.Namespace) -> WorkerConfig:
    from workload.runtime.worker import WorkerConfig, default_worker_id  # torch: only workers pay for it

    try:
        return WorkerConfig(
            share=args.share, redis_url=args.redis_url, redis_password=env("REDIS_PASSWORD"),
            prefix=args.queue_prefix, worker_id=args.worker_id or default_worker_id(),
            lease_ttl_s=args.lease_ttl, checkpoint_interval_s=args.checkpoint_interval,
            max_attempts=args.max_attempts, redis_retry_s=env_seconds("REDIS_RETRY_SECONDS", 300),
            plot_interval_s=env_seconds("PLOT_INTERVAL_SECONDS", 30),
            infra_give_up_s=env_seconds("INFRA_GIVE_UP_SECONDS", 300),
            stall_s=env_seconds("STALL_SECONDS", 300), pack_runs=args.pack,
            term_grace_s=env_seconds("TERM_GRACE_SECONDS", preemption.STOP_WITHIN_S))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def worker(args: argparse.Namespace) -> int:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from workload.model import gpustep

    gpustep.STEPS_PER_REPLAY = args.steps_per_replay  # this process's CUDA step (the CPU's trains as ever)
    from workload.runtime import gpu
    from workload.runtime.worker import Worker

    cfg = worker_config(args)
    setup_logging(cfg.worker_id)
    unusable = gpu.unusable_reason()
    if unusable:  # before any claim: a GPU pod never trains on its CPU
        print(f"error: {unusable}", file=sys.stderr)
        return EXIT_GPU_UNUSABLE
    w = Worker(cfg, make_queue(args, retry_for_s=cfg.redis_retry_s))
    w.install_signal_handlers()
    return w.run()


# -- status -----------------------------------------------------------------------------------------
STATUS_RETRY_S = 3.0  # status is for a person at a terminal: fail fast when Redis is unreachable
STATUS_CALL_TIMEOUT_S = 0.75  # ... or frozen: the client tries each call 4 times, so about 3.5 s in all


def status(args: argparse.Namespace) -> int:
    if not args.dir:
        return print_status(args, None)
    # A `make local` folder: its running Redis and share, or a finished one's, read from its AOF.
    from workload.runtime.local import LocalNotRunning, reopened

    try:
        with reopened(args.dir) as conn:
            args.redis_url, args.share = conn.url, conn.share
            if not conn.running:
                print(f"(the `local` in {args.dir} has ended: read from its folder)")
            return print_status(args, conn.password)
    except LocalNotRunning as exc:
        raise UsageError(str(exc)) from None


def print_status(args: argparse.Namespace, password: str | None) -> int:
    queue = make_queue(args, password, STATUS_RETRY_S, STATUS_CALL_TIMEOUT_S)
    snap = queue.snapshot()
    c = queue.counts()
    out = [f"queue {args.queue_prefix}: {c.total} items: {c.pending} pending, {c.leased} leased, {c.done} done, "
           f"{c.dead} dead-lettered" + ("  (drained)" if c.drained else "")]
    _, output_dir = share_paths(args.share)
    truth = _truth(queue, args.share)
    for run, r in snap["runs"].items():
        out.append(f"run {run}: {_applied(run, r, truth, output_dir)}, {len(r['pending'])} pending, "
                   f"{len(r['dead'])} dead-lettered")
        if r["lease"]:
            left = (int(r["lease"]["deadline"]) - snap["now_ms"]) / 1000
            when = f"expires in {left:.1f}s" if left >= 0 else f"EXPIRED {-left:.1f}s ago (a claim will reap it)"
            out.append(f"  leased: {r['lease']['item']} by {r['lease']['owner']} (token {r['lease']['token']}), "
                       f"lease {when}")
        for item, d in r["dead"].items():
            out.append(f"  dead: {item} after {d['attempts']} attempt(s): {d['error']}")
        for item, err in r["errors"].items():
            if item not in r["dead"]:
                out.append(f"  retrying: {item} ({r['attempts'].get(item, 0)} failed): {err}")
        m = report.latest_metrics(output_dir / run) if NAME.match(run) else None  # a hostile name: no path
        if m:
            out.append(f"  latest: after {m['shard']}: {report.figures_line(m)}")
            out.append(f"  report: {output_dir / run / REPORT_TXT}")
    try:
        out.append(plan.gap(queue, args.share).line())
    except (plan.PlanError, DatasetError) as exc:
        out.append(f"share vs queue: cannot read the share's plan: {exc}")
    if truth is not None and truth.line():
        out.append(truth.line())
    if c.drained and not queue.seeded():
        out.append("the queue was never seeded (or Redis lost its data): a worker restores it from the share's "
                   "run records, or run `python -m workload seed`")
    print("\n".join(out))
    return 0


def _truth(queue: WorkQueue, share: Path) -> plan.Truth | None:
    """Redis's done days against the share's newest checkpoints; None when the share's plan cannot be read
    (the gap line says why)."""
    from workload.model import lineage  # torch: status reads the checkpoints' applied lists

    try:
        return plan.truth(queue, share, lineage.applied_days)
    except (plan.PlanError, DatasetError):
        return None


def _applied(run: str, r: dict[str, Any], truth: plan.Truth | None, output_dir: Path) -> str:
    """A run's days applied as its newest checkpoint on the share records them (the truth), not Redis's done."""
    if truth is not None and run in truth.applied:
        applied, total = truth.applied[run], truth.planned[run]
    else:  # no run record on the share: its checkpoint's days against the items Redis holds
        from workload.model import lineage

        applied, total = (len(lineage.applied_days(output_dir / run)) if NAME.match(run) else 0), r["total"]
    return f"{applied}/{total} shards applied" + (f" (Redis calls {r['done']} done)" if r["done"] != applied else "")


# -- requeue ----------------------------------------------------------------------------------------
def requeue(args: argparse.Namespace) -> int:
    """Dead letters back to pending, attempts reset: after fixing a day's file or a run's spec."""
    queue = make_queue(args, retry_for_s=STATUS_RETRY_S)
    if args.item and args.run and not args.item.startswith(args.run + "/"):
        raise UsageError(f"--item {args.item!r} is not an item of --run {args.run!r} (item ids are <run>/<shard>)")
    before = {item: d for r in queue.snapshot()["runs"].values() for item, d in r["dead"].items()}
    ids = queue.requeue(run=args.run, item_id=args.item)
    scope = f"item {args.item}" if args.item else f"run {args.run}" if args.run else "all runs"
    if not ids:
        print(f"no dead-lettered items to requeue in {scope} ({len(before)} dead-lettered in total)")
        return EXIT_DEAD_LETTERS if args.item else EXIT_DONE
    print(f"requeued {len(ids)} dead-lettered item(s) in {scope}, attempts reset:")
    for i in ids:
        print(f"  {i} (was: {before.get(i, {}).get('error', '?')})")
    left = [i for i in before if i not in ids]
    if left:
        print(f"{len(left)} still dead-lettered (malformed, or outside the selection): {', '.join(left[:5])}"
              + (" ..." if len(left) > 5 else ""))
    return EXIT_DONE


# -- export, score ---------------------------------------------------------------------------------
def export_cmd(args: argparse.Namespace) -> int:
    from workload.model import export  # torch: only those who export pay for it

    if not args.to:
        raise UsageError("--to is required (or env OUTPUT_URI): a folder, or gs://bucket/prefix")
    try:
        where = export.export_run(args.share, args.run, args.to)
    except (export.ExportError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--share {args.share}: cannot read run {args.run!r} ({exc})") from None
    print(where)
    return 0


def score_cmd(args: argparse.Namespace) -> int:
    from workload.model import export, score  # torch: only those who score pay for it

    how = data_reading(args)
    try:
        score.score_dataset(args.model, args.datasets, args.out, args.days, how, args.allow_short_history)
    except (score.ScoreError, export.ModelFileError) as exc:
        raise UsageError(str(exc)) from None
    except score.OutputUnreachable as exc:
        log.error("%s", exc)
        return EXIT_INFRA
    except OSError as exc:  # an unreadable data file: the message names it
        raise UsageError(f"--datasets {args.datasets}: {exc.strerror or exc}") from None
    return 0


# -- parser -----------------------------------------------------------------------------------------
def _sub(sub: Any, name: str, summary: str, example: str, more: str = "") -> argparse.ArgumentParser:
    """A subcommand whose --help says what it does (`summary`, then `more`) and ends with one example."""
    description = textwrap.fill(f"{summary}. {more}".strip(), 100, break_on_hyphens=False)
    return sub.add_parser(name, help=summary, description=description, epilog=f"example:\n  {example}",
                          formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)


def add_score(sub: Any) -> None:
    """The `score` command: the contract the cloud's scoring Job calls (see workload.model.score)."""
    sc = _sub(sub, "score", "score transactions with a trained model (the worker's features and history windows) "
              "and write the transaction and card IDs, the timestamp (in your column names), score, the rank within "
              "its calendar day and the alert columns to Parquet or CSV",
              "python -m workload score --model results/main/model.safetensors --datasets gs://acme/exports "
              "--out gs://acme-results/scores/")
    sc.add_argument("--model", type=Path, required=True,
                    help="a model.safetensors written by `export`, or a run's output folder on the share "
                         "(SHARE/output/RUN: its newest finished checkpoint, read only) (no env; required)")
    sc.add_argument("--datasets", required=True,
                    help="a folder laid out as for seed (scoring/ holds the unlabelled days), gs://bucket/prefix, "
                         "or a dataset on the share (SHARE/datasets/NAME); every earlier day feeds the feature "
                         "windows (no env; required)")
    sc.add_argument("--out", default="scores.parquet",
                    help="a .parquet or .csv file, or a folder ending in / for one Parquet file per scored day; "
                         "local or gs:// (no env; default scores.parquet)")
    sc.add_argument("--allow-short-history", action="store_true",
                    help="score a day that has no earlier day for its feature history, with a warning (no env; "
                         "default False: refused; a history shorter than the features' window is warned of)")
    sc.add_argument("--days", choices=("scoring", "testing", "all"), default="scoring",
                    help="which days to score: scoring (the unlabelled scoring/ days), testing, or all "
                         "(no env; default scoring)")
    add_reading(sc)
    sc.set_defaults(fn=score_cmd)


def parser() -> argparse.ArgumentParser:
    # The docstring's first paragraph (every command); no abbreviations: `--dataset x` is never `--datasets x`.
    p = argparse.ArgumentParser(prog="python -m workload", description=" ".join(__doc__.split("\n\n")[0].split()),
                                allow_abbrev=False,
                                epilog="`python -m workload COMMAND --help` explains each command, with an example. "
                                       "LOG_LEVEL (default INFO) sets the log level of every command.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_seed(sub)
    add_launch(sub)
    add_worker(sub)
    add_status(sub)
    add_requeue(sub)
    add_export(sub)
    add_score(sub)
    add_wait_drained(sub)
    add_local(sub)
    return p


def add_seed(sub: Any) -> None:
    """`seed`: the dataset source and how it is read, the runs, the simulator's knobs."""
    s = _sub(sub, "seed", "put the dataset on the share and enqueue one item per (run, training day); idempotent",
             "python -m workload seed --runs-file sweep.json --datasets ./data --dataset fraud")
    add_share(s)
    add_redis(s)
    s.add_argument("--run", action="append",
                   help="run name, repeatable; with default hyperparameters (no env; default: 'main' when "
                        "neither --run nor --runs-file is given)")
    s.add_argument("--runs-file", default=env("RUNS_FILE"),
                   help='JSON {run name: {hyperparameters}}, e.g. {"main": {}, "wide": {"hidden": [128, 64]}} '
                        "(env RUNS_FILE; default none)")
    s.add_argument("--datasets", default=env("DATASETS_SRC"),
                   help="publish the dataset from this folder or gs://bucket/prefix (history/, training/, "
                        "testing/ of *.parquet|*.csv; new days are added on the next seed) instead of "
                        "simulating (env DATASETS_SRC; default none: simulate --preset)")
    add_reading(s)
    s.add_argument("--test-window", type=positive(int, "--test-window"), default=env("DATASET_TEST_WINDOW"),
                   help="the daily cycle: the newest N labelled days of --datasets test and older ones train, so "
                        "each night's new day moves the window (every labelled day in training/, no testing/); "
                        "late labels for a day publish a new version of it and re-train from it. Recorded with "
                        "the dataset (env DATASET_TEST_WINDOW; default none: testing/ is a fixed holdout)")
    s.add_argument("--dataset", default=env("DATASET", DEFAULT_DATASET),
                   help=f"dataset name on the share (env DATASET; default {DEFAULT_DATASET})")
    s.add_argument("--preset", default=env("DATASET_PRESET", "small"),
                   help=f"simulator preset when --datasets is not given: {', '.join(simulator.PRESETS)} "
                        "(env DATASET_PRESET; default small)")
    for flag, kind in (("customers", int), ("terminals", int), ("train-days", int), ("test-days", int)):
        s.add_argument(f"--{flag}", type=positive(kind, f"--{flag}"),
                       help="override the preset's number of " + flag.replace("-", " ") + " (no env; default: the "
                            "preset's)")
    s.add_argument("--start-date", help="first simulated day, YYYY-MM-DD (no env; default: the preset's)")
    s.add_argument("--sim-seed", type=int, help="simulator seed (no env; default: the preset's)")
    s.add_argument("--request-launch", action="store_true",
                   help="after enqueueing, record in Redis what this load added, for `launch` (no env; default "
                        "False; the scheduled loader's)")
    s.set_defaults(fn=seed)


def add_launch(sub: Any) -> None:
    """`launch`: the scheduled launcher's pod (infra/schedule.py)."""
    la = _sub(sub, "launch", "wait for a scheduled load's request in Redis, then create the training Job when there is "
              "work and the stack's training Job is not running, and the scoring Job when there is something new "
              "to score, once the queue is drained",
              "python -m workload launch --job /etc/launch/job.json --stack-job spot-trainer-worker",
              more="Runs in a pod: the Jobs are created through the pod's Kubernetes API with its service account.")
    add_redis(la)
    la.add_argument("--job", required=True, help="the training Job to create (a JSON manifest; no env; required)")
    la.add_argument("--scoring", help="the scoring Job to create (a JSON manifest; no env; default none: no scoring)")
    la.add_argument("--stack-job", help="the stack's own training Job: while it runs no second one is created (no "
                                        "env; default none)")
    la.add_argument("--load-wait", type=positive(float, "--load-wait"), default=3600.0,
                    help="seconds to wait for a load's request before deciding on the queue alone (no env; default "
                         "3600; the schedule passes the loader's deadline)")
    la.add_argument("--drain-timeout", type=positive(float, "--drain-timeout"), default=86400.0,
                    help="seconds to wait for a drained queue before the scoring Job; past it exit 3 and the next "
                         "launch tries again (no env; default 86400)")
    la.add_argument("--poll", type=positive(float, "--poll"), default=5.0,
                    help="seconds between looks at the queue (no env; default 5)")
    la.set_defaults(fn=launch_jobs)


def add_wait_drained(sub: Any) -> None:
    """`wait-drained`: the scoring pod's init step (infra/jobs.py scoring_spec)."""
    w = _sub(sub, "wait-drained", "wait until the queue holds nothing pending or leased and the share's newest "
             "checkpoints hold every day of its plan; exit 0 then, 3 when --timeout passed (a wiped Redis waits for "
             "a worker to restore it) or Redis stayed unreachable",
             "python -m workload wait-drained --timeout 3600")
    add_share(w)
    add_redis(w)
    w.add_argument("--timeout", type=positive(float, "--timeout"), default=3600.0,
                   help="seconds to wait before giving up with exit 3 (no env; default 3600; the scoring Job "
                        "passes the training Job's activeDeadlineSeconds)")
    w.add_argument("--poll", type=positive(float, "--poll"), default=5.0,
                   help="seconds between looks at the queue (no env; default 5)")
    w.set_defaults(fn=wait_drained)


def add_worker(sub: Any) -> None:
    """`worker`: the queue, the share and the lease and checkpoint timings."""
    w = _sub(sub, "worker", "drain the queue: claim, train, checkpoint, report, ack; exit 0 only when every item is "
             "done or dead-lettered",
             "REDIS_PASSWORD=... python -m workload worker --share /mnt/share --redis-url redis://redis:6379/0",
             more="With env OUTPUT_URI set (a folder or gs://bucket/prefix), the worker that acks a run's last "
                  "day exports the run there, as `export` does; a failed export is only a warning.")
    add_share(w)
    add_redis(w)
    add_attempts(w)
    w.add_argument("--worker-id", default=env("WORKER_ID"),
                   help="name in leases and logs (env WORKER_ID; default HOSTNAME-PID)")
    w.add_argument("--lease-ttl", type=positive(float, "--lease-ttl"), default=FromEnv("LEASE_TTL_SECONDS", "30"),
                   help="seconds a lease lives without a heartbeat (env LEASE_TTL_SECONDS; default 30)")
    w.add_argument("--checkpoint-interval", type=positive(float, "--checkpoint-interval"),
                   default=FromEnv("CHECKPOINT_INTERVAL_SECONDS", "10"),
                   help="seconds of training between mid-shard checkpoints (env CHECKPOINT_INTERVAL_SECONDS; "
                        "default 10)")
    w.add_argument("--pack", type=positive(int, "--pack"), default=FromEnv("PACK_RUNS", "1"),
                   help="runs of one day of one dataset (a sweep) leased together and trained as one stacked "
                        "model, each with its own lease, checkpoints, report and ack; 1 trains one item at a time "
                        "(env PACK_RUNS; default 1; a GPU default is not yet measured)")
    w.add_argument("--steps-per-replay", type=positive(int, "--steps-per-replay"),
                   default=FromEnv("STEPS_PER_REPLAY", "1"),
                   help="on CUDA, full batches one replay of the captured step trains (the same steps, the host "
                        "asked once a replay: fewer kernels a step); ignored on CPU (env STEPS_PER_REPLAY; default 1 "
                        "until a GPU has measured more)")
    w.add_argument("--threads", type=positive(int, "--threads"), default=FromEnv("TORCH_THREADS"),
                   help="torch CPU threads (env TORCH_THREADS; default: torch's choice)")
    w.set_defaults(fn=worker)


def add_status(sub: Any) -> None:
    """`status`: a queue's summary, from its address or a `make local` folder."""
    st = _sub(sub, "status", "the queue per run: pending, leased (by whom, until when), done, dead-lettered, "
              "latest test figures", "python -m workload status --dir local    # a `make local`'s, running or ended")
    add_share(st)
    add_redis(st)
    st.add_argument("--dir", type=Path,
                    help="the folder of a `python -m workload local` (`make local`: local), running or ended: use "
                         "its Redis and share instead of --redis-url/--share (no env; default none)")
    st.set_defaults(fn=status)


def add_requeue(sub: Any) -> None:
    """`requeue`: dead letters back to pending, all or some."""
    rq = _sub(sub, "requeue", "put dead-lettered items back to pending with their attempts reset, and print them",
              "python -m workload requeue --run main    # after fixing the day files `status` named")
    add_redis(rq)
    rq.add_argument("--run", help="only this run's dead letters (no env; default: every run)")
    rq.add_argument("--item", help="only this item, <run>/<shard> as `status` prints it (no env; default: all)")
    rq.set_defaults(fn=requeue)


def add_export(sub: Any) -> None:
    """`export`: a run's results to a folder or a bucket."""
    ex = _sub(sub, "export", "copy a run's report, metrics.jsonl, pictures and model (safetensors: weights, "
              "normalisation, feature names; no pickle) to FOLDER/RUN/ or gs://BUCKET/PREFIX/RUN/; idempotent",
              "python -m workload export --share local/share --run main --to gs://my-bucket/results")
    add_share(ex)
    ex.add_argument("--run", default=DEFAULT_RUN, help=f"the run to export (no env; default {DEFAULT_RUN})")
    ex.add_argument("--to", default=env("OUTPUT_URI"),
                    help="a local folder or gs://bucket/prefix; the run lands in <to>/<run>/ "
                         "(env OUTPUT_URI; no default)")
    ex.set_defaults(fn=export_cmd)


def add_local(sub: Any) -> None:
    """`local`: the whole system on this machine."""
    lo = _sub(sub, "local", "everything on this machine: an embedded Redis, a local folder as the share, N worker "
              "processes; run it again to resume",
              "python -m workload local --runs-file sweep.json --workers 3    # `make local ARGS=...`")
    lo.add_argument("--workers", type=positive(int, "--workers"), default=2,
                    help="worker processes (no env; default 2)")
    lo.add_argument("--dir", type=Path,
                    help="where the share, the Redis data and the logs live; it remembers --datasets, --columns "
                         "and --datetime-format for the next run (no env; default: local, or local-NAME for "
                         "--datasets .../NAME)")
    lo.add_argument("--datasets", help="copy this dataset folder (or gs://bucket/prefix) instead of simulating "
                                       "(no env; default: what --dir remembers, else simulate)")
    add_reading(lo)
    lo.add_argument("--preset", default="small",
                    help=f"simulator preset: {', '.join(simulator.PRESETS)} (no env; default small)")
    lo.add_argument("--run", action="append", help="run name, repeatable (no env; default 'main')")
    lo.add_argument("--runs-file", help="JSON {run name: {hyperparameters}}, e.g. a sweep (no env; default none)")
    lo.add_argument("--checkpoint-interval", type=positive(float, "--checkpoint-interval"), default=5.0,
                    help="seconds of training between mid-shard checkpoints (no env; default 5)")
    lo.add_argument("--lease-ttl", type=positive(float, "--lease-ttl"), default=15.0,
                    help="seconds a lease lives without a heartbeat (no env; default 15)")
    lo.add_argument("--requeue", action="store_true",
                    help="put dead-lettered shards back first, after a fix (no env; default False)")
    lo.set_defaults(fn=lambda a: __import__("workload.runtime.local", fromlist=["main"]).main(a))


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except UsageError as exc:
        log.error("%s", exc)
        return EXIT_BAD_CONFIG
    except DatasetError as exc:
        log.error("dataset problem: %s", exc)
        return EXIT_BAD_CONFIG
    except source.SourceUnreachable as exc:
        log.error("dataset source: %s", exc)
        return EXIT_INFRA
    except source.SourceError as exc:
        log.error("dataset source: %s", exc)
        return EXIT_BAD_CONFIG
    except launch.LaunchError as exc:  # the API server refused or was unreachable: no item is at fault
        log.error("%s", exc)
        return EXIT_INFRA
    except QueueInterrupted as exc:
        log.error("%s", exc)
        return EXIT_TERMINATED
    except QueueUnavailable as exc:
        log.error("%s", exc)
        return EXIT_INFRA
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        if isinstance(exc, redis.ResponseError) and "NOAUTH" not in str(exc):
            raise
        if env("REDIS_PASSWORD"):
            log.error("Redis at %s refused the password: check REDIS_PASSWORD", args.redis_url)
        else:
            log.error("Redis at %s requires a password: set REDIS_PASSWORD", args.redis_url)
        return 2
