"""Config validation, each rule at its edge: every setting read within its bounds and refused past them, and each
refusal as the exact one line a user reads (key, value seen, what is allowed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra import config, render
from infra.config import ConfigError
from tests.infra.test_infra_config import load

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


# --- The security settings (issue 36): each refused with its rule, each read into its slice.

KEY = "projects/acme-sec/locations/us-central1/keyRings/ring/cryptoKeys/{}"


@pytest.mark.parametrize(("overrides", "key", "allowed"), [
    ({"authorizedNetworks": ["10.0.0.1/8"]}, "authorizedNetworks", "IPv4 CIDR blocks with no host bits set"),
    ({"authorizedNetworks": ["2001:db8::/32"]}, "authorizedNetworks", "IPv4 CIDR blocks"),
    ({"authorizedNetworks": "10.0.0.0/8"}, "authorizedNetworks", "a list of IPv4 CIDR blocks"),
    ({"apiEgressCidr": "everywhere"}, "apiEgressCidr", "IPv4 CIDR blocks"),
    ({"privateEndpoint": True, "privateNodes": False}, "privateEndpoint", "false unless privateNodes is true"),
    ({"secretsKmsKey": "my-key"}, "secretsKmsKey", "a key name projects/<p>/locations/<region>/"),
    ({"secretsKmsKey": KEY.replace("us-central1", "europe-west1").format("k")}, "secretsKmsKey",
     "a key in the stack's region (us-central1)"),
    ({"filestoreKmsKey": KEY.format("k")}, "filestoreKmsKey", "empty unless filestoreTier is one of ZONAL"),
    ({"filestoreRootSquash": True, "network": "vpc", "subnetwork": "sub"}, "filestoreClientRanges",
     "the nodes' IPv4 ranges"),
    ({"filestoreKmsKey": "stack"}, "filestoreKmsKey", "(a BASIC_HDD share takes no customer-managed key)"),
    ({"filestoreTier": "ZONAL", "filestoreCapacityGb": 1024, "filestoreKmsKey": "stack", "network": "vpc",
      "subnetwork": "sub"}, "filestoreClientRanges", "filestoreKmsKey is set on an existing VPC"),
])  # fmt: skip
def test_a_bad_security_setting_is_one_line_naming_it(overrides: dict[str, Any], key: str, allowed: str) -> None:
    line = refusal(**overrides)
    assert line.startswith(f"config spot-trainer:{key}=") and allowed in line, line


def test_the_security_settings_are_read_off_by_default_and_into_their_slices() -> None:
    off = load("dev")
    assert (off.cluster.authorized_networks, off.cluster.private_endpoint, off.cluster.binary_authorization,
            off.cluster.secrets_kms_key) == ((), False, False, "")  # fmt: skip
    assert (off.filestore.kms_key, off.filestore.root_squash) == ("", False)
    assert off.network.api_egress_cidr == "0.0.0.0/0"
    assert load("prod").cluster.binary_authorization is True  # free: on in prod
    on = load("dev", authorizedNetworks=["203.0.113.0/24", "198.51.100.7/32"], privateEndpoint=True,
              binaryAuthorization=True, secretsKmsKey=KEY.format("etcd"), filestoreTier="ZONAL",
              filestoreCapacityGb=1024, filestoreKmsKey=" " + KEY.format("share"), filestoreRootSquash=True,
              apiEgressCidr="199.36.153.4/30")  # fmt: skip
    assert on.cluster.authorized_networks == ("203.0.113.0/24", "198.51.100.7/32") and on.cluster.private_endpoint
    assert on.cluster.secrets_kms_key == KEY.format("etcd") and on.filestore.kms_key == KEY.format("share")
    assert on.filestore.root_squash and on.filestore.client_ranges == (on.network.subnet_cidr,)
    assert load("dev", filestoreClientRanges=["10.10.0.0/20"], network="v", subnetwork="s").filestore.client_ranges \
        == ("10.10.0.0/20",)
    assert on.network.api_egress_cidr == "199.36.153.4/30"
