"""`python -m bench.gpu`: what one GPU trains per second, and what a trained model costs on it.

Sized for one short visit to a GPU machine (under 6 minutes on an H100 or H200): a simulated 1,000,000-row
day, timed on CUDA through each path (with the CPU threads the stack's GPU pod has: `GPU_POD_THREADS`), and the
same paths on the CPU beside them (one torch thread, as a `trainOn: cpu` pod has, on a smaller day: `--cpu-rows`):

- the eager bare loop at the default run (`bench.loops.bare_loop`: today's step; on CUDA one epoch of the
  day, its pace is flat);
- the product's step alone (`Trainer.train_shard`: captured once and replayed on CUDA, eager on CPU), no
  queue, files or checkpoints: the worker's own bare loop;
- the worker, claim to ack, as `make bench` times it (`bench.inprocess`: real Redis, share, checkpoints,
  test-day scoring, report): needs a Redis server (see shared/GPU.md for the wheels); skipped, saying why,
  without one;
- packed sweeps of 8 and 32 runs (`workload.model.packed`), aggregate samples/s.

Budgeted phases stop at the first step boundary after `--budget-s`. Every line of progress goes to
`<out>/gpu-bench.log` as it happens, with each phase's elapsed seconds, and the figures to `<out>/gpu.json`
after every phase, so a visit cut short keeps what it measured. `--write` records the table, with the cost
per trained model, in docs/benchmarks.md (a block `make bench` carries over).

    python -m bench.gpu                          # on a GPU machine: CUDA, then the CPU section
    python -m bench.gpu --device cpu --mini      # every phase in miniature on CPU (tests/test_bench_gpu.py)
    python -m bench.gpu --write                  # also record the figures in docs/benchmarks.md
    python -m bench.gpu --profile --batch-sizes 1024,8192   # also: what a step launches; the step at larger batches
    python -m bench.gpu --from-json bench/visits/2026-11-28-h200-gpu.json --write   # a visit's figures, here
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from bench import data, loops, prices
from workload.model.trainer import HParams, Trainer
from workload.runtime import gpu as gpu_check

if TYPE_CHECKING:
    from workload.runtime.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
OUT = ROOT / "build" / "bench" / "gpu"
BEGIN, END = "<!-- gpu:begin -->", "<!-- gpu:end -->"
HP = HParams()  # the default run
# Torch threads of the CUDA section: a GPU pod requests `workerCpu` ("4" by default, Pulumi.yaml) and is not given
# TORCH_THREADS (infra/jobs.py sets it to 1 on CPU pods only), so its CPU-side work (the day's statistics, reading,
# calibration) runs on at least 4 threads; visits before 2026-11-29 measured it on 1 (their gpu.json says so).
GPU_POD_THREADS = 4
NOT_MEASURED = "not yet measured on a GPU"
# A trained model, for its cost: the Handbook's 12 weeks of the handbook's population (~9,700 rows a day).
MODEL_DAYS, ROWS_A_DAY = 84, 9_700


@dataclass(frozen=True)
class Size:
    rows: int = 1_000_000  # the GPU's day
    cpu_rows: int = 100_000  # the CPU section's day: one torch thread trains ~200k samples/s
    packs: tuple[int, ...] = (8, 32)
    budget_s: float = 20.0  # a 6-minute visit: data ~1 min, the eager epoch ~16 s, the worker's day, 4 budgeted phases
    eager_epochs: int = 1  # the eager loop on CUDA: ~2 ms a step whatever the batch, so one epoch shows its pace
    population: data.Population = data.HANDBOOK
    batch_sizes: tuple[int, ...] = ()  # the step alone again at these batch sizes (`--batch-sizes`), half the budget
    profile: bool = False  # log what a step launches, alone and in the largest pack (`--profile`)
    per_replay: tuple[int, ...] = ()  # on CUDA, the step alone at these steps a replay, the worker at the largest


MINI = Size(rows=600, cpu_rows=600, packs=(2, 3), budget_s=60.0, population=data.Population(customers=200,
                                                                                             terminals=400))
PATHS = (("eager", "bare loop, eager (today's step at the default)"),
         ("step", "the product's step alone (captured on CUDA, eager on CPU)"),
         ("worker", "worker, claim to ack (queue, share, checkpoints, scoring, report)"))


@dataclass
class Figure:
    path: str  # "eager", "step", "worker", "packed-<R>"
    device: str
    runs: int
    rows: int
    samples: int
    seconds: float
    note: str = ""

    @property
    def per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else math.nan


@dataclass
class Log:
    """Progress lines to the terminal and to a file, as they happen; figures to JSON after every phase."""

    out: Path
    figures: list[Figure] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    keep_going: bool = False  # a phase that fails is logged with its traceback and the next one runs
    failed: list[str] = field(default_factory=list)

    def line(self, text: str) -> None:
        stamped = f"[{time.monotonic() - self.started:7.1f}s] {text}"
        print(stamped, flush=True)
        with (self.out / "gpu-bench.log").open("a") as f:
            f.write(stamped + "\n")

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.line(f"{name}: started")
        begun = time.monotonic()
        try:
            yield
        except Exception:
            if not self.keep_going:
                raise
            self.failed.append(name)
            self.line(f"{name}: FAILED\n{traceback.format_exc()}")
        finally:
            self.line(f"{name}: {time.monotonic() - begun:.1f}s")

    def add(self, fig: Figure, machine: dict[str, str]) -> None:
        self.figures.append(fig)
        self.line(f"  {fig.device} {fig.path}: {fig.samples:,} samples in {fig.seconds:.2f}s = {fig.per_s:,.0f}/s"
                  + (f" ({fig.note})" if fig.note else ""))
        (self.out / "gpu.json").write_text(json.dumps(
            {"machine": machine, "figures": [asdict(f) for f in self.figures]}, indent=1))


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = {"CPU": f"{cpu}, {os.cpu_count()} cores", "torch": torch.__version__,
           "Python": platform.python_version()}
    if torch.cuda.is_available():
        out |= {"GPU": torch.cuda.get_device_name(0), "driver": gpu_check.driver_version(),
                "CUDA": str(torch.version.cuda)}
    return out


def day(rows: int, size: Size, work: Path, log: Log) -> tuple[Path, object]:
    """A simulated day of `rows` rows on a share of its own, with its features stored (what `seed` does)."""
    with log.phase(f"data: simulate and store features of a {rows:,}-row day"):
        share = work / f"share-{rows}"
        data.place(data.single_shard(rows, size.population), share)
        return share, data.seed_features(share).examples([loops.SHARD])


def measure(device: torch.device, rows: int, size: Size, work: Path, log: Log, server: RedisServer | None,
            info: dict[str, str]) -> None:
    """Every path on `device`, on one `rows`-row day."""
    share, ex = day(rows, size, work, log)
    x, y, dev = ex.x, ex.y, device.type
    with log.phase(f"{dev}: eager bare loop"):
        hp = replace(HP, epochs=size.eager_epochs) if dev == "cuda" else HP
        log.add(Figure("eager", dev, 1, rows, rows * hp.epochs, loops.bare_loop(x, y, hp, device),
                       f"{hp.epochs} epoch(s)"), info)
    with log.phase(f"{dev}: the product's step alone"):
        samples, seconds = loops.trainer_loop(x, y, HP, device, size.budget_s)
        log.add(Figure("step", dev, 1, rows, samples, seconds), info)
    for runs in (1, max(size.packs)) if size.profile else ():  # where a step's time goes (`--profile`)
        with log.phase(f"{dev}: profile of the step, {runs} run(s)"):
            for line in loops.step_profile(x, y, HP, device, runs=runs).lines():
                log.line("  " + line)
    for batch in size.batch_sizes:  # what a larger batch would buy (a GPU preset's question): the pace only
        with log.phase(f"{dev}: the product's step alone, batches of {batch}"):
            samples, seconds = loops.trainer_loop(x, y, replace(HP, batch_size=batch), device, size.budget_s / 2)
            log.add(Figure(f"step-b{batch}", dev, 1, rows, samples, seconds), info)
    with log.phase(f"{dev}: worker, claim to ack"):
        log.add(worker(server, own_share(share, work, f"worker-{dev}"), rows, device, "worker", log), info)
    if size.profile and server is not None:  # where the worker's own overhead goes, function by function
        with log.phase(f"{dev}: profile of the worker outside training"):
            for line in worker_profile(server, own_share(share, work, f"profiled-{dev}"), device):
                log.line("  " + line)
    for count in size.per_replay if dev == "cuda" else ():  # a graph of several steps (`gpustep.STEPS_PER_REPLAY`)
        with log.phase(f"{dev}: the product's step alone, {count} steps a replay"), loops.steps_per_replay(count):
            samples, seconds = loops.trainer_loop(x, y, HP, device, size.budget_s)  # as the "step" row: comparable
            log.add(Figure(f"step-r{count}", dev, 1, rows, samples, seconds), info)
    if size.per_replay and dev == "cuda":
        count = max(size.per_replay)
        with log.phase(f"{dev}: worker, {count} steps a replay"), loops.steps_per_replay(count):
            log.add(worker(server, own_share(share, work, f"worker-r{count}-{dev}"), rows, device, f"worker-r{count}",
                           log), info)
    for runs in size.packs:
        with log.phase(f"{dev}: packed sweep of {runs} runs"):
            samples, seconds = loops.packed_loop(x, y, HP, runs, device, size.budget_s)
            log.add(Figure(f"packed-{runs}", dev, runs, rows, samples, seconds), info)
        with log.phase(f"{dev}: worker, packed sweep of {runs} runs"):
            log.add(packed_worker(share, runs, rows, device, size, work, server), info)


def own_share(share: Path, work: Path, name: str) -> Path:
    """A share of its own for one measured worker, linking `share`'s datasets (their stored features too): a run
    recorded on a share is one every later worker there reconciles its queue against, which is not its cost."""
    own = work / f"share-{name}"
    own.mkdir()
    (own / "datasets").symlink_to((share / "datasets").resolve())
    return own


def worker(server: RedisServer | None, share: Path, rows: int, device: torch.device, path: str,
           log: Log | None = None) -> Figure:
    """The worker, claim to ack, training the default run on the day (a run of its own, `path`), its slowest
    phases besides training named (and every phase, with what no phase timed, on a line of `log`)."""
    dev = device.type
    if server is None:
        return Figure(path, dev, 1, rows, 0, 0.0, "skipped: no Redis server could start")
    from bench import inprocess  # the worker needs the redis client: imported only where one runs

    (item,) = inprocess.run_items(server, share, f"gpu-{dev}-{path}", f"{path}-{dev}", HP, device,
                                  checkpoint_interval_s=10.0, lease_ttl_s=30.0)
    rest = sorted(((v, k) for k, v in item.phases.items() if k != "training"), reverse=True)
    if log is not None:  # the worker's own overhead, phase by phase: where the next cut is
        untimed = item.total_s - sum(item.phases.values())
        log.line(f"  {dev} {path} phases: " + ", ".join(f"{k} {v:.3f}s" for v, k in sorted(
            ((v, k) for k, v in item.phases.items()), reverse=True)) + f", untimed {untimed:.3f}s")
    rest = rest[:4]
    return Figure(path, dev, 1, rows, rows * HP.epochs, item.total_s,
                  f"training {item.training_s:.2f}s of it; " + ", ".join(f"{k} {v:.2f}s" for v, k in rest))


def worker_profile(server: RedisServer, share: Path, device: torch.device, top: int = 40) -> list[str]:
    """The worker's day once more (a run of its own) under cProfile: the product's functions by cumulative time,
    training's own left out (its step is `step_profile`'s), so that what its own overhead is made of shows."""
    import cProfile
    import pstats

    from bench import inprocess

    profile = cProfile.Profile()
    profile.enable()
    try:
        inprocess.run_items(server, share, f"gpu-{device.type}-profiled", f"profiled-{device.type}", HP, device,
                            checkpoint_interval_s=10.0, lease_ttl_s=30.0)
    finally:
        profile.disable()
    stats = pstats.Stats(profile)
    rows = [(cum, calls, f"{Path(file).name}:{line}({name})") for (file, line, name), (calls, _, _, cum, _)
            in stats.stats.items()  # type: ignore[attr-defined]  # pstats keeps its table there
            if "/workload/" in file and "/workload/model/gpustep.py" not in file and name != "train_shard"]
    rows.sort(reverse=True)
    return [f"{cum:7.3f}s {calls:6d}x  {where}" for cum, calls, where in rows[:top]]


def packed_worker(share: Path, runs: int, rows: int, device: torch.device, size: Size, work: Path,
                  server: RedisServer | None) -> Figure:
    """The worker's packed path (`--pack runs`): one worker leases the sweep's runs of the day together, claim to
    ack (or to the stop after the budget), on a share of its own that links the day's dataset."""
    dev, path = device.type, f"worker-packed-{runs}"
    if server is None:
        return Figure(path, dev, runs, rows, 0, 0.0, "skipped: no Redis server could start")
    from bench import inprocess  # the worker needs the redis client: imported only where one runs

    own = own_share(share, work, f"{rows}-pack{runs}-{dev}")
    sweep = {f"pack{runs}-{i}": h for i, h in enumerate(loops.sweep_hparams(HP, runs))}
    # Checkpoints every third of the budget: the figure counts what the runs' checkpoints record, so each run saves
    # (and its save's cost is measured) before the stop; with none measured the stop's budget assumes 1 s a save.
    samples, seconds = inprocess.run_sweep(server, own, f"gpu-{dev}-pack{runs}", sweep, device, rows, size.budget_s,
                                           checkpoint_interval_s=min(10.0, size.budget_s / 3), lease_ttl_s=30.0)
    return Figure(path, dev, runs, rows, samples, seconds)


