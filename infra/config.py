"""Stack configuration: read ``pulumi.Config`` once, validate it all, hand out frozen dataclasses.

Components never read ``pulumi.Config`` themselves, nor this whole ``StackConfig``: ``infra.program`` hands
each the typed slice it uses (``Site`` and its own section). Every check runs before the first resource is
registered, so a typo fails ``pulumi preview`` in a second instead of half-way through ``pulumi up``.
Defaults live in ``Pulumi.yaml`` (one place; the CLI applies them, and so does ``infra.render``).
"""

from __future__ import annotations

import copy
import difflib
import functools
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml

from infra import contract

PROJECT = "spot-trainer"  # the Pulumi project name: the namespace of its config keys
PROJECT_FILE = Path(__file__).resolve().parent.parent / "Pulumi.yaml"  # declares every key and its default

# GPU type -> machine type per GPU count (Standard node pools; Autopilot picks machines itself).
GPU_MACHINE_TYPES: dict[str, dict[int, str]] = {
    "nvidia-l4": {1: "g2-standard-8", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"},
    "nvidia-tesla-t4": {1: "n1-standard-8", 2: "n1-standard-16", 4: "n1-standard-32"},
    "nvidia-tesla-a100": {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g", 8: "a2-highgpu-8g"},
    "nvidia-a100-80gb": {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g", 4: "a2-ultragpu-4g", 8: "a2-ultragpu-8g"},
    "nvidia-h100-80gb": {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g", 8: "a3-highgpu-8g"},
}
# Accelerators that GKE no longer offers: a clear "why" beats a generic "not allowed".
END_OF_LIFE_GPUS = {"nvidia-tesla-k80": "end-of-life on GKE since 2024-05-01"}

# The dataset name `seed` uses by default (workload.cli.DEFAULT_DATASET): simulated data keeps it, so a
# stack deployed before datasetUri existed finds its dataset where it was.
SIMULATED_DATASET = "fraud"

# Filestore tier -> (minimum GiB, maximum GiB).
FILESTORE_TIERS: dict[str, tuple[int, int]] = {
    "BASIC_HDD": (1024, 65434),
    "BASIC_SSD": (2560, 65434),
    "ZONAL": (1024, 102400),
    "REGIONAL": (1024, 102400),
    "ENTERPRISE": (1024, 10240),
}
# Capacity steps (Filestore service-tier docs): ZONAL and REGIONAL scale by 256 GiB below 10 TiB and by
# 2.5 TiB from 10 TiB up; ENTERPRISE by 256 GiB. BASIC tiers take any GiB count in their range.
FILESTORE_STEPS: dict[str, tuple[tuple[int, int], ...]] = {  # tier -> ((from GiB, step GiB), ...)
    "ZONAL": ((1024, 256), (10240, 2560)),
    "REGIONAL": ((1024, 256), (10240, 2560)),
    "ENTERPRISE": ((1024, 256),),
}
# Tiers whose instance lives in one zone (the others are regional).
ZONAL_FILESTORE_TIERS = ("BASIC_HDD", "BASIC_SSD", "ZONAL")
# Tiers on which Filestore offers deletion protection; asking for it on a BASIC tier fails the create
# (terraform-provider-google issue 20311), so BASIC instances are protected by Pulumi's `protect` instead.
DELETION_PROTECTION_TIERS = ("ZONAL", "REGIONAL", "ENTERPRISE")
# Tiers whose data a customer-managed Cloud KMS key can encrypt (Filestore "Encrypt data with customer-managed
# encryption keys": not the BASIC tiers); the instance's kms_key_name (pulumi_gcp 10.2 filestore.Instance).
CMEK_FILESTORE_TIERS = ("ZONAL", "REGIONAL", "ENTERPRISE")

CLUSTER_MODES = ("autopilot", "standard")
GPU_CAPACITY_MODES = ("computeClass", "nodeSelector")
# Where the training pods train: spot GPU pods, or Autopilot Spot Pods on CPU (issue 33: a small run trains on one
# CPU core about as fast as on a GPU at the default batch size; docs/benchmarks.md has the measured figures).
TRAIN_ON_MODES = ("gpu", "cpu")
JOB_AWAIT_MODES = ("wait", "skip")
RELEASE_CHANNELS = ("RAPID", "REGULAR", "STABLE")
# vpcServiceControls: no perimeter, a dry-run one (violations logged, nothing denied), an enforced one.
PERIMETER_MODES = ("off", "dryRun", "enforced")
_ACCESS_POLICY = re.compile(r"^accessPolicies/[0-9]+$")
# Principals an ingress rule takes (Access Context Manager v1 IngressFrom.identities: "the v1 identities that have
# the prefix user, group, serviceAccount, and principal", googleapis.dev Google.Apis.AccessContextManager.v1).
_INGRESS_IDENTITY = re.compile(r"^(serviceAccount|user|group):[^@\s:]+@[^@\s]+$|^principal://\S+$")
# The one setting that lifts the cluster's and the share's deletion protection, in any stack: its name
# says what a destroy or a replacing change then costs (docs/cloud.md, "Day two").
DATA_LOSS_KEY = "allowDataLoss"
# Settings that no longer exist -> what to write instead (a plain "not a setting" would leave users guessing).
RETIRED_KEYS = {
    "deletionProtection": f"every stack is now protected; set {PROJECT}:{DATA_LOSS_KEY}=true to lift it",
}

_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_LABEL_VALUE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_SHARE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,15}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_IMAGE_BY_DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti)?$")
# Cloud Storage bucket names (cloud.google.com/storage/docs/buckets#naming): 3-63 characters of lowercase
# letters, digits, '-', '_' and '.', starting and ending with a letter or digit; dotted names may reach
# 222 characters with each dot-separated part at most 63. (Dotted names need domain verification; IP
# addresses, a "goog" prefix and "google" or "g00gle" inside are refused by Cloud Storage.)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_IPV4 = re.compile(r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$")


class ConfigError(ValueError):
    """A stack configuration value is missing or not allowed; the message says which and why, on one line.

    ``where`` names the user's file when the mistake is in one (a stack file), ``message`` replaces the
    usual "key=value is not allowed" sentence for mistakes about keys rather than values.
    """

    def __init__(self, key: str, value: Any, allowed: str, where: str = "", message: str = "") -> None:
        self.key, self.value, self.allowed = key, value, allowed
        full_key = key if ":" in key else f"{PROJECT}:{key}"
        text = message or f"config {full_key}={value!r} is not allowed: {allowed}"
        super().__init__(f"{where}: {text}" if where else text)


def project_file() -> dict[str, Any]:
    """``Pulumi.yaml``, parsed: read each time (an edit is seen at once), parsed once per content (a render of
    the stack checked its keys against it several times, and the YAML parser was a twentieth of the test
    suite's CPU). A copy: the caller may change it."""
    return copy.deepcopy(_parsed_project_file(PROJECT_FILE.read_text()))


@functools.lru_cache(maxsize=4)
def _parsed_project_file(text: str) -> dict[str, Any]:
    return yaml.safe_load(text)


def declared_keys() -> tuple[str, ...]:
    """The project's setting names, as ``Pulumi.yaml`` declares them (the one list of keys)."""
    return tuple((_parsed_project_file(PROJECT_FILE.read_text()).get("config") or {}).keys())


def check_keys(keys: Iterable[str], where: str = "") -> None:
    """Refuse a key of the project's namespace that ``Pulumi.yaml`` does not declare, and a project key
    written without its namespace: the CLI passes either to the program, which would silently ignore it.
    The message suggests the closest declared key."""
    declared = declared_keys()
    for key in keys:
        namespace, sep, name = key.rpartition(":")
        if sep and namespace != PROJECT:
            continue  # another package's setting (gcp:project, kubernetes:...): not ours to judge
        if sep and name in declared:
            continue
        guess = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
        if not sep:
            fix = f"{PROJECT}:{guess[0] if guess else name}"
            text = f"config key {key!r} has no namespace: write {fix!r}"
            if not guess:
                text += " (no setting is named like it; see Pulumi.yaml)"
            raise ConfigError(key, None, "", where, text)
        if name in RETIRED_KEYS:
            raise ConfigError(key, None, "", where, f"config key {key!r} was retired: {RETIRED_KEYS[name]}")
        if name not in declared:
            hint = f"did you mean {PROJECT}:{guess[0]}?" if guess else "see Pulumi.yaml for the settings"
            raise ConfigError(key, None, "", where, f"config key {key!r} is not a setting of {PROJECT}; {hint}")


@dataclass(frozen=True)
class Labels:
    """Cost-attribution labels put on every GCP resource that takes labels."""

    env: str
    app: str
    team: str

    def as_dict(self) -> dict[str, str]:
        return {"env": self.env, "app": self.app, "team": self.team}


@dataclass(frozen=True)
class Site:
    """Where a component's GCP resources go and how they are named and labelled: the slice of the stack
    config that most components share (the rest get only their own section)."""

    project_id: str
    region: str
    zone: str
    stack: str
    slug: str
    labels: Labels


@dataclass(frozen=True)
class NetworkConfig:
    existing_network: str  # "" means: create a dedicated VPC
    existing_subnetwork: str
    subnet_cidr: str
    pods_cidr: str
    services_cidr: str
    pods_range_name: str
    services_range_name: str
    # Where pods with a Google identity may send HTTPS (Google APIs): infra/network_policy.py.
    api_egress_cidr: str = "0.0.0.0/0"

    @property
    def create(self) -> bool:
        return not self.existing_network


@dataclass(frozen=True)
class ClusterConfig:
    mode: str
    release_channel: str
    private_nodes: bool
    deletion_protection: bool
    # The control plane: CIDRs that may reach its public endpoint (empty: any), or no public endpoint at all.
    authorized_networks: tuple[str, ...] = ()
    private_endpoint: bool = False
    # Binary Authorization enforces the project's singleton policy on every pod the cluster admits.
    binary_authorization: bool = False
    # Application-layer secrets encryption with this Cloud KMS key ('' = Google-managed encryption only).
    secrets_kms_key: str = ""

    @property
    def autopilot(self) -> bool:
        return self.mode == "autopilot"


@dataclass(frozen=True)
class GpuConfig:
    type: str
    count: int
    capacity: str  # computeClass | nodeSelector (Autopilot); Standard always uses its node pool
    on_demand_fallback: bool
    max_nodes: int
    machine_type: str
    # Read the project's GPU quota at `pulumi up` and fail at once when it cannot run the training pods.
    check_quota: bool = True
    # trainOn: "cpu" trains on Autopilot Spot Pods without a GPU (no GPU request, selector or quota check).
    train_on: str = "gpu"

    @property
    def on_cpu(self) -> bool:
        return self.train_on == "cpu"


@dataclass(frozen=True)
class FilestoreConfig:
    tier: str
    capacity_gb: int
    share: str
    # Loader and training pods are scheduled in the share's zone (no inter-zone NFS traffic).
    pin_to_zone: bool = False
    # The share's data encrypted with this Cloud KMS key ('' = Google-managed; STACK_KEY = a key of the stack's
    # own, infra/filestore.py); ZONAL, REGIONAL, ENTERPRISE.
    kms_key: str = ""
    # NFS export rules: only these client ranges may mount (empty: the whole VPC), and root on a client is
    # squashed to the anonymous user.
    client_ranges: tuple[str, ...] = ()
    root_squash: bool = False

    @property
    def zonal(self) -> bool:
        return self.tier in ZONAL_FILESTORE_TIERS

    @property
    def claim_gb(self) -> int:
        """What the share's claims request: the tier's smallest size, whatever the share's size. A claim
        bound to a static PV (``storageClassName: ""``) cannot grow (the API server's resize admission
        refuses: "only dynamically provisioned pvc can be resized"), and pulumi-kubernetes replaces a
        claim whose request changes (provider/pkg/provider/diff.go), so a size-dependent request broke
        every capacity change. The tier never changes (it replaces the instance), and binding only needs
        the PV's capacity to be at least the request."""
        return FILESTORE_TIERS[self.tier][0]

    @property
    def api_deletion_protection(self) -> bool:
        """Whether the tier takes Filestore's own ``deletion_protection_enabled`` (BASIC tiers do not)."""
        return self.tier in DELETION_PROTECTION_TIERS


# The IAM Conditions API attribute Cloud Storage sets on a list request: the prefix asked for.
LIST_PREFIX_ATTRIBUTE = "storage.googleapis.com/objectListPrefix"


@dataclass(frozen=True)
class GcsUri:
    """``gs://<bucket>/<prefix>``, validated; ``prefix`` has no leading or trailing '/' ('' = the bucket)."""

    bucket: str
    prefix: str

    @classmethod
    def split(cls, uri: str) -> GcsUri | None:
        """``gs://bucket/a/b/`` -> GcsUri("bucket", "a/b"), unchecked (None unless it starts ``gs://``)."""
        if not uri.startswith("gs://"):
            return None
        bucket, _, prefix = uri[len("gs://") :].partition("/")
        return cls(bucket=bucket, prefix=prefix.strip("/"))

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}" if self.prefix else f"gs://{self.bucket}"

    @property
    def objects(self) -> str:
        """The IAM Conditions resource name every object under the prefix starts with (Cloud Storage
        objects are ``projects/_/buckets/<bucket>/objects/<name>``: cloud.google.com/iam/docs/
        conditions-resource-attributes#resource-name). The trailing '/' keeps ``out`` from matching
        ``out-other/``."""
        base = f"projects/_/buckets/{self.bucket}/objects/"
        return base + (f"{self.prefix}/" if self.prefix else "")

    def readable(self) -> str:
        """The IAM condition that limits an object role to the prefix, listing included: reads are checked against
        the object (``resource.name`` under ``objects``), a list against the bucket, with the request's prefix in
        the API attribute ``storage.googleapis.com/objectListPrefix`` (cloud.google.com/iam/docs/
        conditions-attribute-reference, "API attributes": Cloud Storage's list prefix; the same two clauses as
        cloud.google.com/storage/docs/access-control/iam#conditions). A list without that prefix (the whole
        bucket) is refused. Only meaningful with a prefix."""
        return (f'resource.name.startsWith("{self.objects}") || '
                f'api.getAttribute("{LIST_PREFIX_ATTRIBUTE}", "").startsWith("{self.prefix}/")')


@dataclass(frozen=True)
class DataConfig:
    """Where the datasets come from and where results go (``None``: simulate / keep them on the share).

    ``dataset_name`` names the dataset on the share (``seed --dataset``); a run is one lineage on one
    dataset, so other data needs another name (and new runs)."""

    dataset: GcsUri | None
    output: GcsUri | None
    dataset_name: str = SIMULATED_DATASET
    # How the loader reads your files (`seed`'s DATASET_COLUMNS, DATASET_DATETIME_FORMAT): your column names
    # -> ours as canonical JSON ('' for ours), and a declared date format ('' for ISO 8601 only).
    columns_json: str = ""
    datetime_format: str = ""


@dataclass(frozen=True)
class JobConfig:
    parallelism: int
    backoff_limit: int
    active_deadline_seconds: int
    await_mode: str
    timeout_minutes: int
    loader_timeout_minutes: int
    dataset_preset: str
    # The stack's ``runs`` as canonical JSON ({run name: {hyperparameters}}, keys sorted): what the loader
    # gets as its runs file, validated with the worker's own rules (workload.model.hparams.parse_runs).
    runs_json: str
    lease_ttl_seconds: int
    checkpoint_interval_seconds: int
    max_attempts: int

    @property
    def runs(self) -> tuple[str, ...]:
        """The run names, in the order the stack declares them."""
        return tuple(json.loads(self.runs_json))

    @property
    def standby_workers(self) -> int:
        """Pods beyond one per run: a run trains on one worker at a time, so these wait (on a GPU)
        as hot standbys that take over at once when a spot node is reclaimed."""
        return max(0, self.parallelism - len(self.runs))
    worker_cpu: str
    worker_memory: str
    # The run whose newest model scores the scoring/ days ('' = every run), with outputUri set.
    score_run: str = ""
    # How long a pod rides out an infrastructure fault before its exit 3 fails the Job.
    infra_retry_budget_minutes: int = 30
    # A cron line (Kubernetes CronJob syntax) on which the loader reloads and, for new work, starts
    # training; '' = off.
    schedule: str = ""

    @property
    def scored_runs(self) -> tuple[str, ...]:
        return (self.score_run,) if self.score_run else self.runs

    @property
    def skip_await(self) -> bool:
        return self.await_mode == "skip"


@dataclass(frozen=True)
class PerimeterConfig:
    """VPC Service Controls (infra/perimeter.py): ``mode`` one of PERIMETER_MODES, the access policy the perimeter
    lives in, and who may call the restricted services from outside it."""

    mode: str = "off"
    access_policy: str = ""
    ingress_identities: tuple[str, ...] = ()

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @property
    def dry_run(self) -> bool:
        return self.mode == "dryRun"


@dataclass(frozen=True)
class StackConfig:
    """Everything the program needs, validated."""

    stack: str
    project_id: str
    region: str
    zone: str
    namespace: str
    labels: Labels
    network: NetworkConfig
    cluster: ClusterConfig
    gpu: GpuConfig
    filestore: FilestoreConfig
    jobs: JobConfig
    data: DataConfig
    redis_image: str
    perimeter: PerimeterConfig = PerimeterConfig()

    @property
    def slug(self) -> str:
        """The stack name made safe for GCP and Kubernetes resource names (lowercase, digits, '-')."""
        return re.sub(r"[^a-z0-9-]+", "-", self.stack.lower()).strip("-") or "stack"

    @property
    def site(self) -> Site:
        return Site(self.project_id, self.region, self.zone, self.stack, self.slug, self.labels)


class _Reader:
    """Typed access to the project namespace; every failure is a ConfigError naming the key."""

    def __init__(self, values: Mapping[str, str] | None) -> None:
        self._values = values

    def keys(self) -> list[str]:
        """Every full key set for the stack (under the engine: what the language host was given)."""
        if self._values is not None:
            return list(self._values)
        from pulumi.runtime import config as runtime_config

        return sorted({*runtime_config.CONFIG.get(), *runtime_config.get_config_env()})

    def get(self, key: str, namespace: str = PROJECT) -> str | None:
        if self._values is not None:
            return self._values.get(f"{namespace}:{key}")
        return pulumi.Config(namespace).get(key)

    def raw(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise ConfigError(key, None, "the key must be set (Pulumi.yaml declares a default for it)")
        return value

    def str(self, key: str, allowed: tuple[str, ...] | None = None) -> str:
        value = self.raw(key)
        if allowed is not None and value not in allowed:
            raise ConfigError(key, value, "one of " + ", ".join(allowed))
        return value

    def int(self, key: str, minimum: int, maximum: int | None = None) -> int:
        value = self.raw(key)
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(key, value, "an integer") from None
        if number < minimum or (maximum is not None and number > maximum):
            bound = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
            raise ConfigError(key, number, f"an integer {bound}")
        return number

    def bool(self, key: str) -> bool:
        value = self.raw(key).lower()
        if value not in ("true", "false"):
            raise ConfigError(key, value, "true or false")
        return value == "true"

    def matching(self, key: str, pattern: re.Pattern[str], what: str) -> str:
        value = self.raw(key)
        if not pattern.match(value):
            raise ConfigError(key, value, what)
        return value


def load(config: Mapping[str, str] | None = None, stack: str | None = None) -> StackConfig:
    """Read and validate the stack's configuration (from the Pulumi runtime unless ``config`` is given).

    ``config`` maps full keys (``spot-trainer:gpuType``, ``gcp:project``) to string values, as the
    engine passes them; tests use it to check a config without touching the global runtime.
    """
    stack = stack or pulumi.get_stack()
    r = _Reader(config)
    check_keys(r.keys())

    project_id = r.get("project", namespace="gcp")
    if not project_id:
        raise ConfigError("gcp:project", project_id, "set it with `pulumi config set gcp:project <id>`")

    region = r.matching("region", _REGION, "a GCP region such as us-central1")
    zone = r.raw("zone")
    if not re.fullmatch(re.escape(region) + r"-[a-z]", zone):
        raise ConfigError("zone", zone, f"a zone of region {region!r}, such as {region}-a")

    label_what = "a GCP label value: lowercase letters, digits, '-' or '_', at most 63 characters"
    env = r.raw("env") or stack
    if not _LABEL_VALUE.match(env):
        raise ConfigError("env", env, label_what)
    labels = Labels(env=env, app=contract.APP, team=r.matching("team", _LABEL_VALUE, label_what))

    cluster = _cluster(r, region, prod=env == "prod")
    gpu = _gpu(r, cluster)
    network = _network(r)
    filestore = _filestore(r, region, network, prod=env == "prod")
    jobs = _jobs(r)
    data = _data(r)
    if jobs.schedule and not data.dataset:
        # Simulated data never gains days: a schedule would only start pods to find nothing new.
        raise ConfigError("schedule", jobs.schedule, "empty unless datasetUri is set (new days come from there)")
    return StackConfig(
        stack=stack,
        project_id=project_id,
        region=region,
        zone=zone,
        namespace=r.matching("namespace", _DNS_LABEL, "a Kubernetes namespace name (DNS label)"),
        labels=labels,
        network=network,
        cluster=cluster,
        gpu=gpu,
        filestore=filestore,
        jobs=jobs,
        data=data,
        redis_image=r.matching("redisImage", _IMAGE_BY_DIGEST, "an image by digest: name@sha256:<64 hex>"),
        perimeter=_perimeter(r),
    )


def _perimeter(r: _Reader) -> PerimeterConfig:
    """vpcServiceControls and its two companions; the policy and identities are refused when the mode is off (a
    value that does nothing would look like protection)."""
    mode = r.str("vpcServiceControls", PERIMETER_MODES)
    policy = r.raw("vpcAccessPolicy").strip()
    raw = r.raw("vpcIngressIdentities")
    try:
        identities = json.loads(raw) if raw.strip() else []
    except json.JSONDecodeError:
        identities = raw
    if not isinstance(identities, list):
        raise ConfigError("vpcIngressIdentities", identities,
                          "a list such as [serviceAccount:deploy@p.iam.gserviceaccount.com]")
    for identity in identities:
        if not isinstance(identity, str) or not _INGRESS_IDENTITY.match(identity):
            raise ConfigError("vpcIngressIdentities", identity, "serviceAccount:<email>, user:<email>, group:<email> "
                              "or principal://... (one identity each)")
    if mode == "off" and (policy or identities):
        key, value = ("vpcAccessPolicy", policy) if policy else ("vpcIngressIdentities", identities)
        raise ConfigError(key, value, "empty while vpcServiceControls is off (set vpcServiceControls: dryRun first)")
    if mode != "off" and not _ACCESS_POLICY.match(policy):
        raise ConfigError("vpcAccessPolicy", policy, f"accessPolicies/<number> with vpcServiceControls={mode} (the "
                          "scoped policy the organisation's admin made for this project: `gcloud "
                          "access-context-manager policies list --organization <org>`)")
    if mode == "enforced" and not identities:
        raise ConfigError("vpcIngressIdentities", [], "at least the deploy identity with vpcServiceControls=enforced: "
                          "an enforced perimeter refuses `pulumi up` from CI otherwise (dryRun logs it instead)")
    return PerimeterConfig(mode, policy, tuple(identities))


_KMS_KEY = re.compile(
    r"^projects/[^/]+/locations/([a-z0-9-]+)/keyRings/[A-Za-z0-9_-]{1,63}/cryptoKeys/[A-Za-z0-9_-]{1,63}$"
)


# secretsKmsKey's and filestoreKmsKey's value for a key ring and key of the stack's own (infra/cluster.py and
# infra/filestore.py create them and grant the service agent that uses each).
STACK_KEY = "stack"


def _kms_key(r: _Reader, key: str, region: str, stack_key: bool = False) -> str:
    """A Cloud KMS key's resource name in the stack's region ('' = off): GKE and Filestore take only a key in
    their own location. ``stack_key``: ``stack`` is allowed too (the stack makes its own key)."""
    value = r.raw(key).strip()
    if not value or (stack_key and value == STACK_KEY):
        return value
    match = _KMS_KEY.match(value)
    if not match:
        raise ConfigError(key, value, "a key name projects/<p>/locations/<region>/keyRings/<ring>/cryptoKeys/<key>"
                          + (f", or {STACK_KEY!r} (a key of the stack's own)" if stack_key else ""))
    if match[1] != region:
        raise ConfigError(key, value, f"a key in the stack's region ({region}), where the resource it encrypts is")
    return value


def _cidrs(r: _Reader, key: str) -> tuple[str, ...]:
    """A list of IPv4 CIDR blocks (YAML list, JSON in the engine's config), each in its canonical form."""
    raw = r.raw(key)
    try:
        values = json.loads(raw) if raw.strip() else []
    except json.JSONDecodeError:
        values = raw
    if not isinstance(values, list):
        raise ConfigError(key, values, "a list of IPv4 CIDR blocks, e.g. [203.0.113.0/24]")
    return tuple(_cidr(key, v) for v in values)


def _cidr(key: str, value: Any) -> str:
    try:
        network = ipaddress.ip_network(str(value), strict=True)
    except ValueError:
        network = None
    if not isinstance(value, str) or not isinstance(network, ipaddress.IPv4Network):
        raise ConfigError(key, value, "IPv4 CIDR blocks with no host bits set, e.g. 203.0.113.0/24")
    return str(network)


def _cluster(r: _Reader, region: str, prod: bool = False) -> ClusterConfig:
    """``prod``: the stack's env is prod, whose control plane must not be open to any address (CIS GKE 5.6.3)."""
    private_endpoint, private_nodes = r.bool("privateEndpoint"), r.bool("privateNodes")
    if private_endpoint and not private_nodes:
        raise ConfigError("privateEndpoint", True, "false unless privateNodes is true (GKE: a private endpoint "
                          "needs private nodes)")
    authorized = _cidrs(r, "authorizedNetworks")
    if "0.0.0.0/0" in authorized:
        raise ConfigError("authorizedNetworks", list(authorized), "ranges narrower than 0.0.0.0/0 (an empty list "
                          "already lets any address reach the public endpoint)")
    if prod and not private_endpoint and not authorized:
        raise ConfigError("authorizedNetworks", [], "in a prod stack, the IPv4 ranges that may reach the control "
                          "plane (your office, your CI runners' egress), or privateEndpoint: true; empty opens it "
                          "to any address")
    return ClusterConfig(
        mode=r.str("clusterMode", CLUSTER_MODES),
        release_channel=r.str("releaseChannel", RELEASE_CHANNELS),
        private_nodes=private_nodes,
        deletion_protection=not r.bool(DATA_LOSS_KEY),
        authorized_networks=authorized,
        private_endpoint=private_endpoint,
        binary_authorization=r.bool("binaryAuthorization"),
        secrets_kms_key=_kms_key(r, "secretsKmsKey", region, stack_key=True),
    )


def _gpu(r: _Reader, cluster: ClusterConfig) -> GpuConfig:
    gpu_type = r.raw("gpuType")
    if gpu_type in END_OF_LIFE_GPUS:
        allowed = f"{END_OF_LIFE_GPUS[gpu_type]}; use one of " + ", ".join(GPU_MACHINE_TYPES)
        raise ConfigError("gpuType", gpu_type, allowed)
    if gpu_type not in GPU_MACHINE_TYPES:
        raise ConfigError("gpuType", gpu_type, "one of " + ", ".join(GPU_MACHINE_TYPES))
    counts = GPU_MACHINE_TYPES[gpu_type]
    count = r.int("gpuCount", 1)
    if count not in counts:
        raise ConfigError("gpuCount", count, f"for {gpu_type} one of " + ", ".join(map(str, counts)))
    capacity = r.str("gpuCapacity", GPU_CAPACITY_MODES)
    fallback = r.bool("onDemandFallback")
    if fallback and (not cluster.autopilot or capacity != "computeClass"):
        raise ConfigError(
            "onDemandFallback",
            True,
            "false unless clusterMode=autopilot and gpuCapacity=computeClass (only a compute class can "
            "fall back from spot to on-demand; a hard gke-spot selector or a spot node pool cannot)",
        )
    machine_type = r.raw("gpuMachineType") or counts[count]
    train_on = _train_on(r, cluster, fallback)
    return GpuConfig(
        type=gpu_type,
        count=count,
        capacity=capacity,
        on_demand_fallback=fallback,
        max_nodes=r.int("gpuMaxNodes", 1, 100),
        machine_type=machine_type,
        check_quota=r.bool("checkGpuQuota") and train_on == "gpu",  # no GPU pod: no GPU quota to read
        train_on=train_on,
    )


def _train_on(r: _Reader, cluster: ClusterConfig, fallback: bool) -> str:
    """trainOn: cpu only on Autopilot (a Standard cluster's only spot pool for training is its GPU pool) and without
    onDemandFallback (a spot-to-on-demand fallback is a GPU compute class's)."""
    train_on = r.str("trainOn", TRAIN_ON_MODES)
    if train_on == "cpu" and not cluster.autopilot:
        raise ConfigError("trainOn", train_on, "gpu unless clusterMode=autopilot (CPU training runs on Autopilot "
                          "Spot Pods; a Standard cluster's spot pool for training is its GPU pool)")
    if train_on == "cpu" and fallback:
        raise ConfigError("onDemandFallback", True, "false with trainOn=cpu (the fallback is a GPU compute class's)")
    return train_on


def _network(r: _Reader) -> NetworkConfig:
    existing, subnet = r.raw("network"), r.raw("subnetwork")
    if bool(existing) != bool(subnet):
        raise ConfigError("subnetwork", subnet, "set both network and subnetwork (existing VPC) or neither")
    return NetworkConfig(
        existing_network=existing,
        existing_subnetwork=subnet,
        subnet_cidr=r.raw("subnetCidr"),
        pods_cidr=r.raw("podsCidr"),
        services_cidr=r.raw("servicesCidr"),
        pods_range_name=r.raw("podsRangeName"),
        services_range_name=r.raw("servicesRangeName"),
        api_egress_cidr=_cidr("apiEgressCidr", r.raw("apiEgressCidr")),
    )


def _filestore(r: _Reader, region: str, network: NetworkConfig, prod: bool = False) -> FilestoreConfig:
    """``prod``: the share holds card data, so it must be under a customer-managed key (rule prod-card-data-at-rest).
    Root squash is not demanded here: the one `up` that creates a share runs without it (infra/filestore.py)."""
    tier = r.str("filestoreTier", tuple(FILESTORE_TIERS))
    low, high = FILESTORE_TIERS[tier]
    capacity = r.int("filestoreCapacityGb", 1)
    if not low <= capacity <= high:
        raise ConfigError("filestoreCapacityGb", capacity, f"between {low} and {high} GiB for tier {tier}")
    steps = [(start, step) for start, step in FILESTORE_STEPS.get(tier, ()) if capacity >= start]
    if steps and capacity % steps[-1][1]:
        start, step = steps[-1]
        below = capacity - capacity % step
        near = f"{below} or {below + step}" if below >= start else str(below + step)
        raise ConfigError(
            "filestoreCapacityGb", capacity, f"a multiple of {step} GiB from {start} GiB for tier {tier} ({near})"
        )
    share_what = "a share name: a lowercase letter, then letters, digits or '_', 16 at most"
    share = r.matching("filestoreShare", _SHARE_NAME, share_what)
    pin = r.str("pinToShareZone", ("auto", "true", "false"))
    zonal = tier in ZONAL_FILESTORE_TIERS
    if pin == "true" and not zonal:
        raise ConfigError(
            "pinToShareZone", "true", f"auto or false for tier {tier}: a {tier} share spans the region's zones"
        )
    kms_key = _kms_key(r, "filestoreKmsKey", region, stack_key=True)
    if kms_key and tier not in CMEK_FILESTORE_TIERS:
        raise ConfigError("filestoreKmsKey", kms_key, "empty unless filestoreTier is one of "
                          + ", ".join(CMEK_FILESTORE_TIERS) + f" (a {tier} share takes no customer-managed key)")
    if prod and not kms_key:
        raise ConfigError("filestoreKmsKey", "", f"in a prod stack, {STACK_KEY!r} (a key of the stack's own) or a key "
                          "name, with filestoreTier one of " + ", ".join(CMEK_FILESTORE_TIERS) + " (the card data at "
                          "rest under a customer-managed key)")
    clients = _cidrs(r, "filestoreClientRanges") or ((network.subnet_cidr,) if network.create else ())
    root_squash = r.bool("filestoreRootSquash")
    if (root_squash or kms_key) and not clients:
        raise ConfigError("filestoreClientRanges", [], "the nodes' IPv4 ranges when filestoreRootSquash is true or "
                          "filestoreKmsKey is set on an existing VPC (a created VPC defaults to its subnet)")
    return FilestoreConfig(
        tier=tier, capacity_gb=capacity, share=share, pin_to_zone=zonal if pin == "auto" else pin == "true",
        kms_key=kms_key, client_ranges=clients, root_squash=root_squash,
    )


def _jobs(r: _Reader) -> JobConfig:
    quantity = "a Kubernetes quantity such as 4, 500m or 16Gi"
    runs_json = _runs(r)
    score_run = r.raw("scoreRun")
    names = tuple(json.loads(runs_json))
    if score_run and score_run not in names:
        raise ConfigError("scoreRun", score_run, "empty (every run) or one of the runs: " + ", ".join(names))
    return JobConfig(
        parallelism=r.int("parallelism", 1, 1000),
        backoff_limit=r.int("backoffLimit", 0),
        active_deadline_seconds=r.int("activeDeadlineSeconds", 60),
        await_mode=r.str("jobAwait", JOB_AWAIT_MODES),
        timeout_minutes=r.int("jobTimeoutMinutes", 1),
        loader_timeout_minutes=r.int("loaderTimeoutMinutes", 1),
        dataset_preset=r.str("datasetPreset", contract.DATASET_PRESETS),
        runs_json=runs_json,
        lease_ttl_seconds=r.int("leaseTtlSeconds", 5),
        checkpoint_interval_seconds=r.int("checkpointIntervalSeconds", 1),
        max_attempts=r.int("maxAttempts", 1),
        worker_cpu=r.matching("workerCpu", _QUANTITY, quantity),
        worker_memory=r.matching("workerMemory", _QUANTITY, quantity),
        score_run=score_run,
        infra_retry_budget_minutes=r.int("infraRetryBudgetMinutes", 1, 1440),
        schedule=_schedule(r.raw("schedule")),
    )


# A CronJob's schedule as Kubernetes parses it (robfig/cron's standard parser, five fields, or a macro;
# kubernetes pkg/apis/batch/validation/validation.go validateScheduleFormat), checked here so a typo
# fails at preview rather than at the API server. TZ= / CRON_TZ= prefixes are refused by the API server.
_CRON_FIELD = r"(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?"
_CRON = re.compile(rf"^{_CRON_FIELD}(,{_CRON_FIELD})*( {_CRON_FIELD}(,{_CRON_FIELD})*){{4}}$")
_CRON_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


def _schedule(text: str) -> str:
    if text and not (_CRON.match(text) or text in _CRON_MACROS):
        raise ConfigError("schedule", text, "empty (off) or a cron line of five fields such as '0 3 * * *', "
                          "or one of " + ", ".join(_CRON_MACROS))
    return text


def _runs(r: _Reader) -> str:
    """``runs``: a map of run name to hyperparameters, checked by ``workload.model.hparams.parse_runs`` (the
    rules ``seed`` applies), so a typo fails ``pulumi preview`` instead of the loader Job."""
    value = r.raw("runs")
    try:
        specs = json.loads(value)
    except json.JSONDecodeError:
        specs = value
    example = "a map of run name to hyperparameters, e.g. {main: {}, wide: {hidden: [128, 64]}, lr3: {lr: 0.003}}"
    if isinstance(specs, list):
        names = ", ".join(f"{n}: {{}}" for n in specs if isinstance(n, str)) or "main: {}"
        raise ConfigError("runs", specs, f"{example}; the old list form is now a map: {{{names}}}")
    if not isinstance(specs, dict) or not specs:
        raise ConfigError("runs", specs, example)
    # The worker's own rules (stdlib only, no torch). Imported here, not at the top: the policy pack
    # imports this module for its constants from a virtualenv and a copy that hold no worker code.
    from workload.model.hparams import parse_runs

    try:
        parse_runs(specs, where=f"{PROJECT}:runs")
    except ValueError as err:
        # parse_runs names the run, the key, the value and what is allowed: pass its words on.
        raise ConfigError("runs", specs, str(err).removeprefix(f"{PROJECT}:runs: ")) from None
    return json.dumps(specs, sort_keys=True, separators=(",", ":"))


def _gcs_uri(r: _Reader, key: str, need_prefix: bool = True) -> GcsUri | None:
    """``gs://bucket[/prefix]`` or '' (None). ``need_prefix``: a write grant is scoped to the prefix, so
    an output location must name one (an empty prefix would be the whole bucket)."""
    value = r.raw(key).strip()
    if not value:
        return None
    shape = "gs://<bucket>/<prefix>" if need_prefix else "gs://<bucket>[/<prefix>]"
    location = GcsUri.split(value)
    if location is None:
        raise ConfigError(key, value, f"a Cloud Storage location {shape} (or empty)")
    bucket, prefix = location.bucket, location.prefix
    if (
        not _BUCKET.match(bucket)
        or _IPV4.match(bucket)
        or any(len(part) > 63 or not part for part in bucket.split("."))
        or (len(bucket) > 63 and "." not in bucket)
        or bucket.startswith("goog")
        or "google" in bucket
        or "g00gle" in bucket  # the misspelling the naming rules name
    ):
        raise ConfigError(
            key,
            value,
            f"{shape} with a valid bucket name: 3-63 lowercase letters, digits, '-', '_' or '.' (up to 222 with "
            "dots, each dot-separated part at most 63), starting and ending with a letter or digit, not an IP "
            "address, no 'goog' prefix, no 'google' or 'g00gle' inside (cloud.google.com/storage/docs/buckets#naming)",
        )
    segments = prefix.split("/") if prefix else []
    # No wildcards (gcloud would expand them) and nothing a shell line would need quoted (the stack's
    # commands print kubectl lines that carry the location).
    if any(s in ("", ".", "..") for s in segments) or any(c.isspace() or c in "*?[]#'\"`$\\" for c in prefix):
        raise ConfigError(
            key, value, f"{shape} whose prefix has no empty, '.' or '..' parts, spaces, quotes or wildcards"
        )
    if need_prefix and not prefix:
        raise ConfigError(
            key, value, f"{shape} with a prefix: the training pods get write access to that prefix only"
        )
    return location


def _data(r: _Reader) -> DataConfig:
    dataset = _gcs_uri(r, "datasetUri", need_prefix=False)
    from workload.share.paths import NAME, NAME_RULE  # the share's folder-name rule (see _runs on the import)

    name = r.raw("datasetName") or _dataset_name(dataset)
    if not NAME.match(name):
        raise ConfigError("datasetName", name, f"a dataset name: {NAME_RULE}")
    return DataConfig(dataset=dataset, output=_gcs_uri(r, "outputUri"), dataset_name=name,
                      columns_json=_columns(r), datetime_format=_datetime_format(r))


def _columns(r: _Reader) -> str:
    """``datasetColumns``: {your column: ours}, checked by the loader's own rules (``workload.data.reading``)."""
    value = r.raw("datasetColumns")
    try:
        mapping = json.loads(value) if value.strip() else {}
    except json.JSONDecodeError:
        mapping = value
    if mapping == {}:
        return ""
    from workload.data.reading import ReadingError, check_columns  # worker code: imported where used (see _runs)

    try:
        return json.dumps(dict(check_columns(mapping, f"{PROJECT}:datasetColumns")), sort_keys=True)
    except ReadingError as err:
        raise ConfigError("datasetColumns", mapping, str(err).removeprefix(f"{PROJECT}:datasetColumns: ")) from None


def _datetime_format(r: _Reader) -> str:
    """``datasetDatetimeFormat``: strftime directives or epoch-s / epoch-ms, as `seed --datetime-format` checks."""
    value = r.raw("datasetDatetimeFormat").strip()
    from workload.data.reading import ReadingError, check_format

    try:
        return check_format(value, f"{PROJECT}:datasetDatetimeFormat") or ""
    except ReadingError as err:
        raise ConfigError("datasetDatetimeFormat", value, "strftime directives with the day and month (e.g. "
                          "'%d/%m/%Y %H:%M'), or epoch-s / epoch-ms") from err


def _dataset_name(dataset: GcsUri | None) -> str:
    """The default dataset name: ``fraud`` for simulated data, else the last folder of ``datasetUri``
    (the bucket when it has no prefix), made a valid folder name."""
    if dataset is None:
        return SIMULATED_DATASET
    last = dataset.prefix.rsplit("/", 1)[-1] or dataset.bucket
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", last).lstrip("._-")[:63]
    return name or SIMULATED_DATASET
