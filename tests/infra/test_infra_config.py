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


# --- Each rule at its edge, and each refusal as the exact line a user reads (key, value seen, what is allowed).

def refusal(**overrides: Any) -> str:
    """The one line a config with ``overrides`` is refused with."""
    with pytest.raises(ConfigError) as err:
        load("dev", **overrides)
    assert "\n" not in str(err.value)
    return str(err.value)


# Every rule a refused name may have broken, so the line says why whichever it was (a name with "google" inside
# has no 'goog' prefix; a dotted name may be longer than 63).
BUCKET_RULE = ("with a valid bucket name: 3-63 lowercase letters, digits, '-', '_' or '.' (up to 222 with dots, each "
               "dot-separated part at most 63), starting and ending with a letter or digit, not an IP address, no "
               "'goog' prefix, no 'google' or 'g00gle' inside (cloud.google.com/storage/docs/buckets#naming)")
DOTTED_222 = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 30])  # 222 characters, each part at most 63


@pytest.mark.parametrize("bucket", [
    "abc", "a.b", "a" * 63, "a" * 63 + "." + "b" * 63, "b." + "a" * 63, DOTTED_222, "a_b-c.d", "goo-data",
    "my-goog-data", "1.2.3", "1.2.3.4.5", "192.168.5.4a",
], ids=lambda b: f"{b[:12]}..{len(b)}")
def test_bucket_names_cloud_storage_accepts_are_accepted(bucket: str) -> None:
    data = load("dev", datasetUri=f"gs://{bucket}/x", outputUri=f"gs://{bucket}/out").data
    assert data.dataset == config.GcsUri(bucket, "x") and data.output == config.GcsUri(bucket, "out")


@pytest.mark.parametrize("bucket", [
    "ab", "a" * 64, "a" * 64 + ".b", "b." + "a" * 64, "a..b", ".ab", "ab.", "a-", DOTTED_222 + "d", "Acme",
    "a b", "192.168.5.4", "0.0.0.0", "goog", "goog-data", "googdata.example", "google", "acme-google",
    "data.google.example", "g00gle", "my-g00gle-data",
], ids=lambda b: f"{b[:12]}..{len(b)}")
def test_bucket_names_cloud_storage_refuses_are_refused(bucket: str) -> None:
    value = f"gs://{bucket}/x"
    assert refusal(datasetUri=value) == (
        f"config spot-trainer:datasetUri={value!r} is not allowed: gs://<bucket>[/<prefix>] {BUCKET_RULE}")
    assert refusal(outputUri=value) == (
        f"config spot-trainer:outputUri={value!r} is not allowed: gs://<bucket>/<prefix> {BUCKET_RULE}")


def test_a_location_that_is_not_gs_shows_the_shape_each_key_needs() -> None:
    assert refusal(datasetUri="s3://acme/x") == ("config spot-trainer:datasetUri='s3://acme/x' is not allowed: "
                                                 "a Cloud Storage location gs://<bucket>[/<prefix>] (or empty)")
    assert refusal(outputUri="acme/x") == ("config spot-trainer:outputUri='acme/x' is not allowed: "
                                           "a Cloud Storage location gs://<bucket>/<prefix> (or empty)")
    assert refusal(outputUri="gs://acme/") == ("config spot-trainer:outputUri='gs://acme/' is not allowed: "
                                               "gs://<bucket>/<prefix> with a prefix: the training pods get write "
                                               "access to that prefix only")


@pytest.mark.parametrize("prefix", ["a//b", "./b", "a/.", "a/../b", "a b", "a\tb", "a*", "a?", "a[0]", "a#",
                                    "o'ut", 'o"ut', "a`b`", "$HOME", "a\\b"])
def test_a_prefix_with_empty_parts_wildcards_or_shell_characters_is_refused(prefix: str) -> None:
    value = f"gs://acme/{prefix}"
    assert refusal(datasetUri=value) == (
        f"config spot-trainer:datasetUri={value!r} is not allowed: gs://<bucket>[/<prefix>] whose prefix has no "
        "empty, '.' or '..' parts, spaces, quotes or wildcards")