def model_samples(hp: HParams = HP) -> int:
    """Samples one trained model costs: MODEL_DAYS days of ROWS_A_DAY rows, each day trained over its window
    (`window_days`) for the window's epochs (`Trainer.window_epochs`)."""
    t = Trainer("cost", hp, ("f",), torch.device("cpu"))
    return sum(min(d, hp.window_days) * ROWS_A_DAY * t.window_epochs(min(d, hp.window_days))
               for d in range(1, MODEL_DAYS + 1))


def figure_cell(figs: dict[tuple[str, str], Figure], path: str, dev: str) -> str:
    f = figs.get((path, dev))
    if f is None:
        return NOT_MEASURED if dev == "cuda" else "not yet measured" if not figs else "not measured in this run"
    if not f.samples:
        return f.note
    return f"{f.per_s:,.0f} samples/s ({f.rows:,} rows, {f.seconds:.1f}s{', ' + f.note if f.note else ''})"


@dataclass(frozen=True)
class Measured:
    """How a set of figures was measured: kept in gpu.json beside them, so a visit's figures can be written into
    the docs later, elsewhere (`--from-json`)."""

    command: str
    at: str  # UTC, "YYYY-MM-DD HH:MM"
    wall_s: float
    budget_s: float
    packs: tuple[int, ...]
    gpu_threads: int = 1  # torch threads of the CUDA section (`GPU_POD_THREADS`; 1 before it)


