"""Command line (also the container entrypoint): seed, worker, status, local.

Every flag has an environment variable, so a Kubernetes Job configures the same code by env.
The Redis password is read from REDIS_PASSWORD only: never a flag, never logged.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from workload import dataset as ds
from workload import plan, report, simulator
from workload.hparams import HParams, parse_runs
from workload.paths import REPORT_TXT, check_name, share_paths
from workload.queue import QueueUnavailable, WorkQueue, connect

if TYPE_CHECKING:
    from workload.worker import WorkerConfig

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


def positive(kind: type, what: str) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be > 0, got {text!r}")
        return value
    return parse


def add_common(p: argparse.ArgumentParser, share: bool = True) -> None:
    if share:
        p.add_argument("--share", type=Path, default=Path(env("SHARE_DIR", "/mnt/share")),
                       help="the shared volume (env SHARE_DIR; default /mnt/share)")
    p.add_argument("--redis-url", default=env("REDIS_URL", "redis://localhost:6379/0"),
                   help="Redis URL without password (env REDIS_URL); the password comes from env REDIS_PASSWORD")
    p.add_argument("--queue-prefix", default=env("QUEUE_PREFIX", "spottrain"), help="Redis key prefix")
    p.add_argument("--max-attempts", type=positive(int, "--max-attempts"), default=int(env("MAX_ATTEMPTS", 5)),
                   help="failed attempts before an item is dead-lettered (env MAX_ATTEMPTS; default 5)")


def make_queue(args: argparse.Namespace) -> WorkQueue:
    return WorkQueue(connect(args.redis_url, env("REDIS_PASSWORD")), args.queue_prefix,
                     max_attempts=args.max_attempts, retry_for_s=float(env("REDIS_RETRY_SECONDS", 300)))


# -- seed -------------------------------------------------------------------------------------------
def load_runs(args: argparse.Namespace) -> dict[str, HParams]:
    """The runs to seed: --runs-file's sweep plus --run names (default hyperparameters), or 'main'."""
    specs: dict[str, Any] = {}
    where = "--run"
    if args.runs_file:
        where = f"--runs-file {args.runs_file}"
        try:
            specs.update(json.loads(Path(args.runs_file).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"{where}: cannot read it as JSON {{run name: {{hyperparameters}}}}: {exc}") from exc
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


def place_dataset(args: argparse.Namespace, root: Path) -> None:
    """Lay the dataset out on the share once: copy `--datasets` or simulate, validate, then publish
    it with one rename, so a seeder killed half-way leaves nothing a worker could read."""
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if args.datasets:
            src = Path(args.datasets)
            for role in ds.ROLES:
                if not (src / role).is_dir():
                    raise UsageError(f"--datasets {src}: no {role}/ folder (expected training/ and testing/)")
                (tmp / role).mkdir(parents=True)
                for f in sorted((src / role).iterdir()):
                    if f.is_file() and not f.name.startswith("."):
                        ds.check_suffix(f)
                        shutil.copyfile(f, tmp / role / f.name)
            log.info("copied %s to the share", src)
        else:
            spec = simulation_spec(args)
            log.info("simulating transactions: %s", spec)
            started = time.monotonic()
            simulator.generate(tmp, spec)
            log.info("simulated %d days in %.1fs", spec.train_days + spec.test_days, time.monotonic() - started)
        entries = ds.write_manifest(tmp)
        try:
            os.rename(tmp, root)
        except OSError:
            if not (root / ds.MANIFEST).exists():
                raise
            log.info("another seeder published %s first; using it", root)
        else:
            rows = sum(e["rows"] for e in entries)
            frauds = sum(e["frauds"] for e in entries)
            log.info("dataset %s: %d files, %d transactions, %d fraudulent (%.2f%%)", root, len(entries), rows,
                     frauds, 100 * frauds / max(rows, 1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def store_features(root: Path) -> None:
    """Every training and testing day's features, computed here once (on the loader's CPU) and
    stored next to the day, so that no GPU worker of any run computes them."""
    from workload import features, featurestore

    started = time.monotonic()
    computed, kept = featurestore.ensure(ds.Dataset(root))
    log.info("features (version %s): %d day(s) computed in %.1fs, %d already stored", features.FEATURE_VERSION,
             computed, time.monotonic() - started, kept)


def seed(args: argparse.Namespace) -> int:
    runs = load_runs(args)
    name = args.dataset
    try:
        check_name(name, "--dataset")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    datasets_dir, _ = share_paths(args.share)
    datasets_dir.mkdir(parents=True, exist_ok=True)
    root = datasets_dir / name
    if (root / ds.MANIFEST).exists():
        log.info("dataset %s is already on the share: not touching it", root)
    else:
        place_dataset(args, root)
    store_features(root)
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
    c = queue.counts()
    log.info("queued %d new item(s) (%d already known) for run(s) %s; queue: %d pending, %d leased, %d done, "
             "%d dead", added, len(items) - added, ", ".join(runs), c.pending, c.leased, c.done, c.dead)
    return 0


# -- worker -----------------------------------------------------------------------------------------
def worker_config(args: argparse.Namespace) -> WorkerConfig:
    from workload.worker import WorkerConfig, default_worker_id  # torch: only workers pay for it

    try:
        return WorkerConfig(
            share=args.share, redis_url=args.redis_url, redis_password=env("REDIS_PASSWORD"),
            prefix=args.queue_prefix, worker_id=args.worker_id or default_worker_id(),
            lease_ttl_s=args.lease_ttl, checkpoint_interval_s=args.checkpoint_interval,
            max_attempts=args.max_attempts, redis_retry_s=float(env("REDIS_RETRY_SECONDS", 300)),
            plot_interval_s=float(env("PLOT_INTERVAL_SECONDS", 30)))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def worker(args: argparse.Namespace) -> int:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from workload.worker import Worker

    cfg = worker_config(args)
    setup_logging(cfg.worker_id)
    w = Worker(cfg, make_queue(args))
    w.install_signal_handlers()
    return w.run()


# -- status -----------------------------------------------------------------------------------------
def status(args: argparse.Namespace) -> int:
    queue = make_queue(args)
    snap = queue.snapshot()
    c = queue.counts()
    out = [f"queue {args.queue_prefix}: {c.total} items: {c.pending} pending, {c.leased} leased, {c.done} done, "
           f"{c.dead} dead-lettered" + ("  (drained)" if c.drained else "")]
    _, output_dir = share_paths(args.share)
    for run, r in snap["runs"].items():
        out.append(f"run {run}: {r['done']}/{r['total']} shards applied, {len(r['pending'])} pending, "
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
        m = report.latest_metrics(output_dir / run)
        if m:
            out.append(f"  latest: after {m['shard']}: {report.figures_line(m)}")
            out.append(f"  report: {output_dir / run / REPORT_TXT}")
    print("\n".join(out))
    return 0


# -- parser -----------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workload", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("seed", help="put the dataset on the share and enqueue (run, shard) items; idempotent")
    add_common(s)
    s.add_argument("--run", action="append", help="run name (repeatable; default 'main')")
    s.add_argument("--runs-file", default=env("RUNS_FILE"),
                   help="JSON {run name: {hyperparameters}}, e.g. a sweep (env RUNS_FILE)")
    s.add_argument("--datasets", default=env("DATASETS_SRC"),
                   help="copy this folder (training/*.parquet|csv, testing/*) instead of simulating")
    s.add_argument("--dataset", default=env("DATASET", DEFAULT_DATASET), help="dataset name on the share")
    s.add_argument("--preset", default=env("DATASET_PRESET", "small"),
                   help=f"simulator preset: {', '.join(simulator.PRESETS)} (env DATASET_PRESET; default small)")
    for flag, kind in (("customers", int), ("terminals", int), ("train-days", int), ("test-days", int)):
        s.add_argument(f"--{flag}", type=positive(kind, f"--{flag}"), help="override the preset")
    s.add_argument("--start-date", help="first simulated day, YYYY-MM-DD (overrides the preset)")
    s.add_argument("--sim-seed", type=int, help="simulator seed (overrides the preset)")
    s.set_defaults(fn=seed)

    w = sub.add_parser("worker", help="drain the queue; exit 0 only when everything is done or dead-lettered")
    add_common(w)
    w.add_argument("--worker-id", default=env("WORKER_ID"), help="name in leases and logs (env WORKER_ID)")
    w.add_argument("--lease-ttl", type=positive(float, "--lease-ttl"), default=float(env("LEASE_TTL_SECONDS", 30)),
                   help="seconds a lease lives without heartbeat (env LEASE_TTL_SECONDS; default 30)")
    w.add_argument("--checkpoint-interval", type=positive(float, "--checkpoint-interval"),
                   default=float(env("CHECKPOINT_INTERVAL_SECONDS", 10)),
                   help="seconds of training between mid-shard checkpoints (env CHECKPOINT_INTERVAL_SECONDS)")
    w.add_argument("--threads", type=positive(int, "--threads"),
                   default=int(env("TORCH_THREADS", 0)) or None, help="torch CPU threads (env TORCH_THREADS)")
    w.set_defaults(fn=worker)

    st = sub.add_parser("status", help="pending, leased (by whom, until when), done, dead-lettered, per run")
    add_common(st)
    st.set_defaults(fn=status)

    lo = sub.add_parser("local", help="everything on this machine: embedded Redis, local share, N workers")
    lo.add_argument("--workers", type=positive(int, "--workers"), default=2)
    lo.add_argument("--dir", type=Path, default=Path("local"), help="where the share and Redis data live")
    lo.add_argument("--datasets", help="copy this dataset folder instead of simulating")
    lo.add_argument("--preset", default="small", help=f"simulator preset: {', '.join(simulator.PRESETS)}")
    lo.add_argument("--run", action="append", help="run name (repeatable; default 'main')")
    lo.add_argument("--runs-file", help="JSON {run name: {hyperparameters}}")
    lo.add_argument("--checkpoint-interval", type=positive(float, "--checkpoint-interval"), default=5.0)
    lo.add_argument("--lease-ttl", type=positive(float, "--lease-ttl"), default=15.0)
    lo.set_defaults(fn=lambda a: __import__("workload.local", fromlist=["main"]).main(a))
    return p


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except UsageError as exc:
        log.error("%s", exc)
        return 2
    except ds.DatasetError as exc:
        log.error("dataset problem: %s", exc)
        return 2
    except QueueUnavailable as exc:
        log.error("%s", exc)
        return 3
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        if isinstance(exc, redis.ResponseError) and "NOAUTH" not in str(exc):
            raise
        if env("REDIS_PASSWORD"):
            log.error("Redis at %s refused the password: check REDIS_PASSWORD", args.redis_url)
        else:
            log.error("Redis at %s requires a password: set REDIS_PASSWORD", args.redis_url)
        return 2
