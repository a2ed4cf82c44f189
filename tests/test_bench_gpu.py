"""The GPU benchmark in miniature on CPU, in every `make test`: a GPU visit is short and rare, so the script it
runs must not first break there. Figures are not judged (tiny data, a loaded machine): every phase must run,
log its elapsed seconds to the log file as it goes, and leave its figure in the JSON and its row in the section
that `--write` records (GPU rows say they were not measured, never a number)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import gpu, loops, prices, run
from workload.model.hparams import HParams

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench-gpu")
    docs = gpu.DOCS.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "bench.gpu", "--device", "cpu", "--mini", "--profile", "--out",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, \
        f"bench.gpu --mini exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert gpu.DOCS.read_bytes() == docs, "without --write the docs are not touched"
    return out


def test_every_phase_runs_and_logs_its_elapsed_time_to_the_file(mini: Path) -> None:
    log = (mini / "gpu-bench.log").read_text()
    for phase in ("data: simulate", "cpu: eager bare loop", "cpu: the product's step alone",
                  "cpu: worker, claim to ack", "cpu: packed sweep of 2 runs", "cpu: packed sweep of 3 runs",
                  "cpu: worker, packed sweep of 2 runs", "cpu: worker, packed sweep of 3 runs"):
        assert f"{phase}" in log and any(line.split("] ", 1)[1].startswith(phase) and line.endswith("s")
                                         and ": started" not in line for line in log.splitlines()), phase
    for runs in (1, 3):  # --profile: what a step launches, alone and in the largest pack
        line = next(line for line in log.splitlines() if f"  {runs} run(s), " in line)
        assert "operators a step" in line and "us of their time a step" in line, line
    figures = json.loads((mini / "gpu.json").read_text())["figures"]
    assert [(f["path"], f["device"]) for f in figures] == [
        (p, "cpu") for p in ("eager", "step", "worker", "packed-2", "worker-packed-2", "packed-3", "worker-packed-3")]
    assert all(f["samples"] > 0 and f["seconds"] > 0 for f in figures), figures
    assert [f["samples"] for f in figures if f["path"].startswith("packed")] == [2 * 4 * 600, 3 * 4 * 600]
    # the worker's packed path trains each run's whole day within the budget here
    assert [f["samples"] for f in figures if f["path"].startswith("worker-packed")] == [2 * 4 * 600, 3 * 4 * 600]


def test_the_section_names_what_was_not_measured_and_estimates_nothing(mini: Path) -> None:
    text = (mini / "gpu.md").read_text()
    assert text.startswith(gpu.BEGIN) and text.rstrip().endswith(gpu.END)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "samples/s (600 rows" in line]
    assert len(rows) == 7
    if not torch.cuda.is_available():
        assert all(f"| {gpu.NOT_MEASURED} |" in r for r in rows)
        assert "GPU worker / its own bare loop (the product's step alone): not yet measured on a GPU" in text


def test_write_records_the_section_and_make_bench_carries_it(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nfigures\n")
    how = gpu.Measured("python -m bench.gpu", "2026-11-28 06:23", 60.0, 12.0, (8, 32))
    first = gpu.block([], {"CPU": "x"}, how)
    gpu.write_docs(first, docs)
    assert docs.read_text() == "# Benchmarks\n\nfigures\n\n" + first + "\n"
    fig = gpu.Figure("worker", "cpu", 1, 1000, 4000, 2.0)
    second = gpu.block([fig], {"CPU": "x"}, how)
    gpu.write_docs(second, docs)  # replaces the block, keeps the rest
    assert docs.read_text() == "# Benchmarks\n\nfigures\n\n" + second + "\n"
    assert "2,000 samples/s (1,000 rows, 2.0s)" in second and "| spot CPU pod" in second
    assert run.mutation_block(docs).strip() == second


def test_a_budgeted_phase_stops_at_the_first_step_after_its_budget_and_counts_what_it_trained() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(700, 3)).astype(np.float32), (rng.random(700) < 0.1).astype(np.float32)
    hp = HParams(hidden=(4,), batch_size=64, epochs=2)
    assert loops.trainer_loop(x, y, hp, torch.device("cpu"), budget_s=0.0)[0] == 64  # one step, then stopped
    assert loops.trainer_loop(x, y, hp, torch.device("cpu"))[0] == 2 * 700
    assert loops.packed_loop(x, y, hp, 3, torch.device("cpu"), budget_s=0.0)[0] == 3 * 64


def test_a_trained_model_costs_the_windowed_days_samples() -> None:
    # 84 days of 9,700 rows: days 1-7 train their 1-7 day windows 4 epochs; days 8-14 their windows
    # ceil(28 / L) epochs; from day 14 on, 14 days x 2 epochs.
    expected = sum(d * 4 for d in range(1, 8)) + sum(d * -(-28 // d) for d in range(8, 15)) + 70 * 14 * 2
    assert gpu.model_samples() == expected * gpu.ROWS_A_DAY


def test_a_visits_json_renders_the_same_section_here_with_its_pace_by_batch_size(
        mini: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A GPU visit's figures come back as gpu.json: `--from-json` renders them here as the visit did (its date,
    command and budget, not today's), with the step's cost a step at each batch size measured. (In this process:
    `python -m bench.gpu` is run for real by the `mini` fixture; a second interpreter would only import torch again.)"""
    data = json.loads((mini / "gpu.json").read_text())
    assert data["measured"]["command"].startswith("python -m bench.gpu --device cpu --mini")
    step = next(f for f in data["figures"] if f["path"] == "step")
    data["figures"].append({**step, "path": "step-b1024", "samples": 4000, "seconds": 0.5})
    saved = tmp_path / "gpu.json"
    saved.write_text(json.dumps(data))
    assert gpu.main(["--from-json", str(saved)]) == 0
    text = capsys.readouterr().out
    assert f"Measured {data['measured']['at']} UTC by `{data['measured']['command']}`" in text
    assert f"(`--budget-s`, {data['measured']['budget_s']:g} s)" in text
    assert "| cpu | 1,024 | 8,000 | 128,000 |" in text  # 4 steps of 1,024 in 0.5 s
    assert f"| cpu | {HParams().batch_size:,} | {step['samples'] / step['seconds']:,.0f} |" in text
    bad = tmp_path / "bad.json"
    bad.write_text('{"figures": []}')
    with pytest.raises(SystemExit, match=re.escape(f"--from-json {bad}: not a gpu.json written by this benchmark")):
        gpu.main(["--from-json", str(bad)])