def pace_table(figures: list[Figure]) -> list[str]:
    """The step alone at each batch size measured (`--batch-sizes`): its pace and its cost a step, which shows
    whether a step is bound by its launches (the same microseconds at every batch) or by its arithmetic."""
    paces = [(HP.batch_size if f.path == "step" else int(f.path.removeprefix("step-b")), f) for f in figures
             if f.samples and (f.path == "step" or f.path.startswith("step-b"))]
    if len({b for b, _ in paces}) < 2:
        return []
    out = ["The product's step alone by batch size (a pace, not a preset: a larger batch changes the model; see "
           "the quality table):", "", "| device | batch | samples/s | microseconds a step (capture included) |",
           "|---|---|---|---|"]
    out += [f"| {f.device} | {b:,} | {f.per_s:,.0f} | {f.seconds / (f.samples / b) * 1e6:,.0f} |"
            for b, f in sorted(paces, key=lambda bf: (bf[1].device != "cuda", bf[0]))]
    return [*out, ""]


def replay_table(figures: list[Figure]) -> list[str]:
    """The step alone (and the worker) with several steps a graph's replay (`--per-replay`), beside one a replay:
    what `gpustep.STEPS_PER_REPLAY` would buy as a default."""
    figs = {f.path: f for f in figures if f.device == "cuda" and f.samples}
    counts = sorted(int(p.removeprefix("step-r")) for p in figs if p.startswith("step-r"))
    if not counts or "step" not in figs:
        return []
    out = ["The product's step on CUDA by steps a replay (`gpustep.STEPS_PER_REPLAY`; 1 is today's default):", "",
           "| steps a replay | step alone, samples/s | microseconds a step | worker, samples/s | worker / step alone |",
           "|---|---|---|---|---|"]
    for count in (1, *counts):
        step, work = figs.get("step" if count == 1 else f"step-r{count}"), figs.get(
            "worker" if count == 1 else f"worker-r{count}")
        us = f"{step.seconds / (step.samples / HP.batch_size) * 1e6:,.0f}" if step else "-"
        ratio = f"{work.per_s / step.per_s:.2f}" if work and step else "-"
        out.append(f"| {count} | {step.per_s:,.0f} | {us} | {f'{work.per_s:,.0f}' if work else '-'} | {ratio} |"
                   if step else f"| {count} | - | - | - | - |")
    return [*out, ""]


