"""Issue 10 under mocks: datasets from the user's bucket through Workload Identity, runs declared in the
stack and mounted as the loader's runs file, results to ``outputUri``, and a change that re-trains."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from infra import contract, render
from infra.render import Registered, Rendered

Render = Callable[..., Rendered]

JOB = "kubernetes:batch/v1:Job"
KSA = "kubernetes:core/v1:ServiceAccount"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
ACCOUNT = "gcp:serviceaccount/account:Account"
SA_BINDING = "gcp:serviceaccount/iAMMember:IAMMember"
BUCKET_GRANT = "gcp:storage/bucketIAMMember:BucketIAMMember"
PROJECT_GRANT = "gcp:projects/iAMMember:IAMMember"
DATA = {"datasetUri": "gs://acme-fraud/exports/v1/"}
OUTPUT = {"outputUri": "gs://acme-results/spot-trainer/dev"}
# pulumi-kubernetes replaces a batch/v1 Job when one of these changes (provider/pkg/provider/diff.go).
JOB_FORCE_NEW = (("spec", "completions"), ("spec", "parallelism"), ("spec", "selector"), ("spec", "template"))


def pod(job: Registered) -> dict[str, Any]:
    return job.inputs["spec"]["template"]["spec"]


def container(job: Registered) -> dict[str, Any]:
    (only,) = pod(job)["containers"]
    return only


def env(job: Registered) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container(job)["env"]}


def workload_accounts(r: Rendered) -> dict[str, Registered]:
    """Google service accounts other than the nodes' own, by component."""
    return {a.inputs["accountId"].rsplit("-", 1)[-1]: a for a in r.of_type(ACCOUNT) if a.name != "cluster-nodes"}