def test_steps_a_replay_are_tabled_beside_one_a_replay_with_the_workers_ratio() -> None:
    """`--per-replay` (CUDA only) times the step alone with graphs of several steps and the worker with the largest:
    the section tables them beside today's one a replay, a step's microseconds and the worker's share of its step;
    a count whose worker was not run shows dashes."""
    data = json.loads((ROOT / "bench" / "visits" / "2026-11-28-h200-gpu.json").read_text())
    figures = [gpu.Figure(**f) for f in data["figures"]]
    step = next(f for f in figures if (f.path, f.device) == ("step", "cuda"))
    figures += [gpu.Figure("step-r4", "cuda", 1, step.rows, 4_000_000, 4.0),
                gpu.Figure("step-r16", "cuda", 1, step.rows, 4_000_000, 3.2),
                gpu.Figure("worker-r16", "cuda", 1, step.rows, 4_000_000, 3.6)]
    table = gpu.replay_table(figures)
    assert table[4:7] == [
        f"| 1 | {step.per_s:,.0f} | {step.seconds / (step.samples / 128) * 1e6:,.0f} | 743,268 | 0.86 |",
        "| 4 | 1,000,000 | 128 | - | - |",
        "| 16 | 1,250,000 | 102 | 1,111,111 | 0.89 |"]
    assert "\n".join(table) in gpu.block(figures, data["machine"], gpu.Measured(**{
        **data["measured"], "packs": tuple(data["measured"]["packs"])}))
    assert gpu.replay_table([f for f in figures if not f.path.startswith("step-r")]) == []