def block(figures: list[Figure], info: dict[str, str], how: Measured) -> str:
    """docs/benchmarks.md's GPU section: the figures (GPU rows not measured say so) and the cost table."""
    figs, packs = {(f.path, f.device): f for f in figures}, how.packs
    measured = any(f.device == "cuda" for f in figures)
    out = [BEGIN, "## GPU", ""]
    out.append(f"Measured {how.at} UTC by `{how.command}` in {how.wall_s / 60:.1f} min; "
               + "; ".join(f"{k}: {v}" for k, v in info.items()) + "." if figures else
               "Not yet measured on a GPU: `python -m bench.gpu --write` on a GPU machine fills this section "
               "(CUDA and the same run's CPU figures); `bash bench/gpu_visit.sh` runs it after the CUDA tests, in "
               "one visit.")
    threads = f"{how.gpu_threads} torch thread{'s' if how.gpu_threads > 1 else ''}"
    out += ["", f"| path | on the GPU ({threads} beside it) | on the CPU (1 torch thread) |", "|---|---|---|"]
    paths = [*PATHS, *((f"packed-{r}", f"packed sweep of {r} runs (aggregate)") for r in packs),
             *((f"worker-packed-{r}", f"worker, packed sweep of {r} runs (`--pack {r}`, aggregate)") for r in packs)]
    out += [f"| {label} | {figure_cell(figs, p, 'cuda')} | {figure_cell(figs, p, 'cpu')} |" for p, label in paths]
    worker, step = figs.get(("worker", "cuda")), figs.get(("step", "cuda"))
    ratio = (f"{worker.per_s / step.per_s:.2f}" if worker and step and worker.samples and step.samples
             else NOT_MEASURED)
    out += ["", f"GPU worker / its own bare loop (the product's step alone): {ratio} (target >= 0.9); "
            "targets on a 1,000,000-row day: the worker >= 1,000,000 samples/s, a packed sweep of 32 >= 20,000,000 "
            "samples/s (issue 33)." + ("" if measured else " No GPU figure here is estimated."), ""]
    out += ["How each path is timed: the eager bare loop on CUDA trains one epoch of the day (its ~2 ms a step "
            "does not depend on the batch), on CPU the whole day; the product's step alone and the packed sweeps "
            f"stop at the first step after the budget (`--budget-s`, {how.budget_s:g} s) and count the rows they "
            "trained, the day's move to the device and the graph's capture included; the worker trains the whole "
            "day, claim to ack (its slowest phases besides training are named); the worker's packed sweep "
            "(`--pack R`) leases the R runs' day together and trains it claim to ack, or, past the budget, stops as "
            "SIGTERM stops it (each run's final checkpoint) and counts what each run's checkpoint records. Packed "
            "runs differ in seed, learning rate and weight decay (`bench.loops.sweep_hparams`). CPU figures use one "
            "torch thread, on a smaller day (`--cpu-rows`).", ""]
    out += pace_table(figures)
    out += replay_table(figures)
    out += cost_table(figs, packs, info.get("GPU", ""))
    return "\n".join(out) + "\n" + END


