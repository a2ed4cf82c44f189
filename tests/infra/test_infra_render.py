"""The render helper itself: it runs the real entry point, and failures inside the program surface."""

from __future__ import annotations

import runpy

import pulumi
import pytest
import yaml

from infra import render


def test_the_entry_point_runs_under_mocks() -> None:
    """``infra/__main__.py`` as the CLI runs it: config from the runtime, imports from the repo root."""
    values = render.stack_config("dev")
    resources = render.run_mocked(
        "dev", values, lambda: runpy.run_path(str(render.REPO_ROOT / "infra"), run_name="__main__")
    )
    types = {r.type for r in resources}
    assert {"gcp:container/cluster:Cluster", "kubernetes:batch/v1:Job", "docker-build:index:Image"} <= types


def test_an_error_inside_an_output_fails_the_render(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs are awaited: a failure in an apply is not lost in a background task."""

    def broken(cfg: object) -> dict[str, object]:
        return {"x": pulumi.Output.from_input(1).apply(lambda _: 1 / 0)}

    monkeypatch.setattr(render, "build", broken)
    with pytest.raises(ZeroDivisionError):
        render.render("dev")


def test_manifests_need_api_version_and_kind() -> None:
    bare = render.Registered("kubernetes:core/v1:Pod", "p", "urn:x", "id", {}, {}, "", "", [], {}, False)
    with pytest.raises(ValueError, match="apiVersion"):
        render.to_manifest(bare)


def test_command_line_prints_the_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main(["dev", "parallelism=3"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    training = next(d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].endswith("worker"))
    assert training["spec"]["parallelism"] == 3


def test_command_line_reports_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main(["dev", "gpuType=nvidia-tesla-k80"]) == 2
    assert "spot-trainer:gpuType='nvidia-tesla-k80'" in capsys.readouterr().err
