"""Run the program for a stack under the Pulumi SDK's mock engine, without a cloud or the Pulumi CLI.

``render("dev")`` applies config the way the CLI does (``Pulumi.yaml`` defaults, then
``stacks/Pulumi.dev.yaml``, then overrides), runs ``infra.program.build`` with fake provider outputs
(Filestore IP, cluster endpoint and CA, image digest...), waits for every resource and output, and
returns what was registered: inputs, parent, provider, dependencies and options of each resource,
plus the resolved stack outputs. ``Rendered.manifests()`` turns the Kubernetes objects into plain
manifests (for ``kubernetes-validate``, ``make render`` and policy checks); ``write`` puts them and an
inventory of every resource on disk with secret values masked.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import mocks, settings
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from infra import config
from infra.program import build

REPO_ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = REPO_ROOT / "stacks"
FAKE_PROJECT_ID = "spot-trainer-test"
FAKE_PROJECT_NUMBER = "123456789012"

# Fabricated provider outputs: tests compare program wiring against these.
FILESTORE_IP = "10.99.0.2"
CLUSTER_ENDPOINT = "203.0.113.10"
CLUSTER_CA = "ZmFrZS1jYQ=="  # base64("fake-ca")
IMAGE_DIGEST = "sha256:" + "ab" * 32
ACCESS_TOKEN = "fake-access-token"
# infra/binauthz.py under mocks: the attestation key's public key, the signature KMS returns, who runs `up`.
KMS_PUBLIC_KEY = "-----BEGIN PUBLIC KEY-----\nfake\n-----END PUBLIC KEY-----\n"
KMS_SIGNATURE = "ZmFrZS1zaWduYXR1cmU="
DEPLOYER_EMAIL = "st-deploy@spot-trainer-test.iam.gserviceaccount.com"

# The GPU quota limits the fake Cloud Quotas API reports (quota id -> limit); tests change them. A limit is one
# row for every location, a dict one row per region it names, None no row at all (a quota the API does not know).
GPU_QUOTA_LIMIT = 16.0
GPU_QUOTAS: dict[str, float | dict[str, float] | None] = {}
GPU_QUOTA_CALLS: list[pulumi.runtime.MockCallArgs] = []  # every call to it, for tests of what was asked
# Buckets the fake Cloud Storage reports with uniform bucket-level access off (tests add to it); any other
# bucket exists with it on.
NON_UNIFORM_BUCKETS: set[str] = set()

MASK = "[secret]"
# Values under such keys are credentials even where the engine would not mark them secret (a provider
# function's result, for instance): masked in anything written to disk.
_CREDENTIAL_KEY = re.compile(r"password|token|kubeconfig|privatekey|credentials", re.IGNORECASE)
# A dynamic resource's ``__provider``: its provider class pickled by the SDK (it changes with any edit of the module).
_PICKLED_PROVIDER = "__provider"


def stack_names() -> list[str]:
    """Every ``stacks/Pulumi.<stack>.yaml``: a new stack file is picked up with no code change."""
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in STACKS_DIR.glob("Pulumi.*.yaml"))


STACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def stack_name(text: str) -> str:
    """A stack name as ``pulumi stack init`` takes it (argparse type: a bad one is a one-line error)."""
    if not STACK_NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"stack name {text!r} is not allowed: letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    return text


def _as_config_string(value: Any) -> str:
    """The engine hands the program strings: JSON for lists/objects, lowercase booleans."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def stack_file(stack: str) -> Path:
    return STACKS_DIR / f"Pulumi.{stack}.yaml"


def read_stack_file(path: Path) -> dict[str, Any]:
    """The ``config:`` map of a stack file; a YAML mistake is a one-line ConfigError naming file and line."""
    where = str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        place = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = " ".join(str(getattr(err, "problem", None) or err).split())
        raise config.ConfigError("", None, "", where, f"not valid YAML at {place}: {problem}") from None
    if data is None:
        return {}
    config_map = data.get("config") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(config_map, dict | None):
        raise config.ConfigError("", None, "", where, "expected a mapping with a `config:` mapping of key: value")
    return dict(config_map or {})