def cost_table(figs: dict[tuple[str, str], Figure], packs: tuple[int, ...], gpu_name: str = "") -> list[str]:
    """What a trained model costs on each pool: the device-seconds its samples take (a pack's R models share them)."""
    samples = model_samples()
    out = ["### Cost per trained model", "",
           f"A trained model: the Handbook's 12 weeks ({MODEL_DAYS} days of ~{ROWS_A_DAY:,} rows, the handbook's "
           f"5,000 customers) with the default run, each day trained over its window: {samples:,} samples. A pool "
           "training R runs at once (a packed sweep) trains R models in the time of its samples / its samples/s: "
           "device-seconds per model = samples / samples/s of all its runs; $ per model = spot price per hour x "
           "device-seconds / 3600. Each rate comes from the day it was measured on (named in its row): a model's "
           f"{MODEL_DAYS} small days also pay each day's work outside training (claim, features, scoring, report: "
           "the worker's phases above), which these rates spread over far more rows. The measured GPU is not an L4: "
           "the L4 rows stay unmeasured until the benchmark runs on one.",
           "", "| pool | spot price per hour | samples/s (all its runs) | device-seconds per trained model | "
           "$ per trained model |",
           "|---|---|---|---|---|"]
    rows: list[tuple[str, Figure | None, prices.Price | None]] = [
        ("spot L4 pod (the stack's default GPU), one run", None, prices.L4_POD),
        *((f"spot L4 pod, packed sweep of {r}", None, prices.L4_POD) for r in packs)]
    if gpu_name:
        rows += [(f"{gpu_name} (measured here), one run (the worker's figure)", figs.get(("worker", "cuda")), None),
                 *((f"{gpu_name} (measured here), packed sweep of {r} (the worker's figure)",
                    figs.get((f"worker-packed-{r}", "cuda")), None) for r in packs)]
    cpu = figs.get(("worker", "cpu"))
    rows.append(("spot CPU pod, 1 vCPU (1 torch thread), one run (the worker's figure)", cpu, prices.CPU_VCPU))
    for label, fig, price in rows:
        per_hour = f"${price.per_hour:.5f} ({price.parts})" if price else "no price for it in the cited catalog"
        if fig is None or not fig.samples:
            cell = ("not yet measured on an L4" if "L4" in label else "not measured in this run" if figs
                    else "not yet measured")
            out.append(f"| {label} | {per_hour} | {cell} | | |")
            continue
        seconds = samples / fig.per_s
        cost = f"${prices.dollars(price, seconds):.5f}" if price else "no price"
        out.append(f"| {label} | {per_hour} | {fig.per_s:,.0f} (measured on a {fig.rows:,}-row day) | "
                   f"{seconds:,.1f} | {cost} |")
    out += ["", *break_even(cpu), prices.cited()]
    return out


