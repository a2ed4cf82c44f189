"""Config validation: every bad value fails before any resource, naming the key, the value and the rule."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from infra import config, render
from infra.config import ConfigError


def load(stack: str = "dev", **overrides: Any) -> config.StackConfig:
    return config.load(render.stack_config(stack, overrides), stack=stack)


def test_a_new_stack_needs_only_gcp_project() -> None:
    values = render.stack_config("brand-new")  # no stacks/Pulumi.brand-new.yaml: Pulumi.yaml defaults only
    del values["gcp:project"]
    with pytest.raises(ConfigError, match="gcp:project") as err:
        config.load(values, stack="brand-new")
    assert str(err.value).startswith("config gcp:project=None is not allowed: set it with `pulumi config set")

    cfg = config.load({**values, "gcp:project": "my-project"}, stack="brand-new")
    assert cfg.project_id == "my-project"
    assert cfg.cluster.mode == "autopilot" and cfg.gpu.type == "nvidia-l4"
    assert cfg.labels.as_dict() == {"env": "brand-new", "app": "spot-trainer", "team": "ml-platform"}


def test_every_stack_is_protected_unless_it_allows_data_loss() -> None:
    """A new zone replaces the share: no stack loses its data to a routine change unless it says so."""
    assert load("brand-new").cluster.deletion_protection is True
    assert load("dev").cluster.deletion_protection is True
    assert load("prod").cluster.deletion_protection is True
    assert load("dev", allowDataLoss=True).cluster.deletion_protection is False


def test_the_retired_protection_key_says_what_replaced_it() -> None:
    with pytest.raises(ConfigError) as err:
        load("dev", deletionProtection=False)
    assert "'spot-trainer:deletionProtection' was retired" in str(err.value)
    assert "spot-trainer:allowDataLoss=true" in str(err.value) and "\n" not in str(err.value)


def test_stack_files_only_use_declared_keys() -> None:
    """A typo in a stack file (``paralelism``) would be silently ignored: refuse undeclared keys."""
    project = yaml.safe_load((render.REPO_ROOT / "Pulumi.yaml").read_text())
    declared = {f"{project['name']}:{key}" for key in project["config"]}
    for stack in render.stack_names():
        keys = (yaml.safe_load((render.STACKS_DIR / f"Pulumi.{stack}.yaml").read_text()) or {})["config"]
        own = {k for k in keys if k.startswith(project["name"] + ":")}
        assert own <= declared, f"stacks/Pulumi.{stack}.yaml: undeclared keys {sorted(own - declared)}"


BAD_VALUES = [
    # (overrides, key in the message, value in the message, what the message says is allowed)
    ({"gpuType": "nvidia-tesla-k80"}, "gpuType", "'nvidia-tesla-k80'", "end-of-life on GKE since 2024-05-01"),
    ({"gpuType": "nvidia-rtx-4090"}, "gpuType", "'nvidia-rtx-4090'", "one of nvidia-l4, nvidia-tesla-t4"),
    ({"gpuCount": 3}, "gpuCount", "3", "for nvidia-l4 one of 1, 2, 4, 8"),
    ({"gpuType": "nvidia-tesla-t4", "gpuCount": 8}, "gpuCount", "8", "for nvidia-tesla-t4 one of 1, 2, 4"),
    ({"gpuCount": 0}, "gpuCount", "0", "an integer >= 1"),
    ({"clusterMode": "hybrid"}, "clusterMode", "'hybrid'", "one of autopilot, standard"),
    ({"zone": "us-east1-b"}, "zone", "'us-east1-b'", "a zone of region 'us-central1'"),
    ({"region": "Central US"}, "region", "'Central US'", "a GCP region"),
    (
        {"filestoreCapacityGb": 1000},
        "filestoreCapacityGb",
        "1000",
        "between 1024 and 65434 GiB for tier BASIC_HDD",
    ),
    (
        {"filestoreTier": "BASIC_SSD", "filestoreCapacityGb": 1024},
        "filestoreCapacityGb",
        "1024",
        "between 2560 and 65434 GiB for tier BASIC_SSD",
    ),
    ({"filestoreTier": "PREMIUM"}, "filestoreTier", "'PREMIUM'", "one of BASIC_HDD, BASIC_SSD, ZONAL"),
    ({"filestoreShare": "My-Share"}, "filestoreShare", "'My-Share'", "a share name"),
    ({"parallelism": 0}, "parallelism", "0", "an integer >= 1"),
    ({"parallelism": "two"}, "parallelism", "'two'", "an integer"),
    ({"onDemandFallback": "maybe"}, "onDemandFallback", "'maybe'", "true or false"),
    (
        {"onDemandFallback": True, "clusterMode": "standard"},
        "onDemandFallback",
        "True",
        "only a compute class can fall back",
    ),
    (
        {"onDemandFallback": True, "gpuCapacity": "nodeSelector"},
        "onDemandFallback",
        "True",
        "only a compute class can fall back",
    ),
    ({"gpuCapacity": "anything"}, "gpuCapacity", "'anything'", "one of computeClass, nodeSelector"),
    ({"trainOn": "tpu"}, "trainOn", "'tpu'", "one of gpu, cpu"),
    ({"trainOn": "cpu", "clusterMode": "standard", "gpuCapacity": "nodeSelector"}, "trainOn", "'cpu'",
     "gpu unless clusterMode=autopilot"),
    ({"trainOn": "cpu", "onDemandFallback": True}, "onDemandFallback", "True", "false with trainOn=cpu"),
    ({"jobAwait": "forever"}, "jobAwait", "'forever'", "one of wait, skip"),
    ({"jobTimeoutMinutes": 0}, "jobTimeoutMinutes", "0", "an integer >= 1"),
    ({"releaseChannel": "BETA"}, "releaseChannel", "'BETA'", "one of RAPID, REGULAR, STABLE"),
    ({"allowDataLoss": "yes"}, "allowDataLoss", "'yes'", "true or false"),
    ({"team": "ML Platform"}, "team", "'ML Platform'", "a GCP label value"),
    ({"env": "Prod!"}, "env", "'Prod!'", "a GCP label value"),
    ({"redisImage": "redis:7.4"}, "redisImage", "'redis:7.4'", "an image by digest"),
    ({"runs": {}}, "runs", "{}", "a map of run name to hyperparameters"),
    # The old list form is refused with its translation into the new one.
    ({"runs": ["main", "wide"]}, "runs", "['main', 'wide']", "the old list form is now a map: {main: {}, wide: {}}"),
    # The worker's own rules (workload.model.hparams.parse_runs), with the run and the key named.
    ({"runs": {"main": {}, "../x": {}}}, "runs", "{'main': {}, '../x': {}}", "run name '../x' is not allowed"),
    ({"runs": {"w": {"hidden": "64"}}}, "runs", "{'w': {'hidden': '64'}}", "run 'w': hidden='64' is not allowed"),
    ({"runs": {"e": {"epochs": 2.7}}}, "runs", "{'e': {'epochs': 2.7}}", "run 'e': epochs=2.7 is not allowed"),
    ({"runs": {"m": {"lrate": 0.1}}}, "runs", "{'m': {'lrate': 0.1}}", "run 'm': unknown key(s) ['lrate']"),
    ({"runs": {"a": {"seed": 1}, "b": {"seed": 1}}}, "runs", "{'a': {'seed': 1}, 'b': {'seed': 1}}",
     "runs 'a' and 'b' have the same hyperparameters"),
    ({"datasetUri": "s3://acme/fraud"}, "datasetUri", "'s3://acme/fraud'", "a Cloud Storage location gs://"),
    ({"datasetUri": "gs://Acme/fraud"}, "datasetUri", "'gs://Acme/fraud'", "a valid bucket name"),
    ({"datasetUri": "gs://ab/fraud"}, "datasetUri", "'gs://ab/fraud'", "a valid bucket name"),
    ({"datasetUri": "gs://google-data/x"}, "datasetUri", "'gs://google-data/x'", "no 'goog' prefix"),
    ({"datasetUri": "gs://acme/a/../b"}, "datasetUri", "'gs://acme/a/../b'", "no empty, '.' or '..' parts"),
    ({"outputUri": "gs://acme-results"}, "outputUri", "'gs://acme-results'", "with a prefix: the training pods"),
    ({"outputUri": "gs://acme/out*"}, "outputUri", "'gs://acme/out*'", "spaces, quotes or wildcards"),
    ({"outputUri": "gs://acme/o'ut"}, "outputUri", '"gs://acme/o\'ut"', "spaces, quotes or wildcards"),
    ({"datasetName": "../fraud"}, "datasetName", "'../fraud'", "a dataset name: 1-63 letters, digits"),
    ({"network": "shared-vpc"}, "subnetwork", "''", "set both network and subnetwork"),
    ({"workerMemory": "16 GB"}, "workerMemory", "'16 GB'", "a Kubernetes quantity"),
    # Values the image reads are checked against what it accepts (infra/contract.py, tests/test_contract.py).
    ({"datasetPreset": "huge"}, "datasetPreset", "'huge'", "one of small, cluster"),
    # Capacities off the tier's steps: Filestore refuses them only after the cluster is built.
    (
        {"filestoreTier": "ZONAL", "filestoreCapacityGb": 1100},
        "filestoreCapacityGb",
        "1100",
        "a multiple of 256 GiB from 1024 GiB for tier ZONAL (1024 or 1280)",
    ),
    (
        {"filestoreTier": "REGIONAL", "filestoreCapacityGb": 11000},
        "filestoreCapacityGb",
        "11000",
        "a multiple of 2560 GiB from 10240 GiB for tier REGIONAL (10240 or 12800)",
    ),
    (
        {"filestoreTier": "ENTERPRISE", "filestoreCapacityGb": 2000},
        "filestoreCapacityGb",
        "2000",
        "a multiple of 256 GiB",
    ),
    ({"pinToShareZone": "always"}, "pinToShareZone", "'always'", "one of auto, true, false"),
    (
        {"filestoreTier": "REGIONAL", "pinToShareZone": True},
        "pinToShareZone",
        "'true'",
        "a REGIONAL share spans the region's zones",
    ),
]


@pytest.mark.parametrize(("overrides", "key", "value", "allowed"), BAD_VALUES, ids=lambda v: str(v)[:40])
def test_bad_value_is_named_with_what_is_allowed(
    overrides: dict[str, Any], key: str, value: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load("dev", **overrides)
    message = str(err.value)
    assert err.value.key == key
    assert f"spot-trainer:{key}={value} is not allowed" in message
    assert allowed in message


def test_bad_config_fails_before_any_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    monkeypatch.setattr(render, "build", lambda cfg: built.append(cfg) or {})
    with pytest.raises(ConfigError, match="nvidia-tesla-k80"):
        render.render("dev", {"gpuType": "nvidia-tesla-k80"})
    assert built == []


@pytest.mark.parametrize("gpu_type", sorted(config.GPU_MACHINE_TYPES))
def test_every_allowed_gpu_type_loads(gpu_type: str) -> None:
    assert load("dev", gpuType=gpu_type).gpu.type == gpu_type


def test_zonal_and_regional_filestore_tiers() -> None:
    assert load("dev", filestoreTier="BASIC_HDD").filestore.zonal
    assert not load("dev", filestoreTier="REGIONAL").filestore.zonal


def test_odd_stack_names_give_valid_resource_names() -> None:
    cfg = load("Team_A.Staging", env="staging")
    assert cfg.slug == "team-a-staging"


def test_pods_beyond_one_per_run_are_counted_and_warned_about(monkeypatch) -> None:
    """A run trains on one worker at a time: extra pods are hot standbys that hold a GPU."""
    import pulumi

    assert load("dev", parallelism=3, runs={"a": {}, "b": {}, "c": {}}).jobs.standby_workers == 0
    assert load("dev", parallelism=4, runs={"a": {}, "b": {}}).jobs.standby_workers == 2
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warnings.append(msg))
    render.render("dev", {"parallelism": 3})
    assert any("2 training pod(s) will wait on spot GPUs as hot standbys" in w for w in warnings), warnings
    warnings.clear()
    render.render("dev", {"parallelism": 1})
    assert not any("hot standbys" in w for w in warnings)


def test_runs_are_a_map_checked_like_the_worker_checks_them() -> None:
    cfg = load("dev", runs={"main": {}, "wide": {"hidden": [128, 64]}, "lr3": {"lr": 0.003}})
    assert cfg.jobs.runs == ("lr3", "main", "wide")  # canonical: sorted, so key order changes nothing
    # Exactly what the loader's runs file holds; the worker parses it with the same function.
    from workload.model.hparams import parse_runs

    parsed = parse_runs(json.loads(cfg.jobs.runs_json), where="runs file")
    assert parsed["wide"].hidden == (128, 64) and parsed["lr3"].lr == 0.003
    assert len({hp.seed for hp in parsed.values()}) == 3  # distinct seeds for runs that name none
    assert load("dev").jobs.runs == ("main",)  # Pulumi.yaml's default


@pytest.mark.parametrize(
    ("value", "bucket", "prefix", "uri"),
    [
        ("gs://acme-fraud", "acme-fraud", "", "gs://acme-fraud"),
        ("gs://acme-fraud/", "acme-fraud", "", "gs://acme-fraud"),
        ("gs://acme_fraud/exports/2024/", "acme_fraud", "exports/2024", "gs://acme_fraud/exports/2024"),
        ("gs://data.acme.example/x", "data.acme.example", "x", "gs://data.acme.example/x"),
    ],
)
def test_dataset_uri_is_parsed_into_bucket_and_prefix(value: str, bucket: str, prefix: str, uri: str) -> None:
    data = load("dev", datasetUri=value).data
    assert data.dataset == config.GcsUri(bucket, prefix) and data.dataset.uri == uri
    assert data.output is None


def test_output_uri_names_the_objects_the_grant_is_limited_to() -> None:
    output = load("dev", outputUri="gs://acme-results/spot/dev/").data.output
    assert output is not None and output.uri == "gs://acme-results/spot/dev"
    # The trailing slash: "spot/dev" must not also match "spot/dev-other/".
    assert output.objects == "projects/_/buckets/acme-results/objects/spot/dev/"
    assert load("dev").data == config.DataConfig(dataset=None, output=None)


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        ({}, "fraud"),  # simulated: seed's default name, where earlier deployments put it
        ({"datasetUri": "gs://acme-fraud/exports/Q1+2024/"}, "Q1-2024"),
        ({"datasetUri": "gs://acme-fraud"}, "acme-fraud"),
        ({"datasetUri": "gs://acme-fraud/x", "datasetName": "fraud-v2"}, "fraud-v2"),
    ],
)
def test_the_dataset_name_follows_the_data_unless_set(overrides: dict[str, str], name: str) -> None:
    assert load("dev", **overrides).data.dataset_name == name


# Pulumi's own check of a typed default (sdk/go/common/workspace/project.go, ValidateConfigValue): the CLI
# refuses a Pulumi.yaml whose default does not have its declared type, before our program runs.
_PULUMI_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}


def test_every_declared_default_has_its_declared_type() -> None:
    project = yaml.safe_load((render.REPO_ROOT / "Pulumi.yaml").read_text())
    for key, spec in project["config"].items():
        assert spec["type"] in _PULUMI_TYPES, f"{key}: type {spec['type']!r} is not one Pulumi knows"
        assert spec.get("description"), f"{key}: say what it means"
        default = spec["default"]
        assert isinstance(default, _PULUMI_TYPES[spec["type"]]), f"{key}: default {default!r} is not {spec['type']}"
        if spec["type"] == "integer":
            assert not isinstance(default, bool), key
        if spec["type"] == "array":
            item = _PULUMI_TYPES[spec["items"]["type"]]
            assert all(isinstance(i, item) for i in default), key


@pytest.mark.parametrize(
    ("tier", "capacity"),
    [("BASIC_HDD", 1000 + 24), ("BASIC_HDD", 1100), ("ZONAL", 1280), ("ZONAL", 12800), ("ENTERPRISE", 10240)],
)
def test_capacities_on_the_tier_steps_load(tier: str, capacity: int) -> None:
    assert load("dev", filestoreTier=tier, filestoreCapacityGb=capacity).filestore.capacity_gb == capacity


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("spot-trainer:paralelism", "config key 'spot-trainer:paralelism' is not a setting of spot-trainer; "
         "did you mean spot-trainer:parallelism?"),
        ("spot-trainer:gpu_type", "did you mean spot-trainer:gpuType?"),
        ("spot-trainer:colour", "config key 'spot-trainer:colour' is not a setting of spot-trainer; see Pulumi.yaml"),
    ],
)
def test_an_unknown_project_key_is_named_with_the_closest_setting(key: str, message: str) -> None:
    """Under the engine too: ``load`` reads every key the language host was given."""
    values = {**render.stack_config("dev"), key: "3"}
    with pytest.raises(ConfigError) as err:
        config.load(values, stack="dev")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_keys_of_other_packages_are_left_to_them() -> None:
    values = {**render.stack_config("dev"), "gcp:zone": "us-central1-b", "kubernetes:context": "x"}
    assert config.load(values, stack="dev").project_id == render.FAKE_PROJECT_ID


def test_unknown_keys_are_found_in_the_engines_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``config=``, the keys come from the runtime (set_all_config / PULUMI_CONFIG)."""
    import json

    from pulumi.runtime import config as runtime_config

    values = {**render.stack_config("dev"), "spot-trainer:paralelism": "3"}
    token = runtime_config.CONFIG.set({})
    try:
        monkeypatch.setenv("PULUMI_CONFIG", json.dumps(values))
        monkeypatch.setattr(config.pulumi, "get_stack", lambda: "dev")
        with pytest.raises(ConfigError, match="did you mean spot-trainer:parallelism"):
            config.load()
    finally:
        runtime_config.CONFIG.reset(token)