def test_a_location_is_split_into_bucket_and_prefix_without_its_slashes() -> None:
    assert config.GcsUri.split("gs://acme/Xdata/2024X/") == config.GcsUri("acme", "Xdata/2024X")
    assert config.GcsUri.split("gs://acme") == config.GcsUri("acme", "")
    assert config.GcsUri.split("s3://acme/x") is None and config.GcsUri.split("GS://acme/x") is None
    data = load("dev", datasetUri="  gs://acme/Xdata/v1.2_~@=/  ", outputUri="gs://acme/X/").data
    assert data.dataset == config.GcsUri("acme", "Xdata/v1.2_~@=") and data.output == config.GcsUri("acme", "X")
    assert data.dataset.objects == "projects/_/buckets/acme/objects/Xdata/v1.2_~@=/"
    assert config.GcsUri("acme", "").objects == "projects/_/buckets/acme/objects/"
    assert load("dev", datasetUri="   ").data.dataset is None


@pytest.mark.parametrize(("uri", "name"), [
    ("gs://acme/a/b/c", "c"),
    ("gs://acme/exports/v1/_-.data_", "data_"),
    ("gs://acme/exports/Xray", "Xray"),
    ("gs://acme/exports/" + "d" * 64, "d" * 63),
    ("gs://acme/exports/___", "fraud"),
    ("gs://acme.example.com", "acme.example.com"),
])
def test_the_default_dataset_name_is_the_last_folder_made_a_folder_name(uri: str, name: str) -> None:
    assert load("dev", datasetUri=uri).data.dataset_name == name


def test_a_dataset_name_is_one_folder_name() -> None:
    assert load("dev", datasetName="v2.X_y-1").data.dataset_name == "v2.X_y-1"
    assert refusal(datasetName="-v2") == ("config spot-trainer:datasetName='-v2' is not allowed: a dataset name: "
                                          "1-63 letters, digits, '_', '.', '-', starting with a letter or digit")


@pytest.mark.parametrize("blank", ["", "   ", "{}", " {} "])
def test_no_column_mapping_is_the_files_own_names(blank: str) -> None:
    assert load("dev", datasetColumns=blank).data.columns_json == ""


def test_a_column_mapping_is_canonical_json() -> None:
    mapping = {"ts": "TX_DATETIME", "amount": "TX_AMOUNT", "card_id": "CUSTOMER_ID"}
    expected = '{"amount": "TX_AMOUNT", "card_id": "CUSTOMER_ID", "ts": "TX_DATETIME"}'
    assert load("dev", datasetColumns=mapping).data.columns_json == expected  # an object, as the CLI passes it
    assert load("dev", datasetColumns=json.dumps(mapping)).data.columns_json == expected


KNOWN_COLUMNS = ("TRANSACTION_ID, TX_DATETIME, CUSTOMER_ID, TERMINAL_ID, TX_AMOUNT, TX_FRAUD, TX_TIME_SECONDS, "
                 "TX_TIME_DAYS, TX_FRAUD_SCENARIO")


@pytest.mark.parametrize(("value", "message"), [
    ('{"card_id": "CARD"}', "config spot-trainer:datasetColumns={'card_id': 'CARD'} is not allowed: 'card_id' maps "
                            f"to unknown column 'CARD'; allowed: {KNOWN_COLUMNS}"),
    ('{"a": "TX_AMOUNT", "b": "TX_AMOUNT"}', "config spot-trainer:datasetColumns={'a': 'TX_AMOUNT', 'b': "
                                            "'TX_AMOUNT'} is not allowed: both 'a' and 'b' map to TX_AMOUNT; one "
                                            "column per target"),
    ("card_id=CUSTOMER_ID", "config spot-trainer:datasetColumns='card_id=CUSTOMER_ID' is not allowed: expected a "
                            "mapping of your column names to ours, e.g. {card_id: CUSTOMER_ID, ts: TX_DATETIME}; "
                            "saw str"),
    ('["card_id"]', "config spot-trainer:datasetColumns=['card_id'] is not allowed: expected a mapping of your "
                    "column names to ours, e.g. {card_id: CUSTOMER_ID, ts: TX_DATETIME}; saw list"),
    ('{"a": 1}', "config spot-trainer:datasetColumns={'a': 1} is not allowed: 'a': 1: column names must be text"),
])
def test_a_bad_column_mapping_is_one_exact_line(value: str, message: str) -> None:
    assert refusal(datasetColumns=value) == message