def break_even(cpu: Figure | None) -> list[str]:
    """How fast an L4 pod must train to cost a model less than one spot vCPU: the ratio of their prices."""
    ratio = prices.L4_POD.per_hour / prices.CPU_VCPU.per_hour
    text = (f"Which pool is cheaper: an L4 pod costs {ratio:.1f} times one vCPU an hour, so it trains a model for "
            f"less only where it trains at least {ratio:.1f} times the vCPU's samples a second")
    if cpu is not None and cpu.samples:
        text += (f": at the vCPU's {cpu.per_s:,.0f} samples/s measured here, at least {ratio * cpu.per_s:,.0f} "
                 "samples/s of all its runs (one run, or a packed sweep's aggregate)")
    return [text + ". Below that, train on spot CPU pods (`trainOn: cpu`).", ""]


def write_docs(text: str, path: Path = DOCS) -> None:
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        new = old.partition(BEGIN)[0] + text + old.partition(END)[2]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)


def redis(work: Path, log: Log) -> RedisServer | None:
    """A Redis server for the worker phases, or None (a GPU machine without the redis wheels: shared/GPU.md)."""
    try:
        from workload.runtime.redis_server import RedisServer

        return RedisServer(work / "redis").start()
    except Exception as exc:  # noqa: BLE001 - any reason: the worker's rows say it was skipped, and why
        log.line(f"no Redis server: {exc!r}: the worker phases are skipped")
        return None