@pytest.mark.parametrize("stack", render.stack_names())
def test_without_dataset_uri_the_loader_simulates_and_no_identity_is_declared(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    loader = r.one(JOB, "loader")
    assert container(loader)["args"] == [
        "seed", "--runs-file", contract.RUNS_FILE, "--dataset", "fraud", "--preset", r.config.jobs.dataset_preset,
    ]  # fmt: skip
    assert not r.of_type(KSA) and not r.of_type(SA_BINDING) and not r.of_type(BUCKET_GRANT)
    assert not workload_accounts(r)
    for job in r.of_type(JOB):
        assert "serviceAccountName" not in pod(job)  # the namespace's default account: no Google roles
        assert contract.ENV_OUTPUT_URI not in env(job)
    assert r.outputs["serviceAccounts"] == {}


def test_dataset_uri_is_read_by_the_loader_through_workload_identity(rendered: Render) -> None:
    r = rendered("dev", **DATA)
    loader = r.one(JOB, "loader")
    assert container(loader)["args"] == [
        "seed", "--runs-file", contract.RUNS_FILE, "--dataset", "v1", "--datasets", "gs://acme-fraud/exports/v1",
    ]  # fmt: skip
    (account,) = workload_accounts(r).values()
    email = account.outputs["email"]
    assert 6 <= len(account.inputs["accountId"]) <= 30

    # The pod runs as a KSA that names the GSA, and the GSA trusts exactly that KSA.
    (ksa,) = r.of_type(KSA)
    assert pod(loader)["serviceAccountName"] == ksa.inputs["metadata"]["name"]
    assert ksa.inputs["metadata"]["namespace"] == r.config.namespace
    assert ksa.inputs["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": email}
    # Workload Identity exchanges the pod's KSA token; pods without a Google identity keep it unmounted.
    assert pod(loader)["automountServiceAccountToken"] is True
    assert pod(r.one(JOB, "training"))["automountServiceAccountToken"] is False
    assert not r.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")  # the KSA opens nothing
    (binding,) = r.of_type(SA_BINDING)
    assert binding.inputs["serviceAccountId"] == account.outputs["name"]
    assert binding.inputs["role"] == "roles/iam.workloadIdentityUser"
    assert binding.inputs["member"] == (
        f"serviceAccount:{r.config.project_id}.svc.id.goog[{r.config.namespace}/{ksa.inputs['metadata']['name']}]"
    )

    # Object read on exactly the configured bucket, under its prefix (reads and lists); nothing at project level;
    # no key anywhere.
    (grant,) = r.of_type(BUCKET_GRANT)
    assert grant.inputs["bucket"] == "acme-fraud"
    assert grant.inputs["role"] == "roles/storage.objectViewer"
    assert grant.inputs["member"] == f"serviceAccount:{email}"
    assert grant.inputs["condition"]["expression"] == (
        'resource.name.startsWith("projects/_/buckets/acme-fraud/objects/exports/v1/") || '
        'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("exports/v1/")')
    assert {g.inputs["member"] for g in r.of_type(PROJECT_GRANT)} == {r.one(ACCOUNT, "cluster-nodes").outputs["member"]}
    assert not [res for res in r.resources if res.type.startswith("gcp:serviceaccount/key")]
    # The loader starts only once its identity works; the training pods get none of it.
    assert {ksa.urn, binding.urn, grant.urn} <= set(loader.dependencies)
    assert "serviceAccountName" not in pod(r.one(JOB, "training"))
    assert r.outputs["serviceAccounts"] == {"loader": email}
    assert r.outputs["datasetUri"] == "gs://acme-fraud/exports/v1"
    apis = {s.inputs["service"] for s in r.of_type("gcp:projects/service:Service")}
    assert {"storage.googleapis.com", "iamcredentials.googleapis.com"} <= apis
    assert "iamcredentials.googleapis.com" not in {
        s.inputs["service"] for s in rendered("dev").of_type("gcp:projects/service:Service")
    }


def test_output_uri_gives_the_workers_write_access_to_the_prefix_only(rendered: Render) -> None:
    r = rendered("dev", **OUTPUT)
    training, loader = r.one(JOB, "training"), r.one(JOB, "loader")
    assert env(training)[contract.ENV_OUTPUT_URI] == "gs://acme-results/spot-trainer/dev"
    assert contract.ENV_OUTPUT_URI not in env(loader)
    assert "serviceAccountName" not in pod(loader)  # no datasetUri: the loader has no identity

    (account,) = workload_accounts(r).values()
    (ksa,) = r.of_type(KSA)
    assert pod(training)["serviceAccountName"] == ksa.inputs["metadata"]["name"]
    assert ksa.inputs["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == account.outputs["email"]
    (grant,) = r.of_type(BUCKET_GRANT)
    assert grant.inputs["bucket"] == "acme-results" and grant.inputs["member"] == account.outputs["member"]
    assert grant.inputs["role"] == "roles/storage.objectUser"
    assert grant.inputs["condition"]["expression"] == (
        'resource.name.startsWith("projects/_/buckets/acme-results/objects/spot-trainer/dev/")'
    )
    assert grant.urn in training.dependencies


def test_loader_and_workers_get_separate_identities(rendered: Render) -> None:
    r = rendered("dev", **DATA, **OUTPUT)
    accounts = workload_accounts(r)
    assert set(accounts) == {"loader", "worker"}
    by_member = {g.inputs["member"]: (g.inputs["bucket"], g.inputs["role"]) for g in r.of_type(BUCKET_GRANT)}
    assert by_member == {
        accounts["loader"].outputs["member"]: ("acme-fraud", "roles/storage.objectViewer"),
        accounts["worker"].outputs["member"]: ("acme-results", "roles/storage.objectUser"),
    }
    names = {name: pod(r.one(JOB, name))["serviceAccountName"] for name in ("loader", "training")}
    assert names == {"loader": "spot-trainer-loader", "training": "spot-trainer-worker"}
    # The share-preparation step (root, its own namespace) gets no Google identity.
    assert "serviceAccountName" not in pod(r.one(JOB, "share-prep"))


def test_the_loader_reads_the_stack_runs_from_a_mounted_runs_file(rendered: Render) -> None:
    runs = {"main": {}, "wide": {"hidden": [128, 64]}, "lr3": {"lr": 0.003}}
    r = rendered("dev", runs=runs)
    (config_map,) = r.of_type(CONFIG_MAP)
    assert json.loads(config_map.inputs["data"][contract.RUNS_KEY]) == runs
    loader = r.one(JOB, "loader")
    volumes = {v["name"]: v for v in pod(loader)["volumes"]}
    mounts = {m["mountPath"]: m for m in container(loader)["volumeMounts"]}
    mount = mounts[contract.RUNS_DIR]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["configMap"]["name"] == config_map.inputs["metadata"]["name"]
    assert contract.RUNS_FILE == f"{mount['mountPath']}/{contract.RUNS_KEY}"
    assert config_map.urn in loader.dependencies and config_map.delete_before_replace
    assert config_map.inputs["immutable"] is True
    # Workers get the runs from the share (seed writes them there), not from this file.
    assert contract.RUNS_DIR not in {m["mountPath"] for m in container(r.one(JOB, "training"))["volumeMounts"]}


def _replaced(before: Registered, after: Registered) -> list[str]:
    """The force-new fields that differ: what makes the provider replace a Job."""

    def get(job: Registered, path: tuple[str, ...]) -> Any:
        value: Any = job.inputs
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return [".".join(p) for p in JOB_FORCE_NEW if get(before, p) != get(after, p)]


@pytest.mark.parametrize(
    "change",
    [
        {"runs": {"main": {}, "v2": {"lr": 0.003}}},
        {"runs": {"main": {"epochs": 2}}},
        DATA,
        {"datasetPreset": "small"},
        {"datasetName": "fraud-2024"},
    ],
    ids=["new-run", "changed-run", "dataset-uri", "preset", "dataset-name"],
)
def test_a_change_to_what_the_loader_seeds_replaces_the_training_job(
    change: dict[str, Any], rendered: Render
) -> None:
    before, after = rendered("dev", runs={"main": {}}), rendered("dev", **{"runs": {"main": {}}, **change})
    for name in ("loader", "training"):
        assert _replaced(before.one(JOB, name), after.one(JOB, name)) == ["spec.template"], name
    annotation = after.one(JOB, "training").inputs["spec"]["template"]["metadata"]["annotations"]
    assert annotation == after.one(JOB, "loader").inputs["spec"]["template"]["metadata"]["annotations"]


def test_a_new_image_replaces_both_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    before = render.render("dev")
    monkeypatch.setattr(render, "IMAGE_DIGEST", "sha256:" + "cd" * 32)
    after = render.render("dev")
    for name in ("loader", "training"):
        old, new = before.one(JOB, name), after.one(JOB, name)
        assert _replaced(old, new) == ["spec.template"]
        key = contract.SEED_INPUTS_ANNOTATION
        assert old.inputs["spec"]["template"]["metadata"]["annotations"][key] != (
            new.inputs["spec"]["template"]["metadata"]["annotations"][key]
        )


def test_the_reload_command_replaces_both_jobs(rendered: Render) -> None:
    """New days in the bucket change no config: the stack output says how to load and train them."""
    r = rendered("dev", **DATA)
    command = r.outputs["commands"]["reload"]
    assert command == f"pulumi up --replace '{r.one(JOB, 'loader').urn}' --replace '{r.one(JOB, 'training').urn}'"


def test_an_export_by_hand_runs_as_the_workers_account(rendered: Render) -> None:
    """Only the workers' account may write under outputUri: the stack's export commands use it."""
    r = rendered("dev", runs={"main": {}, "wide": {"hidden": [128, 64]}}, **OUTPUT)
    commands = r.outputs["commands"]["export"]
    assert set(commands) == {"main", "wide"}
    pod, _, raw = commands["wide"].partition(" --overrides='")
    assert pod == f"kubectl -n spot-trainer run export --rm -i --restart=Never --image={r.outputs['imageRef']}"
    overrides = json.loads(raw.rstrip("'"))
    (c,) = overrides["spec"]["containers"]
    assert c["name"] == "export"
    assert c["args"] == ["export", "--run", "wide", "--to", "gs://acme-results/spot-trainer/dev"]
    assert overrides["spec"]["serviceAccountName"] == "spot-trainer-worker"
    assert rendered("dev", **DATA).outputs["commands"]["export"] == {}  # no outputUri: nobody may write


def test_what_does_not_change_the_seeded_work_leaves_the_jobs_alone(rendered: Render) -> None:
    """Same runs written in another order, or a longer wait for training: no new Job, no new training."""
    base = rendered("dev", runs={"main": {}, "v2": {"lr": 0.003}})
    for change in ({"runs": {"v2": {"lr": 0.003}, "main": {}}}, {"runs": {"main": {}, "v2": {"lr": 0.003}},
                                                                 "jobTimeoutMinutes": 600}):
        other = rendered("dev", **change)
        for name in ("loader", "training"):
            assert _replaced(base.one(JOB, name), other.one(JOB, name)) == [], (change, name)


def test_identities_go_through_the_stack_providers(rendered: Render) -> None:
    """Google resources wait for the project APIs (the gcp provider); Kubernetes ones use the cluster's."""
    r = rendered("dev", **DATA, **OUTPUT)
    gcp, k8s = r.one("pulumi:providers:gcp", "gcp"), r.one("pulumi:providers:kubernetes")
    for res in [*r.of_type(ACCOUNT), *r.of_type(SA_BINDING), *r.of_type(BUCKET_GRANT)]:
        assert res.provider == f"{gcp.urn}::{gcp.id}", res.urn
    for res in [*r.of_type(KSA), *r.of_type(CONFIG_MAP)]:
        assert res.provider == f"{k8s.urn}::{k8s.id}", res.urn


def test_standard_clusters_run_the_gke_metadata_server_where_the_pods_run(rendered: Render) -> None:
    """Autopilot always has Workload Identity; a Standard cluster needs its pool and the GKE metadata
    server on every node pool the loader and the workers can land on."""
    r = rendered("dev", clusterMode="standard", gpuCapacity="nodeSelector", **DATA, **OUTPUT)
    cluster = r.one("gcp:container/cluster:Cluster").inputs
    assert cluster["workloadIdentityConfig"] == {"workloadPool": f"{r.config.project_id}.svc.id.goog"}
    pools = r.of_type("gcp:container/nodePool:NodePool")
    assert pools and all(p.inputs["nodeConfig"]["workloadMetadataConfig"] == {"mode": "GKE_METADATA"} for p in pools)
    (binding, _) = sorted(r.of_type(SA_BINDING), key=lambda b: b.name)
    assert binding.inputs["member"].startswith(f"serviceAccount:{cluster['workloadIdentityConfig']['workloadPool']}[")


@pytest.mark.parametrize("stack", render.stack_names())
def test_workload_identity_bindings_wait_for_the_cluster_pool(stack: str, rendered: Render) -> None:
    """The member ``<project>.svc.id.goog[ns/ksa]`` exists only once the cluster has made the pool: a
    binding that depends on the Google account alone is tried a minute into a first `pulumi up` and
    fails ("Identity Pool does not exist"). Both bindings take the pool from the cluster's output."""
    r = rendered(stack, **DATA, **OUTPUT)
    cluster = r.one("gcp:container/cluster:Cluster")
    bindings = r.of_type(SA_BINDING)
    assert len(bindings) == 2
    for binding in bindings:
        assert cluster.urn in binding.property_dependencies.get("member", []), binding.name
        assert cluster.urn in binding.dependencies
        pool = cluster.inputs["workloadIdentityConfig"]["workloadPool"]
        assert binding.inputs["member"].startswith(f"serviceAccount:{pool}[{r.config.namespace}/")