@pytest.mark.parametrize(("value", "fmt"), [("", ""), ("  ", ""), (" %d/%m/%Y ", "%d/%m/%Y"),
                                            ("epoch-ms", "epoch-ms"), ("epoch-s", "epoch-s"), ("%Y-%j", "%Y-%j")])
def test_a_date_format_is_read_trimmed(value: str, fmt: str) -> None:
    assert load("dev", datasetDatetimeFormat=value).data.datetime_format == fmt


def test_a_bad_date_format_is_one_exact_line_and_says_why_below() -> None:
    with pytest.raises(ConfigError) as err:
        load("dev", datasetDatetimeFormat=" %Y %H ")
    assert str(err.value) == ("config spot-trainer:datasetDatetimeFormat='%Y %H' is not allowed: strftime directives "
                              "with the day and month (e.g. '%d/%m/%Y %H:%M'), or epoch-s / epoch-ms")
    # Pulumi prints the traceback, the reader's own words included: they name the key too.
    assert str(err.value.__cause__) == (
        "spot-trainer:datasetDatetimeFormat '%Y %H' is not a date format; give strftime directives with the day and "
        "month (e.g. '%d/%m/%Y %H:%M'), or epoch-s / epoch-ms for numbers")


# (key, lowest allowed, highest allowed or None, where load puts it)
INT_KEYS = [
    ("parallelism", 1, 1000, lambda c: c.jobs.parallelism),
    ("backoffLimit", 0, None, lambda c: c.jobs.backoff_limit),
    ("activeDeadlineSeconds", 60, None, lambda c: c.jobs.active_deadline_seconds),
    ("jobTimeoutMinutes", 1, None, lambda c: c.jobs.timeout_minutes),
    ("loaderTimeoutMinutes", 1, None, lambda c: c.jobs.loader_timeout_minutes),
    ("leaseTtlSeconds", 5, None, lambda c: c.jobs.lease_ttl_seconds),
    ("checkpointIntervalSeconds", 1, None, lambda c: c.jobs.checkpoint_interval_seconds),
    ("maxAttempts", 1, None, lambda c: c.jobs.max_attempts),
    ("infraRetryBudgetMinutes", 1, 1440, lambda c: c.jobs.infra_retry_budget_minutes),
    ("gpuMaxNodes", 1, 100, lambda c: c.gpu.max_nodes),
]


@pytest.mark.parametrize(("key", "low", "high", "read"), INT_KEYS, ids=[k[0] for k in INT_KEYS])
def test_each_integer_setting_is_read_within_its_bounds(key: str, low: int, high: int | None, read) -> None:
    bound = f">= {low}" + (f" and <= {high}" if high is not None else "")
    assert read(load("dev", **{key: low})) == low
    assert read(load("dev", **{key: high or 10**6})) == (high or 10**6)
    assert read(load("dev", **{key: low + 7})) == low + 7  # its own key, not another's
    assert refusal(**{key: low - 1}) == f"config spot-trainer:{key}={low - 1} is not allowed: an integer {bound}"
    if high is not None:
        assert refusal(**{key: high + 1}) == f"config spot-trainer:{key}={high + 1} is not allowed: an integer {bound}"
    assert refusal(**{key: "1.5"}) == f"config spot-trainer:{key}='1.5' is not allowed: an integer"


def test_a_missing_key_is_named() -> None:
    values = render.stack_config("dev")
    del values["spot-trainer:zone"]
    with pytest.raises(ConfigError) as err:
        config.load(values, stack="dev")
    assert str(err.value) == ("config spot-trainer:zone=None is not allowed: the key must be set (Pulumi.yaml "
                              "declares a default for it)")
    with pytest.raises(ConfigError) as err:
        config.load({**values, "spot-trainer:zone": "us-central1-a", "gcp:project": ""}, stack="dev")
    assert str(err.value) == ("config gcp:project='' is not allowed: set it with `pulumi config set gcp:project "
                              "<id>`")