def from_json(path: Path, write: bool) -> int:
    """The section from a visit's gpu.json (figures measured on a GPU machine, brought back here)."""
    try:
        data = json.loads(path.read_text())
        how = data["measured"]
        how = Measured(how["command"], how["at"], float(how["wall_s"]), float(how["budget_s"]),
                       tuple(int(r) for r in how["packs"]), int(how.get("gpu_threads", 1)))
        figures = [Figure(**f) for f in data["figures"]]
        info = {str(k): str(v) for k, v in data["machine"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--from-json {path}: not a gpu.json written by this benchmark ({exc!r})") from exc
    text = block(figures, info, how)
    print(text)
    if write:
        write_docs(text)
        print(f"recorded in {DOCS}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--device", choices=("cuda", "cpu", "both"), default=None,
                   help="where to measure (default: both when CUDA is available, else cpu)")
    p.add_argument("--mini", action="store_true", help="every phase in miniature: proves it runs, means nothing")
    p.add_argument("--rows", type=int, help="rows of the GPU's day (default 1,000,000)")
    p.add_argument("--cpu-rows", type=int, help="rows of the CPU section's day (default 100,000)")
    p.add_argument("--budget-s", type=float, help="a budgeted phase stops after this many seconds (default 20)")
    p.add_argument("--batch-sizes", default="", help="also time the step alone at these batch sizes, e.g. 1024,8192 "
                   "(logged and kept in gpu.json, not in the table)")
    p.add_argument("--per-replay", default="", help="on CUDA, also time the step alone with this many steps a graph's "
                   "replay, e.g. 4,16, and the worker with the largest (gpustep.STEPS_PER_REPLAY; kept in gpu.json)")
    p.add_argument("--profile", action="store_true", help="also log what one step launches (kernels on CUDA, "
                   "operators on CPU) and their time, alone and in the largest pack")
    p.add_argument("--out", type=Path, default=OUT, help=f"log and figures go here (default {OUT})")
    p.add_argument("--write", action="store_true", help="record the GPU section in docs/benchmarks.md")
    p.add_argument("--keep-going", action="store_true",
                   help="a phase that fails is logged with its traceback and the others still run (one short visit)")
    p.add_argument("--from-json", type=Path, metavar="GPU_JSON",
                   help="measure nothing: render the section from a visit's gpu.json (with --write, into the docs)")
    args = p.parse_args(argv)
    if args.from_json:
        return from_json(args.from_json, args.write)
    size = MINI if args.mini else Size()
    size = replace(size, rows=args.rows or size.rows, cpu_rows=args.cpu_rows or size.cpu_rows,
                   budget_s=args.budget_s or size.budget_s,
                   batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",") if b.strip()), profile=args.profile,
                   per_replay=tuple(int(c) for c in args.per_replay.split(",") if c.strip()))
    where = args.device or ("both" if torch.cuda.is_available() else "cpu")
    if where in ("cuda", "both") and not torch.cuda.is_available():
        p.error(f"--device {where}: no CUDA device here ({gpu_check.driver_version()})")
    given = sys.argv[1:] if argv is None else argv
    command = "python -m bench.gpu" + (" " + shlex.join(given) if given else "")
    args.out.mkdir(parents=True, exist_ok=True)
    log, info = Log(args.out, keep_going=args.keep_going), machine()
    gpu_threads = min(GPU_POD_THREADS, os.cpu_count() or 1) if where in ("cuda", "both") else 1
    threads = f"{gpu_threads} beside the GPU (its pod's), 1 on the CPU" if where != "cpu" else "1"
    log.line(f"{command}: " + "; ".join(f"{k}: {v}" for k, v in info.items()) + f"; torch threads: {threads}")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        work = Path(tmp)
        if args.mini:
            size = replace(size, population=replace(size.population, cache=work / "cache"))
        server = redis(work, log)
        try:
            for dev, rows in (("cuda", size.rows), ("cpu", size.cpu_rows)):
                if where in (dev, "both"):
                    torch.set_num_threads(gpu_threads if dev == "cuda" else 1)
                    with log.phase(f"{dev}: every path"):
                        measure(torch.device(dev), rows, size, work, log, server, info)
        finally:
            if server is not None:
                server.stop()
    how = Measured(command, f"{datetime.now(UTC):%Y-%m-%d %H:%M}", round(time.monotonic() - log.started, 1),
                   size.budget_s, size.packs, gpu_threads)
    (args.out / "gpu.json").write_text(json.dumps(
        {"machine": info, "measured": asdict(how), "figures": [asdict(f) for f in log.figures]}, indent=1))
    text = block(log.figures, info, how)
    (args.out / "gpu.md").write_text(text + "\n")
    log.line(f"wrote {args.out / 'gpu.md'}, {args.out / 'gpu.json'}, {args.out / 'gpu-bench.log'}")
    if args.write:
        write_docs(text)
        log.line(f"recorded in {DOCS}")
    if log.failed:
        log.line(f"{len(log.failed)} phase(s) failed: {', '.join(log.failed)}")
    return 1 if log.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
