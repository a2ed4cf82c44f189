"""The Pulumi program and the worker image agree: env names, CLI verbs, presets, uid, mount path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra import contract
from workload import cli, simulator

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("name", "verb", "value", "attr", "expected"), [
    (contract.ENV_SHARE_DIR, "worker", "/x/share", "share", Path("/x/share")),
    (contract.ENV_REDIS_URL, "worker", "redis://r:6379/0", "redis_url", "redis://r:6379/0"),
    (contract.ENV_WORKER_ID, "worker", "pod-7", "worker_id", "pod-7"),
    (contract.ENV_LEASE_TTL, "worker", "45", "lease_ttl", 45.0),
    (contract.ENV_CHECKPOINT_INTERVAL, "worker", "12", "checkpoint_interval", 12.0),
    (contract.ENV_MAX_ATTEMPTS, "seed", "9", "max_attempts", 9),
    (contract.ENV_RUNS_FILE, "seed", "/etc/x/runs.json", "runs_file", "/etc/x/runs.json"),
    (contract.ENV_DATASETS_SRC, "seed", "gs://acme/fraud", "datasets", "gs://acme/fraud"),
])
def test_every_env_var_the_jobs_set_is_read_by_the_cli(monkeypatch, name, verb, value, attr, expected) -> None:
    monkeypatch.setenv(name, value)
    assert getattr(cli.parser().parse_args([verb]), attr) == expected


def test_the_password_variable_is_the_one_the_queue_client_reads() -> None:
    assert f'env("{contract.ENV_REDIS_PASSWORD}")' in (ROOT / "workload" / "cli.py").read_text()


def test_job_arguments_parse_and_name_a_real_preset() -> None:
    for preset in simulator.PRESETS:
        args = cli.parser().parse_args(contract.loader_args("fraud", preset, None))
        assert args.command == "seed" and args.preset == preset and args.runs_file == contract.RUNS_FILE
        assert args.dataset == "fraud" and not args.datasets and not args.run
    args = cli.parser().parse_args(contract.loader_args("exports", "cluster", "gs://acme-fraud/exports"))
    assert args.datasets == "gs://acme-fraud/exports" and args.runs_file == contract.RUNS_FILE
    assert args.dataset == "exports"


def test_simulated_data_keeps_the_dataset_name_seed_uses_by_default() -> None:
    """A stack deployed before datasetName existed must find its dataset where seed put it."""
    from infra import config

    assert config.SIMULATED_DATASET == cli.DEFAULT_DATASET


def test_the_runs_file_the_stack_mounts_is_what_seed_reads(tmp_path: Path) -> None:
    """The ConfigMap holds the stack's `runs` as infra.config wrote it; seed's loader parses it strictly."""
    from infra import config, render

    cfg = config.load(render.stack_config("dev", {"runs": {"main": {}, "wide": {"hidden": [128, 64]}}}), "dev")
    runs_file = tmp_path / contract.RUNS_KEY
    runs_file.write_text(cfg.jobs.runs_json)
    args = cli.parser().parse_args(["seed", "--runs-file", str(runs_file)])
    runs = cli.load_runs(args)
    assert set(runs) == {"main", "wide"} and runs["wide"].hidden == (128, 64)
    assert cli.parser().parse_args(contract.WORKER_ARGS).command == "worker"
    assert cli.parser().parse_args(contract.STATUS_ARGS).command == "status"


def test_the_image_runs_as_the_uid_the_pods_require() -> None:
    dockerfile = (ROOT / contract.IMAGE_DOCKERFILE).read_text()
    assert re.search(rf"^USER {contract.WORKLOAD_UID}:{contract.WORKLOAD_UID}$", dockerfile, re.M)
    assert f"SHARE_DIR={contract.SHARE_DIR}" in dockerfile
    assert (ROOT / contract.IMAGE_CONTEXT / "requirements.txt").is_file()
    assert 'ENTRYPOINT ["python", "-m", "workload"]' in dockerfile