# (key, where load puts it)
BOOL_KEYS = [
    ("privateNodes", lambda c: c.cluster.private_nodes),
    ("allowDataLoss", lambda c: not c.cluster.deletion_protection),
    ("onDemandFallback", lambda c: c.gpu.on_demand_fallback),
    ("checkGpuQuota", lambda c: c.gpu.check_quota),
]


@pytest.mark.parametrize(("key", "read"), BOOL_KEYS, ids=[k[0] for k in BOOL_KEYS])
def test_each_true_or_false_setting_is_read_in_any_letter_case(key: str, read) -> None:
    for value, expected in (("true", True), ("TRUE", True), ("True", True), ("false", False), ("False", False)):
        assert read(load("dev", **{key: value})) is expected, value
    assert refusal(**{key: "Yes"}) == f"config spot-trainer:{key}='yes' is not allowed: true or false"


# (key, every allowed value in the order the message lists them, where load puts it)
CHOICE_KEYS = [
    ("clusterMode", ("autopilot", "standard"), lambda c: c.cluster.mode),
    ("releaseChannel", ("RAPID", "REGULAR", "STABLE"), lambda c: c.cluster.release_channel),
    ("gpuCapacity", ("computeClass", "nodeSelector"), lambda c: c.gpu.capacity),
    ("jobAwait", ("wait", "skip"), lambda c: c.jobs.await_mode),
    ("filestoreTier", ("BASIC_HDD", "BASIC_SSD", "ZONAL", "REGIONAL", "ENTERPRISE"), lambda c: c.filestore.tier),
    ("datasetPreset", ("small", "cluster"), lambda c: c.jobs.dataset_preset),
]


@pytest.mark.parametrize(("key", "allowed", "read"), CHOICE_KEYS, ids=[k[0] for k in CHOICE_KEYS])
def test_each_choice_accepts_exactly_its_values(key: str, allowed: tuple[str, ...], read) -> None:
    extra = {"filestoreCapacityGb": 2560} if key == "filestoreTier" else {}
    for value in allowed:
        assert read(load("dev", **{key: value}, **extra)) == value
    assert refusal(**{key: allowed[0].upper() + "x"}) == (
        f"config spot-trainer:{key}={allowed[0].upper() + 'x'!r} is not allowed: one of {', '.join(allowed)}")
    assert load("dev", jobAwait="skip").jobs.skip_await and not load("dev", jobAwait="wait").jobs.skip_await
    assert not load("dev", clusterMode="standard").cluster.autopilot and load("dev").cluster.autopilot


