"""`python -m bench.longrun` in miniature (12 days, one in-process worker, a real redis-server): it runs to its
end and records its marks; its flatness check fails on figures that grow, and its block lands in
docs/benchmarks.md between its markers (which `make bench` carries over). The 2,000-day figures are in
docs/benchmarks.md."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench import longrun, run

pytestmark = pytest.mark.timeout(300)


def test_the_long_run_bench_runs_and_its_flatness_check_can_fail(tmp_path: Path, monkeypatch) -> None:
    res = longrun.measure(12, early=6)
    assert [m.day for m in res.marks] == [6, 12]
    assert all(m.cpu_s > 0 and m.checkpoint_bytes > 0 and 1 <= m.files <= res.files_bound for m in res.marks)
    early, late = res.marks
    grown = longrun.Result(2000, [early, dataclasses.replace(early, day=2000, cpu_s=early.cpu_s * 1.3)])
    assert not grown.flat and "NOT flat" in longrun.verdict(grown)
    bigger = longrun.Result(2000, [early, dataclasses.replace(early, day=2000,
                                                              checkpoint_bytes=early.checkpoint_bytes * 2)])
    assert not bigger.flat
    kept_all = longrun.Result(2000, [early, dataclasses.replace(early, day=2000, files=2000)])
    assert not kept_all.flat
    same = longrun.Result(2000, [early, dataclasses.replace(early, day=2000)])
    assert same.flat and longrun.verdict(same).startswith("flat: ")
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n")
    monkeypatch.setattr(longrun, "DOCS", docs)
    longrun.write(same)
    text = docs.read_text()
    assert text.count(longrun.BEGIN) == 1 and "| 2,000 |" in text
    assert longrun.BEGIN in run.mutation_block(docs)  # `make bench` carries the block over
