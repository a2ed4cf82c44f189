"""Every benchmark in miniature, in every `make test`: `make bench` once failed at its first benchmark
(its workers found a queue that was never seeded) and nothing noticed until someone ran it. Figures are
not judged here (tiny data, short intervals, a loaded machine): each benchmark must run to its end and
put its rows in the table, its paragraph under it and its picture in the PNG.

`make chaos` has its miniature in tests/chaos/test_chaos_short.py (the same `run_chaos`); `make
mutation` and `make planted` take minutes per group or bug, so their tables are checked against the
tree instead (tests/test_mutation_scope.py, tests/test_planted_table.py) and `--list` runs here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import planted
from bench.run import BENCHES

ROOT = Path(__file__).resolve().parents[1]
# The benchmark column of each benchmark's rows in the table.
LABELS = {"efficiency": "training efficiency", "overhead": "per-item overhead", "sweep": "features",
          "queue": "queue", "recovery": "recovery", "program": "program", "gpu": "GPU", "quality": "quality"}
# The paragraph under the table that explains each benchmark's figures (the GPU's only without CUDA).
PARAGRAPHS = {"efficiency": "**Training efficiency**", "overhead": "**Per-item overhead**",
              "sweep": "**Features of a sweep**", "queue": "**Queue**", "recovery": "**Recovery**",
              "program": "**Program**", "quality": "**Model quality**"}

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """`python -m bench.run --mini` once, as `make bench` runs the real one: its output and its folder."""
    out = tmp_path_factory.mktemp("bench-mini")
    docs = ROOT / "docs" / "benchmarks.md"
    before = docs.read_bytes()
    # ZYGOTE=1: a miniature's figures mean nothing, so its workers may be forked (tests/workload/zygote.py)
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--mini", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=540, env={**os.environ, "ZYGOTE": "1"})
    assert proc.returncode == 0, \
        f"bench.run --mini exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert docs.read_bytes() == before, "a miniature rewrote docs/benchmarks.md: its figures mean nothing"
    return proc.stdout, out


def _rows(markdown: str) -> list[list[str]]:
    table = markdown.partition("| benchmark | figure | value | target | verdict |")[2].partition("\n\n")[0]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_every_benchmark_has_a_label() -> None:
    assert set(LABELS) == set(BENCHES)


@pytest.mark.parametrize("bench", BENCHES)
def test_each_benchmark_runs_to_its_end_and_fills_its_rows(mini: tuple[str, Path], bench: str) -> None:
    _, out = mini
    markdown = (out / "benchmarks.md").read_text()
    rows = [r for r in _rows(markdown) if r[0] == LABELS[bench]]
    assert rows, f"no {LABELS[bench]!r} row in the miniature's table:\n{markdown[:3000]}"
    assert all(len(r) == 5 and r[1] and r[2] for r in rows), rows
    if bench in PARAGRAPHS:
        assert PARAGRAPHS[bench] in markdown.partition("## What the figures mean")[2], bench


def test_the_miniature_names_itself_and_judges_nothing(mini: tuple[str, Path]) -> None:
    stdout, out = mini
    markdown = (out / "benchmarks.md").read_text()
    assert "`python -m bench.run --mini --out " in markdown
    assert all(r[3] == "" and r[4] == "" for r in _rows(markdown))  # tiny data: no verdict
    assert stdout.rstrip().endswith(f"wrote {out / 'benchmarks.md'} and {out / 'benchmarks.png'}")


def test_the_picture_is_drawn(mini: tuple[str, Path]) -> None:
    _, out = mini
    png = (out / "benchmarks.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000, len(png)


def test_planted_lists_its_table() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.planted", "--list"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for bug in planted.BUGS:
        assert f"\n{bug.id}: {bug.description}\n" in "\n" + proc.stdout
        assert all(f"must fail: {t}" in proc.stdout for t in bug.tests)


def test_a_takeover_is_found_whether_the_peer_resumed_or_began_the_day_again() -> None:
    """The recovery benchmark times a peer's takeover from its log: resumed from the victim's mid-day checkpoint, or
    begun again from the day's first batch when the victim died before promoting one (a SIGKILL within the first
    0.3 s interval of the miniature on a loaded machine, which once waited 60 s for a "resuming" never written)."""
    from bench.recovery import takeover_point

    other = "main/2018-04-02: training on 900 rows (450 of the day's), resuming at epoch 2 batch 3\n"
    resumed = "main/2018-04-03: training on 900 rows (450 of the day's), resuming at epoch 1 batch 7\n"
    again = "main/2018-04-03: training on 900 rows (450 of the day's), warm start after 2 shard(s)\n"
    cold = "main/2018-04-01: training on 450 rows (450 of the day's), cold start\n"
    assert takeover_point(other + resumed, "main/2018-04-03") == (1, 7)
    assert takeover_point(other + again, "main/2018-04-03") == (0, 0)
    assert takeover_point(cold, "main/2018-04-01") == (0, 0)
    assert takeover_point(other, "main/2018-04-03") is None