@pytest.mark.parametrize(("overrides", "message"), [
    ({"zone": "us-central1-ab"}, "config spot-trainer:zone='us-central1-ab' is not allowed: a zone of region "
                                 "'us-central1', such as us-central1-a"),
    ({"zone": "us-central1"}, "config spot-trainer:zone='us-central1' is not allowed: a zone of region "
                              "'us-central1', such as us-central1-a"),
    ({"region": "us-central1-a"}, "config spot-trainer:region='us-central1-a' is not allowed: a GCP region such as "
                                  "us-central1"),
    ({"env": "Prod"}, "config spot-trainer:env='Prod' is not allowed: a GCP label value: lowercase letters, digits, "
                      "'-' or '_', at most 63 characters"),
    ({"team": "x" * 64}, f"config spot-trainer:team={'x' * 64!r} is not allowed: a GCP label value: lowercase "
                         "letters, digits, '-' or '_', at most 63 characters"),
    ({"namespace": "spot_trainer"}, "config spot-trainer:namespace='spot_trainer' is not allowed: a Kubernetes "
                                    "namespace name (DNS label)"),
    ({"redisImage": "redis@sha256:abc"}, "config spot-trainer:redisImage='redis@sha256:abc' is not allowed: an "
                                         "image by digest: name@sha256:<64 hex>"),
    ({"gpuType": "nvidia-tesla-k80"}, "config spot-trainer:gpuType='nvidia-tesla-k80' is not allowed: end-of-life on "
                                      "GKE since 2024-05-01; use one of nvidia-l4, nvidia-tesla-t4, nvidia-tesla-a100, "
                                      "nvidia-a100-80gb, nvidia-h100-80gb"),
    ({"gpuType": "l4"}, "config spot-trainer:gpuType='l4' is not allowed: one of nvidia-l4, nvidia-tesla-t4, "
                        "nvidia-tesla-a100, nvidia-a100-80gb, nvidia-h100-80gb"),
    ({"gpuCount": 3}, "config spot-trainer:gpuCount=3 is not allowed: for nvidia-l4 one of 1, 2, 4, 8"),
    ({"gpuCount": 0}, "config spot-trainer:gpuCount=0 is not allowed: an integer >= 1"),
    ({"onDemandFallback": True, "clusterMode": "standard"},
     "config spot-trainer:onDemandFallback=True is not allowed: false unless clusterMode=autopilot and "
     "gpuCapacity=computeClass (only a compute class can fall back from spot to on-demand; a hard gke-spot selector "
     "or a spot node pool cannot)"),
    ({"network": "vpc"}, "config spot-trainer:subnetwork='' is not allowed: set both network and subnetwork "
                         "(existing VPC) or neither"),
    ({"subnetwork": "sub"}, "config spot-trainer:subnetwork='sub' is not allowed: set both network and subnetwork "
                            "(existing VPC) or neither"),
    ({"filestoreShare": "s" * 17}, f"config spot-trainer:filestoreShare={'s' * 17!r} is not allowed: a share name: a "
                                   "lowercase letter, then letters, digits or '_', 16 at most"),
    ({"pinToShareZone": "yes"}, "config spot-trainer:pinToShareZone='yes' is not allowed: one of auto, true, false"),
    ({"filestoreTier": "ENTERPRISE", "pinToShareZone": "true"},
     "config spot-trainer:pinToShareZone='true' is not allowed: auto or false for tier ENTERPRISE: a ENTERPRISE share "
     "spans the region's zones"),
    ({"workerCpu": "4 cores"}, "config spot-trainer:workerCpu='4 cores' is not allowed: a Kubernetes quantity such as "
                               "4, 500m or 16Gi"),
    ({"runs": {"a": {}, "b": {}}, "scoreRun": "c"},
     "config spot-trainer:scoreRun='c' is not allowed: empty (every run) or one of the runs: a, b"),
    ({"runs": "main"}, "config spot-trainer:runs='main' is not allowed: a map of run name to hyperparameters, e.g. "
                       "{main: {}, wide: {hidden: [128, 64]}, lr3: {lr: 0.003}}"),
    ({"runs": [1, 2]}, "config spot-trainer:runs=[1, 2] is not allowed: a map of run name to hyperparameters, e.g. "
                       "{main: {}, wide: {hidden: [128, 64]}, lr3: {lr: 0.003}}; the old list form is now a map: "
                       "{main: {}}"),
    ({"runs": ["a", 2, "b"]}, "config spot-trainer:runs=['a', 2, 'b'] is not allowed: a map of run name to "
                              "hyperparameters, e.g. {main: {}, wide: {hidden: [128, 64]}, lr3: {lr: 0.003}}; the "
                              "old list form is now a map: {a: {}, b: {}}"),
    ({"runs": {"m": {"lrate": 1}}}, "config spot-trainer:runs={'m': {'lrate': 1}} is not allowed: run 'm': unknown "
                                    "key(s) ['lrate']; allowed: "),
], ids=lambda v: str(v)[:30])
def test_each_refusal_is_one_exact_line(overrides: dict[str, Any], message: str) -> None:
    assert refusal(**overrides).startswith(message) if message.endswith(": ") else refusal(**overrides) == message


def test_the_site_and_cluster_are_read_from_their_own_keys() -> None:
    cfg = load("qa", region="europe-west4", zone="europe-west4-b", env="", team="fraud_ops", namespace="ml-2",
               privateNodes=False, releaseChannel="STABLE")
    assert (cfg.region, cfg.zone, cfg.namespace) == ("europe-west4", "europe-west4-b", "ml-2")
    assert cfg.labels == config.Labels(env="qa", app="spot-trainer", team="fraud_ops")  # env '' = the stack's name
    assert load("qa", env="staging").labels.env == "staging"
    assert cfg.cluster == config.ClusterConfig(mode="autopilot", release_channel="STABLE", private_nodes=False,
                                               deletion_protection=True)
    digest = "redis@sha256:" + "0f" * 32
    assert load("dev", redisImage=digest).redis_image == digest