def test_the_engines_config_reads_as_the_same_values_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pulumi up` passes no mapping: every key, the project's and gcp's, is read through pulumi.Config."""
    import json

    from pulumi.runtime import config as runtime_config
    from pulumi.runtime import settings

    values = render.stack_config("dev")
    token = runtime_config.CONFIG.set({})
    try:
        monkeypatch.setenv("PULUMI_CONFIG", json.dumps(values))
        monkeypatch.setattr(config.pulumi, "get_stack", lambda: "dev")
        monkeypatch.setattr(settings.SETTINGS, "project", config.PROJECT)  # what Pulumi.yaml names
        assert config.load() == config.load(values, stack="dev")
    finally:
        runtime_config.CONFIG.reset(token)


def _write_stack(tmp_path, monkeypatch: pytest.MonkeyPatch, text: str) -> str:
    stacks = tmp_path / "stacks"
    stacks.mkdir(exist_ok=True)
    (stacks / "Pulumi.qa.yaml").write_text(text)
    monkeypatch.setattr(render, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(render, "STACKS_DIR", stacks)
    (tmp_path / "Pulumi.yaml").write_text((config.PROJECT_FILE).read_text())
    return "qa"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "config:\n  spot-trainer:paralelism: 3\n",
            "stacks/Pulumi.qa.yaml: config key 'spot-trainer:paralelism' is not a setting of spot-trainer; "
            "did you mean spot-trainer:parallelism?",
        ),
        (
            "config:\n  parallelism: 3\n",
            "stacks/Pulumi.qa.yaml: config key 'parallelism' has no namespace: write 'spot-trainer:parallelism'",
        ),
        (
            "config:\n  paralelism: 3\n",
            "stacks/Pulumi.qa.yaml: config key 'paralelism' has no namespace: write 'spot-trainer:parallelism'",
        ),
        (
            "config:\n  spot-trainer:parallelism: 3\n   spot-trainer:jobAwait: skip\n",
            "stacks/Pulumi.qa.yaml: not valid YAML at line 3, column",
        ),
        ("config: [a, b]\n", "stacks/Pulumi.qa.yaml: expected a mapping with a `config:` mapping"),
    ],
    ids=["typo", "no-namespace", "both", "yaml", "shape"],
)
def test_stack_file_mistakes_name_the_file(tmp_path, monkeypatch: pytest.MonkeyPatch, text: str, message: str) -> None:
    stack = _write_stack(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError) as err:
        render.stack_config(stack)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("config:\n  spot-trainer:datasetPreset: huge\n",
         "error: config spot-trainer:datasetPreset='huge' is not allowed: one of small, cluster"),
        ("config:\n  spot-trainer:paralelism: 3\n",
         "error: stacks/Pulumi.qa.yaml: config key 'spot-trainer:paralelism' is not a setting of spot-trainer; "
         "did you mean spot-trainer:parallelism?"),
        ("config:\n  parallelism: 3\n",
         "error: stacks/Pulumi.qa.yaml: config key 'parallelism' has no namespace: write 'spot-trainer:parallelism'"),
        ("config:\n  spot-trainer:jobAwait: [wait\n",
         "error: stacks/Pulumi.qa.yaml: not valid YAML at line 3, column 1:"),
    ],
    ids=["value", "unknown-key", "no-namespace", "yaml"],
)
def test_make_render_reports_each_mistake_in_one_line(tmp_path, monkeypatch, capsys, text, expected) -> None:
    """``make render STACK=qa`` is ``python -m policy.offline qa``: exit 2 and one line on stderr."""
    from policy import offline

    stack = _write_stack(tmp_path, monkeypatch, text)
    assert offline.main([stack, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1, err


def test_make_render_works_for_a_stack_without_a_file(tmp_path, capsys) -> None:
    from policy import offline

    assert not render.stack_file("staging").exists()
    assert offline.main(["staging", "--out", str(tmp_path)]) == 0
    assert "staging:" in capsys.readouterr().out
    assert (tmp_path / "inventory.json").is_file()


def test_make_render_refuses_a_stack_name_unfit_for_pulumi(capsys) -> None:
    from policy import offline

    with pytest.raises(SystemExit) as exit_:
        offline.main(["../etc"])
    assert exit_.value.code == 2
    assert "stack name '../etc' is not allowed" in capsys.readouterr().err


def test_preview_checks_runs_without_the_workers_heavy_dependencies() -> None:
    """`pulumi preview` installs infra/requirements.txt only: the worker rules config.py borrows
    (workload.model.hparams, workload.share.paths) must load without torch, numpy or pandas."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules.update({m: None for m in ('torch', 'numpy', 'pandas', 'pyarrow', 'redis')}); "
        "from infra import config, render; "
        "runs = {'main': {}, 'w': {'hidden': [8]}}; "
        "values = render.stack_config('dev', {'runs': runs, 'datasetUri': 'gs://a-b/c'}); "
        "print(config.load(values, stack='dev').jobs.runs)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=render.REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "('main', 'w')"


def test_the_loader_reads_the_files_through_the_stacks_column_mapping_and_date_format(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from infra import jobs
    from workload import cli
    from workload.data.reading import Reading

    assert jobs.loader_env(load("dev").data) is None, "unset: the loader reads our names and ISO 8601"
    cfg = load("dev", datasetColumns=json.dumps({"ts": "TX_DATETIME", "card_id": "CUSTOMER_ID"}),
               datasetDatetimeFormat="%d/%m/%Y %H:%M")
    env = {e["name"]: e["value"] for e in jobs.loader_env(cfg.data)}
    assert env == {"DATASET_COLUMNS": '{"card_id": "CUSTOMER_ID", "ts": "TX_DATETIME"}',
                   "DATASET_DATETIME_FORMAT": "%d/%m/%Y %H:%M"}
    for name, value in env.items():  # what the loader pod's `seed` makes of them
        monkeypatch.setenv(name, value)
    args = cli.parser().parse_args(["seed", "--datasets", "gs://acme-fraud/exports"])
    assert cli.data_reading(args) == Reading(columns=(("card_id", "CUSTOMER_ID"), ("ts", "TX_DATETIME")),
                                             datetime_format="%d/%m/%Y %H:%M")


@pytest.mark.parametrize(("overrides", "key", "message"), [
    ({"datasetColumns": '{"card_id": "CARD"}'}, "datasetColumns", "'card_id' maps to unknown column 'CARD'"),
    ({"datasetColumns": '{"a": "CUSTOMER_ID", "b": "CUSTOMER_ID"}'}, "datasetColumns",
     "both 'a' and 'b' map to CUSTOMER_ID"),
    ({"datasetColumns": '["card_id"]'}, "datasetColumns", "expected a mapping of your column names to ours"),
    ({"datasetDatetimeFormat": "%Y"}, "datasetDatetimeFormat", "strftime directives with the day and month"),
])
def test_a_bad_column_mapping_or_date_format_fails_preview_naming_the_key(overrides: dict[str, str], key: str,
                                                                        message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load("dev", **overrides)
    assert str(err.value).startswith(f"config spot-trainer:{key}=") and message in str(err.value), str(err.value)
