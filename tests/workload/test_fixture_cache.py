"""harness.built_once: `make mutation` trains an expensive fixture once for all of a group's mutants, and only
with no mutant active; the copies read as if built where they are."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import FIXTURE_CACHE_ENV, built_once


def builder(calls: list[Path]):
    def build(target: Path) -> None:
        calls.append(target)
        (target / "share").mkdir(parents=True)
        (target / "share" / "report.txt").write_text(f"model checkpoint: {target}/share/ckpt.pt\n")
        (target / "share" / "weights.bin").write_bytes(str(target).encode())  # not text: copied as it is

    return build


def test_without_the_harness_every_session_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FIXTURE_CACHE_ENV, raising=False)
    calls: list[Path] = []
    for name in ("a", "b"):
        assert built_once("sweep", tmp_path / name, builder(calls)) == tmp_path / name
    assert calls == [tmp_path / "a", tmp_path / "b"]


def test_a_clean_session_fills_the_cache_and_later_ones_copy_it_relocated(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FIXTURE_CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    calls: list[Path] = []
    monkeypatch.setenv("MUTANT_UNDER_TEST", "stats")
    built_once("sweep", tmp_path / "first", builder(calls))
    monkeypatch.setenv("MUTANT_UNDER_TEST", "workload.model.export.x_load_model__mutmut_3")
    second = built_once("sweep", tmp_path / "second", builder(calls))
    assert calls == [tmp_path / "first"]
    assert (second / "share" / "report.txt").read_text() == f"model checkpoint: {second}/share/ckpt.pt\n"
    assert (second / "share" / "weights.bin").read_bytes() == str(tmp_path / "first").encode()
    assert sorted(p.name for p in second.rglob("*")) == ["report.txt", "share", "weights.bin"]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["sweep"]


def test_a_session_with_a_mutant_active_never_fills_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FIXTURE_CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("MUTANT_UNDER_TEST", "workload.model.export.x_load_model__mutmut_3")
    calls: list[Path] = []
    built_once("sweep", tmp_path / "a", builder(calls))
    built_once("sweep", tmp_path / "b", builder(calls))
    assert calls == [tmp_path / "a", tmp_path / "b"]
    assert not any((tmp_path / "cache").iterdir())