def test_a_network_is_created_unless_both_an_existing_one_and_its_subnetwork_are_named() -> None:
    created = load("dev", subnetCidr="10.1.0.0/20", podsCidr="10.2.0.0/14", servicesCidr="10.3.0.0/20",
                   podsRangeName="p", servicesRangeName="s").network
    assert created == config.NetworkConfig("", "", "10.1.0.0/20", "10.2.0.0/14", "10.3.0.0/20", "p", "s")
    assert created.create
    existing = load("dev", network="shared", subnetwork="shared-sub").network
    assert (existing.existing_network, existing.existing_subnetwork, existing.create) == ("shared", "shared-sub", False)


@pytest.mark.parametrize(("gpu_type", "count", "machine"), [
    ("nvidia-l4", 1, "g2-standard-8"), ("nvidia-l4", 2, "g2-standard-24"), ("nvidia-l4", 8, "g2-standard-96"),
    ("nvidia-tesla-t4", 4, "n1-standard-32"), ("nvidia-tesla-a100", 2, "a2-highgpu-2g"),
    ("nvidia-a100-80gb", 4, "a2-ultragpu-4g"), ("nvidia-h100-80gb", 8, "a3-highgpu-8g"),
])
def test_the_gpu_machine_type_follows_the_gpu_type_and_count_unless_set(gpu_type: str, count: int,
                                                                       machine: str) -> None:
    gpu = load("dev", gpuType=gpu_type, gpuCount=count).gpu
    assert (gpu.type, gpu.count, gpu.machine_type) == (gpu_type, count, machine)
    assert load("dev", gpuType=gpu_type, gpuCount=count, gpuMachineType="custom-8").gpu.machine_type == "custom-8"


def test_on_demand_fallback_is_only_for_a_compute_class_on_autopilot() -> None:
    gpu = load("dev", onDemandFallback=True, clusterMode="autopilot", gpuCapacity="computeClass").gpu
    assert gpu.on_demand_fallback is True and gpu.capacity == "computeClass"
    assert "onDemandFallback=True is not allowed" in refusal(onDemandFallback=True, gpuCapacity="nodeSelector")


# Each tier's smallest and largest share (Filestore's limits), and one GiB outside each.
@pytest.mark.parametrize(("tier", "low", "high"), [
    ("BASIC_HDD", 1024, 65434), ("BASIC_SSD", 2560, 65434), ("ZONAL", 1024, 102400), ("REGIONAL", 1024, 102400),
    ("ENTERPRISE", 1024, 10240),
])
def test_each_filestore_tier_takes_its_sizes_and_no_other(tier: str, low: int, high: int) -> None:
    for capacity in (low, high):
        share = load("dev", filestoreTier=tier, filestoreCapacityGb=capacity).filestore
        assert (share.tier, share.capacity_gb, share.claim_gb) == (tier, capacity, low)
    for capacity in (low - 1, high + 1):
        assert refusal(filestoreTier=tier, filestoreCapacityGb=capacity) == (
            f"config spot-trainer:filestoreCapacityGb={capacity} is not allowed: between {low} and {high} GiB for "
            f"tier {tier}")
    assert refusal(filestoreTier=tier, filestoreCapacityGb=0) == (
        "config spot-trainer:filestoreCapacityGb=0 is not allowed: an integer >= 1")


@pytest.mark.parametrize(("tier", "capacity", "near"), [
    ("ZONAL", 1025, "a multiple of 256 GiB from 1024 GiB for tier ZONAL (1024 or 1280)"),
    ("ZONAL", 10239, "a multiple of 256 GiB from 1024 GiB for tier ZONAL (9984 or 10240)"),
    ("REGIONAL", 10496, "a multiple of 2560 GiB from 10240 GiB for tier REGIONAL (10240 or 12800)"),
    ("ZONAL", 102399, "a multiple of 2560 GiB from 10240 GiB for tier ZONAL (99840 or 102400)"),
    ("ENTERPRISE", 10239, "a multiple of 256 GiB from 1024 GiB for tier ENTERPRISE (9984 or 10240)"),
])
def test_a_size_off_the_tiers_steps_names_the_two_nearest(tier: str, capacity: int, near: str) -> None:
    assert refusal(filestoreTier=tier, filestoreCapacityGb=capacity) == (
        f"config spot-trainer:filestoreCapacityGb={capacity} is not allowed: {near}")