def test_the_step_a_replay_setting_is_put_back_after_a_measurement() -> None:
    before = loops.gpustep.STEPS_PER_REPLAY
    with pytest.raises(RuntimeError), loops.steps_per_replay(16):
        assert loops.gpustep.STEPS_PER_REPLAY == 16
        raise RuntimeError
    assert loops.gpustep.STEPS_PER_REPLAY == before == 1


@pytest.mark.parametrize("visit", sorted((ROOT / "bench" / "visits").glob("*.json")), ids=lambda p: p.stem)
def test_the_kept_visits_still_render(visit: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/visits/ keeps each GPU visit's gpu.json (docs/benchmarks.md's GPU section came from one): each must
    still render with this code, naming its GPU and its own figures."""
    assert gpu.main(["--from-json", str(visit)]) == 0
    text = capsys.readouterr().out
    data = json.loads(visit.read_text())
    step = next(f for f in data["figures"] if (f["path"], f["device"]) == ("step", "cuda"))
    assert data["machine"]["GPU"] in text and f"{step['samples'] / step['seconds']:,.0f} samples/s" in text


def test_the_cost_table_prices_each_measured_pool_from_its_cited_catalog_and_says_where_an_l4_pays() -> None:
    """A model's cost is its pool's cited spot price times the device-seconds its samples take; the measured GPU
    has no price in the catalog and says so (no guess); the L4 pod's break-even is the ratio of the two prices."""
    samples = gpu.model_samples()
    figs = {("worker", "cpu"): gpu.Figure("worker", "cpu", 1, 100_000, 500_000, 10.0),
            ("worker", "cuda"): gpu.Figure("worker", "cuda", 1, 1_000_000, 4_000_000, 4.0),
            ("worker-packed-8", "cuda"): gpu.Figure("worker-packed-8", "cuda", 8, 1_000_000, 32_000_000, 4.0)}
    text = "\n".join(gpu.cost_table(figs, (8,), "NVIDIA H200"))
    cpu_seconds = samples / 50_000
    cpu_row = next(line for line in text.splitlines() if line.startswith("| spot CPU pod"))
    assert f"| {cpu_seconds:,.1f} | ${prices.CPU_VCPU.per_hour * cpu_seconds / 3600:.5f} |" in cpu_row
    assert f"${prices.CPU_VCPU.per_hour:.5f} (half an e2-standard-2" in cpu_row
    h200 = [line for line in text.splitlines() if line.startswith("| NVIDIA H200")]
    assert len(h200) == 2 and all("no price for it in the cited catalog" in line and "| no price |" in line
                                  for line in h200)
    assert f"| {samples / 8_000_000:,.1f} | no price |" in h200[1]  # a pack's 8 models share its device-seconds
    l4 = [line for line in text.splitlines() if line.startswith("| spot L4 pod")]
    assert len(l4) == 2 and all("$0.34057 (g2-standard-8 host 0.11747 + one L4 0.2231)" in line
                                and "not yet measured on an L4" in line for line in l4)
    ratio = prices.L4_POD.per_hour / prices.CPU_VCPU.per_hour
    assert f"costs {ratio:.1f} times one vCPU an hour" in text
    assert f"at least {ratio * 50_000:,.0f} samples/s of all its runs" in text
    assert prices.SOURCE in text and f"read {prices.READ_ON}" in text and "Autopilot's own" in text


def test_without_a_cpu_figure_the_break_even_is_the_price_ratio_alone() -> None:
    text = "\n".join(gpu.cost_table({}, (8, 32)))
    assert "times the vCPU's samples a second. Below that" in text and "measured here" not in text