def stack_config(stack: str, overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Full-key config for ``stack`` as the CLI would pass it (plus a fake ``gcp:project`` if unset).

    A stack without a file gets the ``Pulumi.yaml`` defaults alone, as ``pulumi stack init`` would.
    Keys in the stack file are checked here, so a mistake names the file."""
    project = config.project_file()
    name = project["name"]
    values: dict[str, Any] = {"gcp:project": FAKE_PROJECT_ID}
    for key, spec in (project.get("config") or {}).items():
        full = key if ":" in key else f"{name}:{key}"
        if isinstance(spec, dict) and "default" in spec:
            values[full] = spec["default"]
        elif isinstance(spec, dict) and "value" in spec:
            values[full] = spec["value"]
    path = stack_file(stack)
    if path.exists():
        own = read_stack_file(path)
        config.check_keys(own, where=str(path.relative_to(REPO_ROOT)))
        values.update(own)
    for key, value in (overrides or {}).items():
        values[key if ":" in key else f"{name}:{key}"] = value
    return {k: _as_config_string(v) for k, v in values.items() if v is not None}


@dataclass
class Registered:
    """One resource as the engine saw it."""

    type: str
    name: str
    urn: str
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    parent: str
    provider: str
    dependencies: list[str]
    custom_timeouts: dict[str, str]
    delete_before_replace: bool
    protect: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    # The ``replace_on_changes`` option: input paths whose change makes the engine replace the resource.
    replace_on_changes: list[str] = field(default_factory=list)
    # Input property -> URNs its value depends on (what the engine records per property).
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    # ``inputs`` with secrets and credentials replaced by MASK: what may be written to disk.
    masked_inputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rendered:
    stack: str
    config: config.StackConfig
    resources: list[Registered]
    outputs: dict[str, Any] = field(default_factory=dict)
    # Every provider function the program called (getClientConfig, the GPU quota), with the provider it went to.
    calls: list[pulumi.runtime.MockCallArgs] = field(default_factory=list)
    # What the program logged to the engine as warnings or errors (``pulumi.log.warn``), in order.
    warnings: list[str] = field(default_factory=list)

    def of_type(self, type_: str) -> list[Registered]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str | None = None) -> Registered:
        found = [r for r in self.of_type(type_) if name is None or r.name == name]
        if len(found) != 1:
            raise LookupError(f"expected one {type_} named {name!r}, found {[r.name for r in found]}")
        return found[0]

    def by_urn(self, urn: str) -> Registered:
        return next(r for r in self.resources if r.urn == urn)

    def kubernetes(self) -> list[Registered]:
        return [
            r
            for r in self.resources
            if r.type.startswith("kubernetes:") and r.type != "pulumi:providers:kubernetes"
        ]

    def manifests(self, masked: bool = False) -> list[dict[str, Any]]:
        """The Kubernetes objects as manifests, in registration order (``masked``: without secrets)."""
        return [to_manifest(r, masked) for r in self.kubernetes()]


def to_manifest(resource: Registered, masked: bool = False) -> dict[str, Any]:
    """The SDK sends ``apiVersion`` and ``kind`` with every Kubernetes object: inputs are the manifest."""
    manifest = dict(resource.masked_inputs if masked else resource.inputs)
    if "apiVersion" not in manifest or "kind" not in manifest:
        raise ValueError(f"{resource.urn}: no apiVersion/kind in its inputs")
    return manifest


class _FakeCloud(pulumi.runtime.Mocks):
    """Echo inputs as outputs and fabricate what providers would compute."""

    def __init__(self) -> None:
        self.calls: list[pulumi.runtime.MockCallArgs] = []
        self.warnings: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        out = dict(args.inputs)
        name = out.get("name") or args.name
        typ = args.typ
        if typ == "gcp:filestore/instance:Instance":
            out["networks"] = [{**n, "ipAddresses": [FILESTORE_IP]} for n in out.get("networks", [])]
        elif typ == "gcp:container/cluster:Cluster":
            out.update(name=name, endpoint=CLUSTER_ENDPOINT, masterAuth={"clusterCaCertificate": CLUSTER_CA})
        elif typ == "gcp:compute/network:Network":
            out["name"] = name
        elif typ == "gcp:serviceaccount/account:Account":
            project = out.get("project", FAKE_PROJECT_ID)
            email = f"{out['accountId']}@{project}.iam.gserviceaccount.com"
            # ``name`` is the fully-qualified name that serviceaccount.IAMMember's serviceAccountId takes.
            name_ = f"projects/{project}/serviceAccounts/{email}"
            out.update(email=email, member=f"serviceAccount:{email}", name=name_)
        elif typ == "random:index/randomPassword:RandomPassword":
            out["result"] = "p" * int(out.get("length", 16))
        elif typ == "pulumi-python:dynamic:Resource" and "payload" in out:  # infra/binauthz.py's KMS signature
            out["signature"] = KMS_SIGNATURE
        elif typ == "docker-build:index:Image":
            out.update(digest=IMAGE_DIGEST, ref=f"{out['tags'][0]}@{IMAGE_DIGEST}")
        elif typ.startswith("kubernetes:") and "metadata" in out:
            out["metadata"] = {"name": name, **out["metadata"]}
        return f"{name}-id", out

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        self.calls.append(args)
        if args.token == "gcp:organizations/getClientConfig:getClientConfig":
            return {"accessToken": ACCESS_TOKEN, "project": FAKE_PROJECT_ID}
        if args.token == "gcp:cloudquota/getSQuotaInfo:getSQuotaInfo":
            GPU_QUOTA_CALLS.append(args)
            if (args.args.get("parent"), args.args.get("service")) != (f"projects/{FAKE_PROJECT_ID}",
                                                                        "compute.googleapis.com"):
                raise ValueError(f"Cloud Quotas API: no quota {args.args['quotaId']} here: {args.args}")
            value = GPU_QUOTAS.get(args.args["quotaId"], GPU_QUOTA_LIMIT)
            limits = value if isinstance(value, dict) else {} if value is None else {"": value}
            rows = [{"applicableLocations": [region or "global"], "details": [{"value": f"{v:g}"}],
                     "dimensions": {"region": region} if region else {}} for region, v in limits.items()]
            return {"quotaId": args.args["quotaId"], "dimensionsInfos": rows}
        if args.token == "gcp:organizations/getProject:getProject":
            return {"projectId": args.args.get("projectId"), "number": FAKE_PROJECT_NUMBER}
        if args.token == "gcp:kms/getKMSCryptoKeyVersion:getKMSCryptoKeyVersion":
            key = args.args["cryptoKey"]
            return {"cryptoKey": key, "name": f"{key}/cryptoKeyVersions/1", "version": 1,
                    "algorithm": "EC_SIGN_P256_SHA256",
                    "publicKeys": [{"pem": KMS_PUBLIC_KEY, "algorithm": "EC_SIGN_P256_SHA256"}]}
        if args.token == "gcp:organizations/getClientOpenIdUserInfo:getClientOpenIdUserInfo":
            return {"email": DEPLOYER_EMAIL}
        if args.token == "gcp:storage/getBucket:getBucket":
            name = args.args["name"]
            return {"name": name, "uniformBucketLevelAccess": name not in NON_UNIFORM_BUCKETS}
        return {}


class _EngineLog:
    """What the mock engine logs the program's messages to: each goes on to the root logger, as it would without
    this, and warnings and errors are also kept."""

    def __init__(self, into: list[str]) -> None:
        self.into = into
        self.root = logging.getLogger()

    def debug(self, message: str) -> None:
        self.root.debug(message)

    def info(self, message: str) -> None:
        self.root.info(message)

    def warning(self, message: str) -> None:
        self.into.append(message)
        self.root.warning(message)

    def error(self, message: str) -> None:
        self.into.append(message)
        self.root.error(message)


class _RecordingMonitor(mocks.MockMonitor):
    """The SDK's mock monitor, also keeping what a test wants to assert on: parent, provider,
    dependencies and options (the stock one keeps only the outputs)."""

    def __init__(self, fake: pulumi.runtime.Mocks) -> None:
        super().__init__(fake)
        self.registered: list[Registered] = []

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            inputs = _sync_await(_deserialize(request.object))
            timeouts = request.customTimeouts
            self.registered.append(
                Registered(
                    type=request.type,
                    name=request.name,
                    urn=response.urn,
                    id=response.id,
                    inputs=inputs,
                    outputs=self.resources[response.urn].state if response.urn in self.resources else {},
                    parent=request.parent,
                    provider=request.provider,
                    dependencies=list(request.dependencies),
                    custom_timeouts={
                        k: getattr(timeouts, k)
                        for k in ("create", "update", "delete")
                        if getattr(timeouts, k)
                    },
                    delete_before_replace=request.deleteBeforeReplace,
                    protect=request.protect,
                    ignore_changes=list(request.ignoreChanges),
                    replace_on_changes=list(request.replaceOnChanges),
                    property_dependencies={
                        k: list(v.urns) for k, v in request.propertyDependencies.items()
                    },
                )
            )
        return response


async def _deserialize(struct: Any) -> dict[str, Any]:
    return pulumi.runtime.rpc.deserialize_properties(struct)


def mask_secrets(value: Any, key: str = "") -> Any:
    """Secret-marked values, and strings under credential-like keys, replaced by MASK. Keys and
    structure stay (a Secret's ``stringData`` keeps its keys), so masked manifests still validate."""
    if isinstance(value, str) and value and (_CREDENTIAL_KEY.search(key) or key == _PICKLED_PROVIDER):
        return MASK
    if isinstance(value, dict):
        if value.get(pulumi.runtime.rpc._special_sig_key) == pulumi.runtime.rpc._special_secret_sig:
            return _mask_leaves(value.get("value"))
        return {k: mask_secrets(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v, key) for v in value]
    return value


def _mask_leaves(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _mask_leaves(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_leaves(v) for v in value]
    return MASK


def unwrap_secrets(value: Any) -> Any:
    """Secret markers -> plain values, so manifests look like what ``kubectl`` would receive (the offline
    policy runner reads outputs the same way)."""
    if isinstance(value, dict):
        if value.get(pulumi.runtime.rpc._special_sig_key) == pulumi.runtime.rpc._special_secret_sig:
            return unwrap_secrets(value["value"])
        return {k: unwrap_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap_secrets(v) for v in value]
    return value


def render(stack: str, overrides: Mapping[str, Any] | None = None) -> Rendered:
    """Validate ``stack``'s config and run the program under mocks; raises ``config.ConfigError``."""
    values = stack_config(stack, overrides)
    cfg = config.load(values, stack=stack)  # fails here, before any resource, on a bad value
    resolved: dict[str, Any] = {}

    def program() -> None:
        outputs = build(cfg)
        resolved.update(_sync_await(pulumi.Output.from_input(outputs).future()) or {})

    fake = _FakeCloud()
    resources = run_mocked(stack, values, program, fake)
    return Rendered(
        stack=stack, config=cfg, resources=resources, outputs=resolved, calls=fake.calls, warnings=fake.warnings
    )


# asyncio's words for a Future or Task whose exception nobody read (base_events / futures.py in CPython 3.11).
UNRETRIEVED = ("Future exception was never retrieved", "Task exception was never retrieved")


def _quiet_about_unretrieved(loop: Any, context: dict[str, Any]) -> None:
    """The mock loop's exception handler: a program error reaches run_mocked's caller, raised; the other Outputs
    that carried it are collected later, whenever the garbage collector runs, and asyncio would log each with its
    traceback from inside whatever code was running then. In a test process that was once an ``ast.parse`` of
    another test, and CPython 3.11 formats a traceback's carets with a nested ``ast.parse``: the outer one failed
    with "SystemError: AST constructor recursion depth mismatch" (its AST state is per interpreter; see
    python/cpython#106905). The error was raised already: those repeats are dropped, anything else is logged."""
    if context.get("message") in UNRETRIEVED:
        return
    loop.default_exception_handler(context)


def run_mocked(
    stack: str, values: Mapping[str, str], program: Callable[[], Any], fake: _FakeCloud | None = None
) -> list[Registered]:
    """Run ``program`` under the mock engine with ``values`` as the stack's config, wait for every
    resource registration, and return the resources. Exceptions from the program propagate."""
    fake = fake or _FakeCloud()
    monitor = _RecordingMonitor(fake)
    settings.ROOT.set(None)  # the runtime is global: start every run from a fresh root stack
    log: Any = _EngineLog(fake.warnings)  # the mock engine only calls debug, info, warning and error on it
    pulumi.runtime.set_mocks(fake, project=config.PROJECT, stack=stack, preview=False, logger=log, monitor=monitor)
    pulumi.runtime.set_all_config(dict(values))
    settings.SETTINGS.rpc_manager.clear()
    settings.SETTINGS.outputs.clear()
    _ensure_event_loop().set_exception_handler(_quiet_about_unretrieved)
    _sync_await(run_pulumi_func(program))
    for r in monitor.registered:
        r.masked_inputs = mask_secrets(r.inputs)
        r.inputs = unwrap_secrets(r.inputs)
    return monitor.registered


def _plain_numbers(value: Any) -> Any:
    """The wire carries every number as a float: 6379.0 back to 6379 for files people read."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _plain_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_numbers(v) for v in value]
    return value


def write(rendered: Rendered, out_dir: Path) -> list[Path]:
    """Write ``manifests/<kind>-[<namespace>-]<name>.yaml`` (one object each) and ``inventory.json``
    (every resource: type, name, URN, parent, dependencies, inputs) into ``out_dir``, secrets masked.

    Names and order do not depend on registration order (which varies run to run), so two renders
    diff cleanly; old manifests are removed first, so a deleted resource does not linger as a file.
    """
    manifests_dir = out_dir / "manifests"
    if manifests_dir.exists():
        for old in manifests_dir.glob("*.yaml"):
            old.unlink()
    manifests_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for manifest in rendered.manifests(masked=True):
        metadata = manifest.get("metadata", {})
        parts = [manifest["kind"], metadata.get("namespace", ""), metadata.get("name", "")]
        stem = "-".join(re.sub(r"[^a-z0-9.]+", "-", str(p).lower()) for p in parts if p)
        path = manifests_dir / f"{stem}.yaml"
        path.write_text(yaml.safe_dump(_plain_numbers(manifest), sort_keys=False))
        written.append(path)
    inventory = [
        {
            "type": r.type,
            "name": r.name,
            "urn": r.urn,
            "parent": r.parent,
            "dependencies": r.dependencies,
            "inputs": _plain_numbers(r.masked_inputs),
        }
        for r in sorted(rendered.resources, key=lambda r: r.urn)
    ]
    path = out_dir / "inventory.json"
    path.write_text(json.dumps({"stack": rendered.stack, "resources": inventory}, indent=2) + "\n")
    written.append(path)
    return written


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["runs={main: {}}", "parallelism=3"]`` -> config overrides (values read as YAML). A value that is not
    YAML (``%d/%m/%Y`` reads as a YAML directive, ``@x`` or ``*x`` as reserved or an alias) is the string it
    is, as ``pulumi config set`` stores it."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not key=value")
        try:
            overrides[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            overrides[key] = value
    return overrides


def main(argv: list[str] | None = None) -> int:
    """``python -m infra.render dev [key=value ...]``: the stack's Kubernetes manifests as YAML."""
    import sys

    parser = argparse.ArgumentParser(prog="python -m infra.render", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("stack", type=stack_name, help="a stack; without stacks/Pulumi.<stack>.yaml: defaults")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (YAML values)")
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.overrides)
    except ValueError as err:
        parser.error(str(err))
    try:
        rendered = render(args.stack, overrides)
    except config.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    yaml.safe_dump_all(rendered.manifests(), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