@pytest.mark.parametrize(("tier", "capacity"), [("ZONAL", 10240 - 256), ("ZONAL", 10240), ("REGIONAL", 10240 + 2560),
                                                 ("BASIC_HDD", 1025), ("BASIC_SSD", 2561), ("ENTERPRISE", 1280)])
def test_a_size_on_the_tiers_steps_loads(tier: str, capacity: int) -> None:
    assert load("dev", filestoreTier=tier, filestoreCapacityGb=capacity).filestore.capacity_gb == capacity


@pytest.mark.parametrize(("tier", "pin", "pinned"), [
    ("BASIC_HDD", "auto", True), ("BASIC_SSD", "auto", True), ("ZONAL", "auto", True), ("REGIONAL", "auto", False),
    ("ENTERPRISE", "auto", False), ("BASIC_HDD", "false", False), ("ZONAL", "true", True),
    ("REGIONAL", "false", False),
])
def test_pods_are_pinned_to_a_zonal_shares_zone_unless_told_not_to(tier: str, pin: str, pinned: bool) -> None:
    share = load("dev", filestoreTier=tier, filestoreCapacityGb=2560, pinToShareZone=pin,
                 filestoreShare="s_1").filestore
    assert (share.pin_to_zone, share.zonal, share.share) == (pinned, tier in ("BASIC_HDD", "BASIC_SSD", "ZONAL"), "s_1")
    assert share.api_deletion_protection is (tier in ("ZONAL", "REGIONAL", "ENTERPRISE"))


def test_the_jobs_settings_are_read_from_their_own_keys() -> None:
    jobs = load("dev", runs={"b": {"lr": 0.003}, "a": {}}, scoreRun="b", workerCpu="500m", workerMemory="1.5Gi",
                outputUri="gs://acme/out", datasetUri="gs://acme/in", schedule="@daily").jobs
    assert jobs.runs_json == '{"a":{},"b":{"lr":0.003}}'  # canonical: sorted keys, no spaces
    assert (jobs.runs, jobs.score_run, jobs.scored_runs) == (("a", "b"), "b", ("b",))
    assert (jobs.worker_cpu, jobs.worker_memory, jobs.schedule) == ("500m", "1.5Gi", "@daily")
    assert load("dev", runs={"b": {}, "a": {}}).jobs.scored_runs == ("a", "b")


@pytest.mark.parametrize(("key", "message"), [
    ("paralelism", "config key 'paralelism' has no namespace: write 'spot-trainer:parallelism'"),
    ("colour", "config key 'colour' has no namespace: write 'spot-trainer:colour' (no setting is named like it; see "
               "Pulumi.yaml)"),
    ("spot-trainer:deletionProtection", "config key 'spot-trainer:deletionProtection' was retired: every stack is now "
                                        "protected; set spot-trainer:allowDataLoss=true to lift it"),
    ("spot-trainer:gpucount", "config key 'spot-trainer:gpucount' is not a setting of spot-trainer; did you mean "
                              "spot-trainer:gpuCount?"),
    ("spot-trainer:colour", "config key 'spot-trainer:colour' is not a setting of spot-trainer; see Pulumi.yaml for "
                            "the settings"),
])
def test_each_key_mistake_is_one_exact_line_naming_the_file(key: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.check_keys(["spot-trainer:zone", "gcp:project", "kubernetes:context", key], where="stacks/x.yaml")
    assert str(err.value) == f"stacks/x.yaml: {message}"
    assert err.value.key == key and err.value.value is None
    with pytest.raises(ConfigError) as err:
        config.check_keys([key])
    assert str(err.value) == message


def test_the_declared_keys_are_pulumi_yamls() -> None:
    declared = config.declared_keys()
    assert declared[:3] == ("region", "zone", "env")
    assert "allowDataLoss" in declared and "deletionProtection" not in declared
    config.check_keys([f"spot-trainer:{k}" for k in declared] + ["gcp:project", "other:paralelism"])
