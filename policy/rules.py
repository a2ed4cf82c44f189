"""The guardrails of the policy pack, as pure functions over resource types and properties.

Pure so that one definition serves twice: ``policy/pack.py`` wraps each rule for ``pulumi preview
--policy-pack policy``, and ``policy.offline`` runs the very same functions over a stack rendered under
the SDK's mocks (tests, ``make render``). Nothing here needs the Pulumi engine or a provider SDK.

Properties arrive the way the engine hands them to a policy: the provider schema's camelCase names
(``releaseChannel``, ``resourceLabels``, ``deletionProtection``), numbers as floats, secrets unwrapped.
Resource rules see a resource's inputs; stack rules see every resource's outputs. During a preview a
value may still be unknown: the SDK's proxy raises on reading it and reports "can't run policy during
preview", so rules read only the keys they judge and never swallow exceptions.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra import contract, gke
from infra.config import DATA_LOSS_KEY, DELETION_PROTECTION_TIERS, END_OF_LIFE_GPUS, RELEASE_CHANNELS, GcsUri

MANDATORY, ADVISORY = "mandatory", "advisory"

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
FILESTORE = "gcp:filestore/instance:Instance"
NETWORK = "gcp:compute/network:Network"
COMPUTE_CLASS = "kubernetes:cloud.google.com/v1:ComputeClass"
SECRET = "kubernetes:core/v1:Secret"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
SERVICE_ACCOUNT = "kubernetes:core/v1:ServiceAccount"
SA_IAM_MEMBER = "gcp:serviceaccount/iAMMember:IAMMember"
PROJECT_IAM = ("gcp:projects/iAMMember:IAMMember", "gcp:projects/iAMBinding:IAMBinding")
BUCKET_IAM = ("gcp:storage/bucketIAMMember:BucketIAMMember", "gcp:storage/bucketIAMBinding:BucketIAMBinding")
PERIMETER = "gcp:accesscontextmanager/servicePerimeter:ServicePerimeter"
# What a prod perimeter must at least restrict: the APIs the card data is read and written through.
PERIMETER_DATA_SERVICES = ("storage.googleapis.com", "file.googleapis.com")

# Where each workload kind keeps its pod template (the pod spec is its "spec").
POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "kubernetes:core/v1:Pod": (),
    "kubernetes:batch/v1:Job": ("spec", "template"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template"),
    "kubernetes:apps/v1:Deployment": ("spec", "template"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template"),
    "kubernetes:apps/v1:DaemonSet": ("spec", "template"),
    "kubernetes:apps/v1:ReplicaSet": ("spec", "template"),
}

# GCP resource type -> path to its labels in the inputs. Types that take no labels are listed apart, so
# a new GCP type is a violation until someone decides (the infra tests read both from here).
LABELLED: dict[str, tuple[str, ...]] = {
    CLUSTER: ("resourceLabels",),
    NODE_POOL: ("nodeConfig", "resourceLabels"),
    FILESTORE: ("labels",),
    "gcp:artifactregistry/repository:Repository": ("labels",),
    "gcp:kms/cryptoKey:CryptoKey": ("labels",),
}
UNLABELLED: frozenset[str] = frozenset(
    {
        "gcp:projects/service:Service",
        "gcp:projects/iAMMember:IAMMember",
        "gcp:serviceaccount/account:Account",
        "gcp:compute/network:Network",
        "gcp:compute/subnetwork:Subnetwork",
        "gcp:compute/router:Router",
        "gcp:compute/routerNat:RouterNat",
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember",
        "gcp:serviceaccount/iAMMember:IAMMember",
        "gcp:storage/bucketIAMMember:BucketIAMMember",
        "gcp:kms/keyRing:KeyRing",
        "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember",
        # Binary Authorization (infra/binauthz.py): pulumi_gcp 10.2 declares no labels on these.
        "gcp:containeranalysis/note:Note",
        "gcp:containeranalysis/noteIamMember:NoteIamMember",
        "gcp:containeranalysis/occurence:Occurence",
        "gcp:binaryauthorization/attestor:Attestor",
        "gcp:binaryauthorization/policy:Policy",
        PERIMETER,
        "gcp:artifactregistry/vpcscConfig:VpcscConfig",
    }
)

# GKE also accepts EXTENDED; "UNSPECIFIED" (or nothing) means no automatic upgrades.
GOOD_RELEASE_CHANNELS = (*RELEASE_CHANNELS, "EXTENDED")
REDIS_CLIENTS = frozenset(contract.REDIS_CLIENTS)

_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_REQUIREPASS = re.compile(r"^\s*requirepass\s+\S+", re.MULTILINE)
_ENV_REF = re.compile(r"^\$\(([A-Za-z_][A-Za-z0-9_]*)\)$")


@dataclass(frozen=True)
class StackFacts:
    """What a rule may know about the stack besides its resources.

    ``labels`` maps each cost label to the value it must have, or None where any non-empty value will
    do (the pack cannot always see the stack's config).
    """

    stack: str
    on_demand_fallback: bool = False
    labels: Mapping[str, str | None] = field(default_factory=lambda: {"env": None, "app": contract.APP, "team": None})
    # The stack's datasetUri and outputUri ('' when unset): the only buckets its workloads may be granted.
    dataset_uri: str = ""
    output_uri: str = ""
    # The stack set allowDataLoss: its cluster and share may go unprotected.
    allow_data_loss: bool = False


@dataclass(frozen=True)
class Resource:
    """One resource as a stack rule sees it: its type, name, URN and outputs."""

    type: str
    name: str
    urn: str
    props: Mapping[str, Any]


ResourceCheck = Callable[[str, Mapping[str, Any], StackFacts], list[str]]
# A stack check returns (URN of the offending resource, message) pairs.
StackCheck = Callable[[Sequence[Resource], StackFacts], list[tuple[str, str]]]


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    level: str
    check_resource: ResourceCheck | None = None
    check_stack: StackCheck | None = None
    # The resource check also takes ``protect=`` (the resource's ``protect`` option, from the engine).
    reads_protect: bool = False


# --- reading properties -----------------------------------------------------------------------------


def _get(value: Any, *path: str) -> Any:
    """``value[path...]``, or None where a step is missing or not a mapping."""
    for key in path:
        if not isinstance(value, Mapping) or key not in _keys(value):
            return None
        value = value[key]
    return value


def _keys(mapping: Mapping[str, Any]) -> list[str]:
    """Key names without reading values (reading an unknown value raises during preview)."""
    return list(iter(mapping))


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def pod_template(type_: str, props: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod template (``metadata`` + ``spec``) of a workload, or None for other types."""
    if type_ not in POD_TEMPLATE_PATHS:
        return None
    template = _get(props, *POD_TEMPLATE_PATHS[type_]) if POD_TEMPLATE_PATHS[type_] else props
    return _map(template)


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        if key in _keys(pod):
            yield from (_map(c) for c in _list(pod[key]))


def _requests_gpu(pod: Mapping[str, Any]) -> bool:
    for c in _containers(pod):
        for kind in ("limits", "requests"):
            if gke.GPU_RESOURCE in _keys(_map(_get(c, "resources", kind))):
                return True
    return False


def _kind_name(type_: str, props: Mapping[str, Any]) -> str:
    return f"{type_.rsplit(':', 1)[-1]} {_get(props, 'metadata', 'name')!r}"


# --- resource rules ---------------------------------------------------------------------------------


def image_pinned_by_digest(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """A tag can be moved to other bytes; a digest cannot. ``latest`` next to a digest misleads readers."""
    template = pod_template(type_, props)
    if template is None:
        return []
    problems = []
    for c in _containers(_map(_get(template, "spec"))):
        image, name = c.get("image"), c.get("name")
        if not isinstance(image, str) or not _DIGEST.search(image):
            problems.append(
                f"{_kind_name(type_, props)}: container {name!r} image {image!r} is not pinned by digest; "
                "use name@sha256:<digest>"
            )
            continue
        last = image.split("@", 1)[0].rsplit("/", 1)[-1]
        if last.partition(":")[2] == "latest":
            problems.append(
                f"{_kind_name(type_, props)}: container {name!r} image {image!r} names the tag 'latest'; "
                "drop the tag, the digest is what runs"
            )
    return problems


def _is_share_preparation(template: Mapping[str, Any], container: Mapping[str, Any]) -> bool:
    """The one root container allowed: the share-preparation step (infra/share_prep.py), which drops every
    capability but CHOWN. A new Filestore share is root-owned and fsGroup does nothing for NFS."""
    if _get(template, "metadata", "labels", contract.COMPONENT_LABEL) != contract.SHARE_PREP:
        return False
    caps = _map(_get(container, "securityContext", "capabilities"))
    return _list(caps.get("drop")) == ["ALL"] and _list(caps.get("add")) == ["CHOWN"]


def containers_run_as_non_root(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """A root process escaping a container owns the node; the restricted Pod Security Standard agrees.
    The share-preparation step may run as root with CHOWN alone; it is still never privileged."""
    template = pod_template(type_, props)
    if template is None:
        return []
    pod = _map(_get(template, "spec"))
    pod_context = _map(_get(pod, "securityContext"))
    problems = []
    for c in _containers(pod):
        context = _map(c.get("securityContext"))
        where = f"{_kind_name(type_, props)}: container {c.get('name')!r}"

        def effective(key: str, context: Mapping[str, Any] = context) -> Any:
            return context[key] if key in _keys(context) else _get(pod_context, key)

        if _is_share_preparation(template, c):
            pass  # root by design, with CHOWN only: privilege checks below still apply
        elif effective("runAsNonRoot") is not True:
            problems.append(f"{where} does not set runAsNonRoot: true (pod or container securityContext)")
        uid = effective("runAsUser")
        if uid is None:
            problems.append(f"{where} sets no runAsUser; give it a non-zero uid")
        elif uid == 0 and not _is_share_preparation(template, c):
            problems.append(f"{where} runs as uid 0 (root)")
        if context.get("privileged") is True:
            problems.append(f"{where} is privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where} does not set allowPrivilegeEscalation: false")
    return problems


def no_end_of_life_gpu(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """GKE no longer has capacity for these: a request for one waits forever instead of failing."""
    found: list[tuple[str, Any]] = []
    if type_ == COMPUTE_CLASS:
        for i, p in enumerate(_list(_get(props, "spec", "priorities"))):
            found.append((f"ComputeClass {_get(props, 'metadata', 'name')!r} priority {i}", _get(p, "gpu", "type")))
    elif type_ in (NODE_POOL, CLUSTER):
        what = "NodePool" if type_ == NODE_POOL else "Cluster"
        for a in _list(_get(props, "nodeConfig", "guestAccelerators")):
            found.append((f"{what} guest accelerator", _get(a, "type")))
        for limit in _list(_get(props, "clusterAutoscaling", "resourceLimits")):
            found.append((f"{what} autoscaling limit", _get(limit, "resourceType")))
    else:
        template = pod_template(type_, props)
        if template is not None:
            selector = _map(_get(template, "spec", "nodeSelector"))
            if gke.ACCELERATOR_LABEL in _keys(selector):
                found.append((f"{_kind_name(type_, props)} nodeSelector", selector[gke.ACCELERATOR_LABEL]))
    return [f"{where} asks for GPU {gpu!r}: {END_OF_LIFE_GPUS[gpu]}" for where, gpu in found if gpu in END_OF_LIFE_GPUS]


def cost_labels(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """Billing exports group spend by these labels; an unlabelled resource is spend nobody owns."""
    if not type_.startswith("gcp:") or type_ in UNLABELLED:
        return []
    if type_ not in LABELLED:
        return [f"{type_}: not known to take labels or not; add it to LABELLED or UNLABELLED in policy/rules.py"]
    path = ".".join(LABELLED[type_])
    labels = _map(_get(props, *LABELLED[type_]))
    problems = []
    for key, want in facts.labels.items():
        have = labels.get(key)
        if not have:
            problems.append(f"{type_}: label {key!r} missing from {path}")
        elif want is not None and have != want:
            problems.append(f"{type_}: label {key}={have!r} in {path}, expected {want!r}")
    return problems


def stateful_protection(
    type_: str, props: Mapping[str, Any], facts: StackFacts, protect: bool = False
) -> list[str]:
    """One mistaken ``pulumi destroy``, or a routine change that replaces them (a new zone), must not
    delete the cluster or the share with the datasets and checkpoints, in any stack, unless the stack
    says data may be lost (``allowDataLoss``).

    Filestore's own deletion protection exists on ZONAL, REGIONAL and ENTERPRISE only: on a BASIC tier
    the argument fails the create (in any stack), and Pulumi's ``protect`` option (``protect``: the
    engine refuses the delete) is what guards a BASIC instance in prod.
    """
    if type_ == FILESTORE and _get(props, "tier") not in DELETION_PROTECTION_TIERS:
        tier = _get(props, "tier")
        if "deletionProtectionEnabled" in _keys(props) and props["deletionProtectionEnabled"] is not None:
            return [
                f"Filestore instance: tier {tier!r} has no deletion protection, and deletionProtectionEnabled "
                "fails the create; leave it out and protect the resource with Pulumi's `protect` option"
            ]
        if not facts.allow_data_loss and not protect:
            return [f"Filestore instance: tier {tier!r} in stack {facts.stack!r} must have Pulumi's `protect` "
                    f"option (unless {DATA_LOSS_KEY} is set)"]
        return []
    if facts.allow_data_loss:
        return []
    if type_ == CLUSTER:
        # The provider's default is true: only an explicit false turns it off.
        on = props["deletionProtection"] if "deletionProtection" in _keys(props) else True
        if on is not True:
            return [f"Cluster: deletionProtection is {on!r} in stack {facts.stack!r}; it must be true "
                    f"(unless {DATA_LOSS_KEY} is set)"]
    if type_ == FILESTORE and _get(props, "deletionProtectionEnabled") is not True:
        value = _get(props, "deletionProtectionEnabled")
        return [f"Filestore instance: deletionProtectionEnabled is {value!r} in stack {facts.stack!r}; it must be "
                f"true (unless {DATA_LOSS_KEY} is set)"]
    return []


def private_nodes(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """Nodes without public IPs cannot be reached from the internet; egress goes through Cloud NAT."""
    if type_ == CLUSTER and _get(props, "privateClusterConfig", "enablePrivateNodes") is not True:
        return ["Cluster: privateClusterConfig.enablePrivateNodes is not true; nodes get public IPs"]
    return []


def workload_identity(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """Pods get Google credentials per Kubernetes service account instead of the node's account."""
    if type_ != CLUSTER or _get(props, "enableAutopilot") is True:  # always on in Autopilot
        return []
    if not _get(props, "workloadIdentityConfig", "workloadPool"):
        return ["Cluster: workloadIdentityConfig.workloadPool is not set; pods would use the node's account"]
    return []


def release_channel(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """A channel keeps the control plane and nodes patched; without one upgrades are manual."""
    channel = _get(props, "releaseChannel", "channel")
    if type_ == CLUSTER and channel not in GOOD_RELEASE_CHANNELS:
        return [f"Cluster: releaseChannel.channel is {channel!r}; use one of {', '.join(GOOD_RELEASE_CHANNELS)}"]
    return []


# --- stack rules ------------------------------------------------------------------------------------


def _of_type(resources: Sequence[Resource], type_: str) -> list[Resource]:
    return [r for r in resources if r.type == type_]


def _workloads(resources: Sequence[Resource]) -> Iterator[tuple[Resource, Mapping[str, Any]]]:
    for r in resources:
        template = pod_template(r.type, r.props)
        if template is not None:
            yield r, template


def training_on_spot(resources: Sequence[Resource], facts: StackFacts) -> list[tuple[str, str]]:
    """Training tolerates preemption by design; paying on-demand prices for it needs a stack's consent."""
    classes = {_get(r.props, "metadata", "name"): r for r in _of_type(resources, COMPUTE_CLASS)}
    problems = []
    for r, template in _workloads(resources):
        pod = _map(_get(template, "spec"))
        component = _get(template, "metadata", "labels", contract.COMPONENT_LABEL)
        if not (_requests_gpu(pod) or component == contract.WORKER):
            continue
        where = _kind_name(r.type, r.props)
        selector = _map(_get(pod, "nodeSelector"))
        if _get(selector, gke.SPOT_LABEL) == "true":
            continue
        class_name = _get(selector, gke.COMPUTE_CLASS_LABEL)
        if class_name is None:
            problems.append(
                (
                    r.urn,
                    f"{where}: training pods must select spot capacity: nodeSelector "
                    f'{gke.SPOT_LABEL}: "true", or {gke.COMPUTE_CLASS_LABEL} with a class that lists spot first',
                )
            )
            continue
        if class_name not in classes:
            problems.append((r.urn, f"{where}: selects compute class {class_name!r}, which the stack does not declare"))
            continue
        spec = _map(_get(classes[class_name].props, "spec"))
        spots = [_get(p, "spot") is True for p in _list(_get(spec, "priorities"))]
        if not spots or not spots[0]:
            problems.append((r.urn, f"{where}: compute class {class_name!r} does not list spot first"))
        elif not facts.on_demand_fallback:
            if not all(spots):
                problems.append(
                    (
                        r.urn,
                        f"{where}: compute class {class_name!r} falls back to on-demand, "
                        "but the stack does not enable onDemandFallback",
                    )
                )
            if _get(spec, "whenUnsatisfiable") != "DoNotScaleUp":
                problems.append(
                    (
                        r.urn,
                        f"{where}: compute class {class_name!r} must set whenUnsatisfiable: DoNotScaleUp, "
                        "or GKE scales up on-demand nodes when spot is out",
                    )
                )
    return problems


def _is_redis(template: Mapping[str, Any]) -> bool:
    if _get(template, "metadata", "labels", contract.COMPONENT_LABEL) == contract.REDIS:
        return True
    for c in _containers(_map(_get(template, "spec"))):
        image = c.get("image")
        if isinstance(image, str) and image.split("@")[0].rsplit("/", 1)[-1].split(":")[0] == "redis":
            return True
    return False


def _secret_text(secret: Mapping[str, Any], key: str) -> str | None:
    """A key of a Secret as text, from ``stringData`` (inputs) or base64 ``data`` (what the cluster keeps)."""
    text = _get(secret, "stringData", key)
    if isinstance(text, str):
        return text
    data = _get(secret, "data", key)
    if isinstance(data, str):
        try:
            return base64.b64decode(data).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
    return None


def _password_source(
    template: Mapping[str, Any], container: Mapping[str, Any], secrets: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """How the Redis container gets ``requirepass`` from a Secret, or None if it does not."""
    argv = [a for a in _list(container.get("command")) + _list(container.get("args")) if isinstance(a, str)]
    if "--requirepass" in argv[:-1]:
        match = _ENV_REF.match(argv[argv.index("--requirepass") + 1])
        env = {e.get("name"): e for e in map(_map, _list(container.get("env")))}
        ref = _get(env.get(match.group(1)) if match else None, "valueFrom", "secretKeyRef", "name")
        return f"--requirepass from Secret {ref!r}" if ref in secrets else None
    volumes = {v.get("name"): v for v in map(_map, _list(_get(template, "spec", "volumes")))}
    for mount in map(_map, _list(container.get("volumeMounts"))):
        secret_name = _get(volumes.get(mount.get("name")), "secret", "secretName")
        mount_path = str(mount.get("mountPath", "")).rstrip("/")
        if secret_name not in secrets:
            continue
        items = {i.get("path"): i.get("key") for i in map(_map, _list(_get(volumes[mount["name"]], "secret", "items")))}
        for arg in argv:
            if not arg.startswith(mount_path + "/"):
                continue
            file = arg[len(mount_path) + 1 :]
            key = items.get(file) if items else file  # with items, only the listed keys are projected
            text = _secret_text(secrets[secret_name], key) if key else None
            if text is not None and _REQUIREPASS.search(text):
                return f"config file {arg} from Secret {secret_name!r}"
    return None


def redis_requires_password(resources: Sequence[Resource], facts: StackFacts) -> list[tuple[str, str]]:
    """The queue holds every work item; an open Redis lets any pod in the cluster drain or poison it."""
    problems = []
    for r, template in _workloads(resources):
        if not _is_redis(template):
            continue
        namespace = _get(r.props, "metadata", "namespace")
        secrets = {
            _get(s.props, "metadata", "name"): _map(s.props)
            for s in _of_type(resources, SECRET)
            if _get(s.props, "metadata", "namespace") == namespace
        }
        for c in _containers(_map(_get(template, "spec"))):
            if _password_source(template, c, secrets) is None:
                problems.append(
                    (
                        r.urn,
                        f"{_kind_name(r.type, r.props)}: Redis container {c.get('name')!r} does not require "
                        "a password from a Secret of the stack (a `requirepass` config file mounted from the Secret, "
                        "or --requirepass $(VAR) with VAR from a secretKeyRef)",
                    )
                )
    return problems


def _selects(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """Kubernetes label-selector semantics (an empty selector selects everything)."""
    if any(labels.get(k) != v for k, v in _map(selector.get("matchLabels")).items()):
        return False
    for e in map(_map, _list(selector.get("matchExpressions"))):
        key, op, values = e.get("key"), e.get("operator"), _list(e.get("values"))
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(str(op), False)
        if not ok:
            return False
    return True


def _only_clients(selector: Mapping[str, Any]) -> bool:
    """True when every pod the selector can match is one of this app's Redis clients (contract.REDIS_CLIENTS)."""
    names = {selector.get("matchLabels", {}).get(contract.NAME_LABEL)}
    components = {_map(selector.get("matchLabels")).get(contract.COMPONENT_LABEL)}
    for e in map(_map, _list(selector.get("matchExpressions"))):
        if e.get("operator") == "In" and e.get("key") == contract.NAME_LABEL:
            names.add(frozenset(_list(e.get("values"))))
        if e.get("operator") == "In" and e.get("key") == contract.COMPONENT_LABEL:
            components.add(frozenset(_list(e.get("values"))))
    name_ok = contract.APP in names or frozenset({contract.APP}) in names
    component_ok = any(
        (isinstance(c, str) and c in REDIS_CLIENTS) or (isinstance(c, frozenset) and c and c <= REDIS_CLIENTS)
        for c in components
    )
    return name_ok and component_ok


def redis_network_policy(resources: Sequence[Resource], facts: StackFacts) -> list[tuple[str, str]]:
    """A password is one lock; a NetworkPolicy admitting only loader and worker pods is the second."""
    problems = []
    for r, template in _workloads(resources):
        if not _is_redis(template):
            continue
        where = _kind_name(r.type, r.props)
        namespace = _get(r.props, "metadata", "namespace")
        pod_labels = _map(_get(template, "metadata", "labels"))
        policies = [
            p
            for p in _of_type(resources, NETWORK_POLICY)
            if _get(p.props, "metadata", "namespace") == namespace
            and _selects(_map(_get(p.props, "spec", "podSelector")), pod_labels)
        ]
        guarding = [p for p in policies if "Ingress" in _list(_get(p.props, "spec", "policyTypes"))]
        if not guarding:
            problems.append((r.urn, f"{where}: no NetworkPolicy with policyType Ingress selects the Redis pods"))
        # Policies add up: one that admits anyone opens Redis whatever the others say.
        for p in policies:
            for i, rule in enumerate(map(_map, _list(_get(p.props, "spec", "ingress")))):
                peers = list(map(_map, _list(rule.get("from"))))
                who = f"NetworkPolicy {_get(p.props, 'metadata', 'name')!r} ingress rule {i}"
                if not peers:
                    problems.append((p.urn, f"{who} admits every source; list the loader and worker pods"))
                for peer in peers:
                    if set(peer) - {"podSelector"} or not _only_clients(_map(peer.get("podSelector"))):
                        problems.append(
                            (
                                p.urn,
                                f"{who} admits {dict(peer)!r}; only {contract.NAME_LABEL}={contract.APP} pods "
                                f"with {contract.COMPONENT_LABEL} in {sorted(REDIS_CLIENTS)} may reach Redis",
                            )
                        )
    return problems


def _network_name(value: Any, by_id: Mapping[str, str]) -> str:
    """A network reference (id, self link, name) reduced to the network's name."""
    text = str(value)
    return by_id.get(text) or text.rstrip("/").rsplit("/", 1)[-1]


def filestore_on_cluster_network(resources: Sequence[Resource], facts: StackFacts) -> list[tuple[str, str]]:
    """Pods reach Filestore over the VPC: an instance on another network is a PV that never mounts."""
    by_id: dict[str, str] = {}
    for n in _of_type(resources, NETWORK):
        name = _get(n.props, "name")
        for key in ("id", "selfLink"):
            ref = _get(n.props, key)
            if ref and name:
                by_id[str(ref)] = str(name)
    clusters = {
        c.name: _network_name(_get(c.props, "network") or "default", by_id) for c in _of_type(resources, CLUSTER)
    }
    if not clusters:
        return []
    problems = []
    for fs in _of_type(resources, FILESTORE):
        networks = [_network_name(_get(n, "network"), by_id) for n in _list(_get(fs.props, "networks"))]
        if not networks:
            problems.append((fs.urn, f"Filestore instance {fs.name!r} names no network"))
        for network in networks:
            if network not in clusters.values():
                problems.append(
                    (
                        fs.urn,
                        f"Filestore instance {fs.name!r} is on network {network!r}, the cluster on "
                        f"{sorted(set(clusters.values()))}; pods could not mount it",
                    )
                )
    return problems


# Object roles a workload may hold on a bucket: read the dataset; write (and overwrite) results.
READ_ROLES = frozenset({"roles/storage.objectViewer"})
WRITE_ROLES = frozenset({"roles/storage.objectCreator", "roles/storage.objectUser"})
# Basic roles carry every storage permission of the project.
BASIC_ROLES = frozenset({"roles/owner", "roles/editor", "roles/viewer"})
WORKLOAD_IDENTITY_USER = "roles/iam.workloadIdentityUser"


def _workload_accounts(resources: Sequence[Resource]) -> set[str]:
    """Emails of the Google service accounts that pods act as: named by a Kubernetes service account's
    Workload Identity annotation, or trusting a workload identity pool member."""
    emails = set()
    for ksa in _of_type(resources, SERVICE_ACCOUNT):
        email = _get(ksa.props, "metadata", "annotations", contract.GCP_SERVICE_ACCOUNT_ANNOTATION)
        if isinstance(email, str) and email:
            emails.add(email)
    for binding in _of_type(resources, SA_IAM_MEMBER):
        member = str(_get(binding.props, "member") or "")
        if _get(binding.props, "role") == WORKLOAD_IDENTITY_USER and ".svc.id.goog[" in member:
            # serviceAccountId: projects/<project>/serviceAccounts/<email>
            emails.add(str(_get(binding.props, "serviceAccountId") or "").rsplit("/", 1)[-1])
    return emails


def _granted_to(grant: Resource, emails: set[str]) -> list[str]:
    members = [_get(grant.props, "member")] if "member" in _keys(grant.props) else []
    members += _list(_get(grant.props, "members"))
    return [str(m)[len("serviceAccount:") :] for m in members if str(m).removeprefix("serviceAccount:") in emails]


def workload_storage_scope(resources: Sequence[Resource], facts: StackFacts) -> list[tuple[str, str]]:
    """A pod's identity reaches the user's data, so it gets the narrowest role on the narrowest resource:
    object read on the datasetUri bucket (under its prefix when it names one), object write under the outputUri
    prefix, nothing project-wide."""
    workloads = _workload_accounts(resources)
    if not workloads:
        return []
    dataset, output = GcsUri.split(facts.dataset_uri), GcsUri.split(facts.output_uri)
    problems = []
    for grant in resources:
        if grant.type in PROJECT_IAM:
            role = _get(grant.props, "role")
            if str(role).startswith("roles/storage.") or role in BASIC_ROLES:
                for email in _granted_to(grant, workloads):
                    problems.append(
                        (
                            grant.urn,
                            f"{grant.type.rsplit(':', 1)[-1]} {grant.name!r}: grants {role} on the whole project to "
                            f"workload service account {email}; grant object roles on the datasetUri/outputUri "
                            "bucket instead",
                        )
                    )
        if grant.type not in BUCKET_IAM:
            continue
        role = _get(grant.props, "role")
        # The provider reports the bucket as "b/<name>" once created; inputs name it plainly.
        bucket = str(_get(grant.props, "bucket") or "").removeprefix("b/")
        expression = str(_get(grant.props, "condition", "expression") or "")
        for email in _granted_to(grant, workloads):
            where = f"{grant.type.rsplit(':', 1)[-1]} {grant.name!r}: {role} on bucket {bucket!r} for {email}"
            if role in READ_ROLES and dataset and bucket == dataset.bucket:
                # Object read on the dataset bucket; under datasetUri's prefix only when it names one.
                if dataset.prefix and expression.strip() != dataset.readable():
                    problems.append((grant.urn, f"{where}: read access must be limited to {dataset.readable()}"))
                continue
            if role in WRITE_ROLES and output and bucket == output.bucket:
                limit = f'resource.name.startsWith("{output.objects}")'
                if not (output.prefix and expression.strip() == limit):
                    problems.append((grant.urn, f"{where}: write access must be limited to {limit}"))
                continue
            allowed = [f"objectViewer on {facts.dataset_uri}"] if dataset else []
            allowed += [f"objectCreator/objectUser under {facts.output_uri}"] if output else []
            what = f"workloads may only hold {' or '.join(allowed)}" if allowed else (
                "workloads hold no bucket roles unless datasetUri or outputUri is set"
            )
            problems.append((grant.urn, f"{where}: {what}"))
    return problems


# --- hardening (issue 36) -----------------------------------------------------------------------------

ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
ROLE_BINDINGS = ("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding",
                 "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
NAMESPACE = "kubernetes:core/v1:Namespace"
# (API group, resource) pairs whose "create" starts a pod: with it, a pod's account can run any image as any
# service account of its namespace, mounting any Secret there.
POD_CREATING = frozenset({("batch", "jobs"), ("batch", "cronjobs"), ("", "pods"), ("apps", "deployments"),
                          ("apps", "statefulsets"), ("apps", "daemonsets"), ("apps", "replicasets")})

# Rules that read settings the stacks do not produce yet: advisory while listed here; once every stack complies
# the rule leaves this set and is mandatory (tests/policy/test_policy_stacks.py then demands every stack pass it).
# The launcher apart from the loader and the default-deny policies of every namespace are in every stack: those
# two rules are mandatory.
# prod-control-plane-not-public, prod-admission-and-encryption and prod-card-data-at-rest are mandatory:
# stacks/Pulumi.prod.yaml sets authorizedNetworks, binaryAuthorization, secretsKmsKey, and a ZONAL share under a key
# of the stack's own, exported to the nodes' range with root squashed; prod-service-perimeter too: it sets
# vpcServiceControls (dryRun) with an access policy the operator replaces.
AWAITING_INFRA: frozenset[str] = frozenset()


def level(name: str) -> str:
    """A rule's enforcement level: advisory while it awaits the infra branch's settings."""
    return ADVISORY if name in AWAITING_INFRA else MANDATORY


def stateful_pulumi_protect(
    type_: str, props: Mapping[str, Any], facts: StackFacts, protect: bool = False
) -> list[str]:
    """A replacing change (region, cluster mode, range names; zone or tier of a share) makes Pulumi create the
    new cluster or an empty share first and fail on the old one's delete, the Jobs re-pointed already;
    Pulumi's own ``protect`` refuses the replacement before anything is created. Cluster and Filestore of
    every tier carry it unless the stack allows data loss."""
    if type_ in (CLUSTER, FILESTORE) and not protect and not facts.allow_data_loss:
        what = "Cluster" if type_ == CLUSTER else f"Filestore instance (tier {_get(props, 'tier')!r})"
        return [f"{what} in stack {facts.stack!r} has no Pulumi `protect` option: a replacing change would "
                f"create its successor before the delete fails (set {DATA_LOSS_KEY} to allow losing it)"]
    return []


def _namespace_of(r: Resource) -> str:
    return str(_get(r.props, "metadata", "namespace") or "")


def _loader_accounts(resources: Sequence[Resource]) -> set[tuple[str, str]]:
    """(namespace, service account) of every pod labelled as the loader: the pod that parses the bank's files."""
    accounts = set()
    for r, template in _workloads(resources):
        if _get(template, "metadata", "labels", contract.COMPONENT_LABEL) == contract.LOADER:
            account = _get(template, "spec", "serviceAccountName") or "default"
            accounts.add((_namespace_of(r), str(account)))
    return accounts


def _creates_pods(role: Resource) -> list[str]:
    """The "group/resource" pairs a Role or ClusterRole may create pods through."""
    found = []
    for rule in _list(_get(role.props, "rules")):
        verbs = {str(v) for v in _list(_get(rule, "verbs"))}
        if not verbs & {"create", "*"}:
            continue
        for group in _list(_get(rule, "apiGroups")):
            for resource in _list(_get(rule, "resources")):
                pairs = {(g, r) for g, r in POD_CREATING if group in (g, "*") and resource in (r, "*")}
                found += sorted(f"{g or 'core'}/{r}" for g, r in pairs)
    return found


def _bound_role(binding: Resource, resources: Sequence[Resource]) -> Resource | None:
    kind, name = _get(binding.props, "roleRef", "kind"), _get(binding.props, "roleRef", "name")
    for role in resources:
        if role.type == (ROLE if kind == "Role" else CLUSTER_ROLE) and _get(role.props, "metadata", "name") == name:
            if kind != "Role" or _namespace_of(role) == _namespace_of(binding):
                return role
    return None


def loader_cannot_create_pods(resources: Sequence[Resource], facts: StackFacts) -> list[tuple[str, str]]:
    """The loader parses untrusted bank files; an account that may create Jobs (or any pod) can start any
    image as any service account of the namespace, mounting any Secret. Creating the training and scoring
    Jobs belongs to a launcher identity of its own."""
    loaders = _loader_accounts(resources)
    problems = []
    for binding in (r for r in resources if r.type in ROLE_BINDINGS):
        role = _bound_role(binding, resources)
        creates = _creates_pods(role) if role else []
        for subject in _list(_get(binding.props, "subjects")):
            ns = str(_get(subject, "namespace") or _namespace_of(binding))
            if _get(subject, "kind") == "ServiceAccount" and (ns, _get(subject, "name")) in loaders and creates:
                problems.append((binding.urn, f"{_kind_name(binding.type, binding.props)} lets the loader's service "
                                 f"account {ns}/{_get(subject, 'name')} create {', '.join(creates)}; give the "
                                 "launch to an identity of its own"))
    return problems


def _denies_all(policy: Resource) -> bool:
    spec = _map(_get(policy.props, "spec"))
    selector = _map(_get(spec, "podSelector"))
    every_pod = not _get(selector, "matchLabels") and not _get(selector, "matchExpressions")
    types = {str(t) for t in _list(_get(spec, "policyTypes"))}
    return every_pod and {"Ingress", "Egress"} <= types and not _list(_get(spec, "ingress")) and not _list(
        _get(spec, "egress"))


def default_deny_network_policy(resources: Sequence[Resource], facts: StackFacts) -> list[tuple[str, str]]:
    """Every namespace of the stack starts from "no traffic in or out" (a NetworkPolicy selecting every pod,
    Ingress and Egress, no rule); what the pods need is allowed on top, so a pod holding card data cannot
    reach the internet through NAT unless a policy says so."""
    namespaces = {str(_get(r.props, "metadata", "name")): r.urn for r in _of_type(resources, NAMESPACE)}
    for r in resources:
        if r.type.startswith("kubernetes:") and _namespace_of(r):
            namespaces.setdefault(_namespace_of(r), "")
    denied = {_namespace_of(p) for p in _of_type(resources, NETWORK_POLICY) if _denies_all(p)}
    return [(urn, f"namespace {ns!r} has no default-deny NetworkPolicy (podSelector {{}}, policyTypes Ingress and "
             "Egress, no rules); every pod may talk to anything") for ns, urn in sorted(namespaces.items())
            if ns not in denied]


def is_prod(facts: StackFacts) -> bool:
    return (facts.labels.get("env") or facts.stack) == "prod" or facts.stack == "prod"


def prod_control_plane_not_public(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """In prod the Kubernetes API is reachable only from named networks: a private endpoint, or authorized
    networks without 0.0.0.0/0 (CIS GKE 5.6.3, "Ensure Control Plane Authorized Networks is Enabled")."""
    if type_ != CLUSTER or not is_prod(facts) or _get(props, "privateClusterConfig", "enablePrivateEndpoint") is True:
        return []
    blocks = [str(_get(b, "cidrBlock")) for b in _list(_get(props, "masterAuthorizedNetworksConfig", "cidrBlocks"))]
    if not blocks or "0.0.0.0/0" in blocks:
        return [f"Cluster in stack {facts.stack!r}: the control plane has a public endpoint and "
                f"{'authorized networks open to 0.0.0.0/0' if blocks else 'no authorized networks'}; set "
                "masterAuthorizedNetworksConfig.cidrBlocks (or a private endpoint)"]
    return []


def _prod_cluster_hardening(props: Mapping[str, Any]) -> list[str]:
    problems = []
    if _get(props, "binaryAuthorization", "evaluationMode") != "PROJECT_SINGLETON_POLICY_ENFORCE":
        problems.append("binaryAuthorization.evaluationMode is not PROJECT_SINGLETON_POLICY_ENFORCE: any image may run "
                        "(CIS GKE 5.10.5)")
    if _get(props, "databaseEncryption", "state") != "ENCRYPTED" or not _get(props, "databaseEncryption", "keyName"):
        problems.append("databaseEncryption is not ENCRYPTED with a Cloud KMS keyName: Secrets are not encrypted with "
                        "a customer-managed key (CIS GKE 5.3.1)")
    return problems


def _prod_share_hardening(props: Mapping[str, Any]) -> list[str]:
    problems = [] if _get(props, "kmsKeyName") else [
        "kmsKeyName is not set: the card data is not under a customer-managed key (BASIC tiers take none)"]
    exports = [_map(e) for e in _list(_get(props, "fileShares", "nfsExportOptions"))]
    if not exports or any(e.get("squashMode") != "ROOT_SQUASH" or not _list(e.get("ipRanges")) for e in exports):
        problems.append("fileShares.nfsExportOptions do not limit the share to named ipRanges with squashMode "
                        "ROOT_SQUASH: any client of the VPC may mount it as root")
    # Squashed to uid or gid 0 is root by another name (Filestore's anonUid/anonGid default to 65534).
    if any(0 in (e.get("anonUid"), e.get("anonGid")) for e in exports):
        problems.append("fileShares.nfsExportOptions squash root to anonUid/anonGid 0, which is root again")
    return problems


def prod_admission_and_encryption(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """In prod (a KMS key costs money), only images the project's Binary Authorization policy admits run, and
    Kubernetes Secrets are encrypted with a customer key."""
    if not is_prod(facts) or type_ != CLUSTER:
        return []
    return [f"Cluster in stack {facts.stack!r}: {p}" for p in _prod_cluster_hardening(props)]


BINAUTHZ_POLICY = "gcp:binaryauthorization/policy:Policy"
BINAUTHZ_ATTESTOR = "gcp:binaryauthorization/attestor:Attestor"
ENFORCED = "ENFORCED_BLOCK_AND_AUDIT_LOG"


def _attestor_names(resources: Sequence[Resource]) -> set[str]:
    """Every way a policy may name the stack's attestors: the ID, ``projects/<p>/attestors/<name>``."""
    names: set[str] = set()
    for a in _of_type(resources, BINAUTHZ_ATTESTOR):
        names.update(str(v) for v in (a.props.get("id"), f"projects/{a.props.get('project')}/attestors/"
                                      f"{a.props.get('name')}") if v)
    return names


def _admission_problems(rule: Any, what: str, attestors: set[str]) -> list[str]:
    """An admission rule that admits more than the stack's attestations (ALWAYS_DENY passes)."""
    mode, by = _get(rule, "evaluationMode"), [str(a) for a in _list(_get(rule, "requireAttestationsBies"))]
    if mode == "ALWAYS_DENY":
        return []
    if mode != "REQUIRE_ATTESTATION" or not by or not set(by) <= attestors:
        return [f"{what} is {mode or 'missing'} (by {by or 'no attestor'}), not REQUIRE_ATTESTATION by the stack's own "
                "attestor: images it did not sign may run"]
    if _get(rule, "enforcementMode") != ENFORCED:
        return [f"{what} only logs (enforcementMode {_get(rule, 'enforcementMode')!r}, not {ENFORCED})"]
    return []


def _policy_problems(policy: Resource, clusters: list[Resource], attestors: set[str]) -> list[str]:
    props = policy.props
    problems = [] if props.get("globalPolicyEvaluationMode") == "ENABLE" else [
        "globalPolicyEvaluationMode is not ENABLE: GKE's own system images would need attestations too"]
    if _list(props.get("admissionWhitelistPatterns")):
        problems.append("admissionWhitelistPatterns admit images by path, whatever is pushed there")
    problems += _admission_problems(props.get("defaultAdmissionRule"), "the default rule", attestors)
    rules_by_cluster = {str(_get(r, "cluster")): r for r in _list(props.get("clusterAdmissionRules"))}
    for key, rule in rules_by_cluster.items():
        problems += _admission_problems(rule, f"the rule for cluster {key}", attestors)
    by_default = _get(props, "defaultAdmissionRule", "evaluationMode") == "REQUIRE_ATTESTATION"
    for c in clusters:  # a cluster without a rule of its own is judged by the default rule
        key = f"{c.props.get('location')}.{c.props.get('name')}"
        if key not in rules_by_cluster and not by_default:
            problems.append(f"no rule for cluster {key}: the default rule denies the stack's own images too")
    return problems


def binary_authorization_attested(resources: Sequence[Resource], facts: StackFacts) -> list[tuple[str, str]]:
    """A cluster that enforces the project's Binary Authorization policy (every prod cluster) comes with that
    policy in the stack: nothing runs but images the stack's own attestor signed (and GKE's system images)."""
    clusters = [c for c in _of_type(resources, CLUSTER) if is_prod(facts) or _get(
        c.props, "binaryAuthorization", "evaluationMode") == "PROJECT_SINGLETON_POLICY_ENFORCE"]
    policies = _of_type(resources, BINAUTHZ_POLICY)
    if clusters and not policies:
        return [(c.urn, f"Cluster in stack {facts.stack!r} enforces the project's Binary Authorization policy, but "
                 "the stack declares no policy and no attestor: nothing says only its signed images run (CIS GKE "
                 "5.10.5)") for c in clusters]
    attestors = _attestor_names(resources)
    return [(p.urn, f"Binary Authorization policy in stack {facts.stack!r}: {m}")
            for p in (policies if clusters else []) for m in _policy_problems(p, clusters, attestors)]


def prod_card_data_at_rest(type_: str, props: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """In prod (a Filestore tier that takes a key costs more than BASIC), the share with the card data is under a
    customer key, exported to named ranges only, root squashed."""
    if not is_prod(facts) or type_ != FILESTORE:
        return []
    return [f"Filestore instance in stack {facts.stack!r}: {p}" for p in _prod_share_hardening(props)]


def _perimeter_gaps(props: Mapping[str, Any]) -> list[str]:
    """What a perimeter leaves out of the prod ask: a project inside, the data services restricted (in its dry-run
    ``spec`` when ``useExplicitDryRunSpec``, else in its enforced ``status``)."""
    config = _map(_get(props, "spec" if _get(props, "useExplicitDryRunSpec") is True else "status"))
    gaps = [] if any(str(r).startswith("projects/") for r in _list(_get(config, "resources"))) else [
        "no project inside"]
    restricted = {str(s) for s in _list(_get(config, "restrictedServices"))}
    missing = [s for s in PERIMETER_DATA_SERVICES if s not in restricted]
    return gaps + ([f"{', '.join(missing)} not restricted"] if missing else [])


def prod_service_perimeter(resources: Sequence[Resource], facts: StackFacts) -> list[tuple[str, str]]:
    """In prod (VPC Service Controls cost nothing but need an organisation), the project sits in a perimeter that
    restricts the APIs the card data goes through, so a stolen key cannot read it from outside the project. Dry run
    counts: Google's rollout is dry run first, enforced once its logs show no legitimate caller refused."""
    if not is_prod(facts):
        return []
    perimeters = _of_type(resources, PERIMETER)
    gaps = {p.urn: _perimeter_gaps(p.props) for p in perimeters}
    if perimeters and any(not g for g in gaps.values()):
        return []
    if not perimeters:
        return [("", f"stack {facts.stack!r} declares no VPC Service Controls perimeter; set vpcServiceControls "
                 "(dryRun or enforced) and vpcAccessPolicy")]
    return [(urn, f"ServicePerimeter in stack {facts.stack!r}: {'; '.join(g)}") for urn, g in gaps.items()]


RULES: tuple[Rule, ...] = (
    Rule(
        "training-on-spot",
        "Training pods run only on spot capacity unless the stack enables on-demand "
        "fallback (a ComputeClass listing spot first)",
        MANDATORY,
        check_stack=training_on_spot,
    ),
    Rule(
        "no-end-of-life-gpu",
        "No end-of-life GPU type in compute classes, node pools or node selectors",
        MANDATORY,
        check_resource=no_end_of_life_gpu,
    ),
    Rule(
        "image-pinned-by-digest",
        "Container images are pinned by digest, never by a tag alone or 'latest'",
        MANDATORY,
        check_resource=image_pinned_by_digest,
    ),
    Rule(
        "containers-run-as-non-root",
        "Containers run as a non-zero uid with runAsNonRoot, unprivileged, without privilege escalation",
        MANDATORY,
        check_resource=containers_run_as_non_root,
    ),
    Rule(
        "redis-requires-password",
        "Redis requires a password taken from a Secret",
        MANDATORY,
        check_stack=redis_requires_password,
    ),
    Rule(
        "redis-network-policy",
        "Only loader and worker pods reach Redis, through a NetworkPolicy",
        MANDATORY,
        check_stack=redis_network_policy,
    ),
    Rule(
        "filestore-on-cluster-network",
        "The Filestore instance is on the cluster's VPC network",
        MANDATORY,
        check_stack=filestore_on_cluster_network,
    ),
    Rule(
        "workload-storage-scope",
        "Workload service accounts hold object roles on the datasetUri bucket (read) and under the outputUri "
        "prefix (write) only, never project-wide storage roles or roles on other buckets",
        MANDATORY,
        check_stack=workload_storage_scope,
    ),
    Rule(
        "stateful-protection",
        "Every stack keeps deletion protection on its cluster and Filestore (Pulumi's protect on BASIC tiers, "
        f"which take no deletionProtectionEnabled) unless it sets {DATA_LOSS_KEY}",
        MANDATORY,
        check_resource=stateful_protection,
        reads_protect=True,
    ),
    Rule(
        "cost-labels",
        "Every GCP resource that takes labels carries env, app and team",
        MANDATORY,
        check_resource=cost_labels,
    ),
    Rule(
        "stateful-pulumi-protect",
        f"Cluster and Filestore (every tier) carry Pulumi's protect unless the stack sets {DATA_LOSS_KEY}",
        level("stateful-pulumi-protect"),
        check_resource=stateful_pulumi_protect,
        reads_protect=True,
    ),
    Rule(
        "loader-cannot-create-pods",
        "The loader's service account may not create Jobs or any other pod-starting object",
        level("loader-cannot-create-pods"),
        check_stack=loader_cannot_create_pods,
    ),
    Rule(
        "default-deny-network-policy",
        "Every namespace has a default-deny NetworkPolicy for ingress and egress",
        level("default-deny-network-policy"),
        check_stack=default_deny_network_policy,
    ),
    Rule(
        "prod-control-plane-not-public",
        "In prod the control plane has a private endpoint or authorized networks (not 0.0.0.0/0)",
        level("prod-control-plane-not-public"),
        check_resource=prod_control_plane_not_public,
    ),
    Rule(
        "prod-admission-and-encryption",
        "In prod: Binary Authorization enforced, Secrets under a Cloud KMS key",
        level("prod-admission-and-encryption"),
        check_resource=prod_admission_and_encryption,
    ),
    Rule(
        "binary-authorization-attested",
        "A cluster enforcing Binary Authorization (every prod cluster) runs only images the stack's own attestor "
        "signed: the stack declares the project's policy, default deny, the cluster's rule requiring its attestor",
        level("binary-authorization-attested"),
        check_stack=binary_authorization_attested,
    ),
    Rule(
        "prod-card-data-at-rest",
        "In prod: the share under a customer key, exported to named ranges with root squash",
        level("prod-card-data-at-rest"),
        check_resource=prod_card_data_at_rest,
    ),
    Rule(
        "prod-service-perimeter",
        "In prod: the project in a VPC Service Controls perimeter (dry run or enforced) restricting Storage and "
        "Filestore",
        level("prod-service-perimeter"),
        check_stack=prod_service_perimeter,
    ),
    Rule("private-nodes", "Cluster nodes have no public IPs", ADVISORY, check_resource=private_nodes),
    Rule(
        "workload-identity", "Workload Identity is enabled on the cluster", ADVISORY, check_resource=workload_identity
    ),
    Rule("release-channel", "The cluster follows a release channel", ADVISORY, check_resource=release_channel),
)
