"""The Redis queue built on its own: only the loader and the workers may reach it, through its Service at its URL,
its data on its own claim, and redis-server started from the Deployment's own rendered arguments."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pulumi_kubernetes as k8s
import pytest
import redis as redis_py

from infra import config, contract, render
from infra.redis import RedisArgs, RedisQueue
from tests.infra.components import DNS_LABEL, _selects, _strictly_valid, admitted_by_redis, build, in_cluster
from tests.infra.pod_security import pod_security_violations
from workload.runtime.redis_server import find_redis_server, free_port


def _redis(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    r = RedisQueue("redis", RedisArgs(cfg.redis_image), in_cluster(cfg, provider))
    return {"redis": r, "url": r.url}



def test_redis_admits_only_the_loader_and_the_workers() -> None:
    b = build(_redis)
    _strictly_valid(b)
    policy = b.one("kubernetes:networking.k8s.io/v1:NetworkPolicy").inputs
    assert policy["metadata"]["namespace"] == b.cfg.namespace
    spec = policy["spec"]
    deployment = b.one("kubernetes:apps/v1:Deployment").inputs
    assert _selects(spec["podSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert spec["policyTypes"] == ["Ingress"]
    for component in (contract.LOADER, contract.WORKER):
        assert admitted_by_redis(b, contract.labels(component))
    for labels in (
        contract.labels(contract.SHARE_PREP),
        contract.labels(contract.REDIS),
        {},
        {**contract.labels(contract.WORKER), contract.NAME_LABEL: "other-app"},
        {contract.COMPONENT_LABEL: contract.WORKER},
    ):
        assert not admitted_by_redis(b, labels), labels
    for rule in spec["ingress"]:
        assert rule["ports"] == [{"protocol": "TCP", "port": contract.REDIS_PORT}]


def test_redis_is_reachable_through_its_service_at_its_url() -> None:
    b = build(_redis)
    _strictly_valid(b)
    r = b.made["redis"]
    service = b.one("kubernetes:core/v1:Service").inputs
    deployment = b.one("kubernetes:apps/v1:Deployment").inputs
    pod_spec = deployment["spec"]["template"]["spec"]
    (c,) = pod_spec["containers"]
    assert service["metadata"]["name"] == r.service_name and service["spec"]["type"] == "ClusterIP"
    assert _selects({"matchLabels": service["spec"]["selector"]}, deployment["spec"]["template"]["metadata"]["labels"])
    assert _selects(deployment["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    # The app's other pods share its name label: a selector matching them would make the loader and the
    # workers Redis endpoints (the Service) or Deployment replicas.
    for component in (contract.LOADER, contract.WORKER, contract.SHARE_PREP):
        assert not _selects({"matchLabels": service["spec"]["selector"]}, contract.labels(component)), component
        assert not _selects(deployment["spec"]["selector"], contract.labels(component)), component
    (port,) = service["spec"]["ports"]
    (container_port,) = c["ports"]
    assert port["port"] == container_port["containerPort"] == contract.REDIS_PORT
    assert port["targetPort"] == container_port["name"]
    # The API server refuses a Service port name that is not a DNS label (pkg/apis/core/validation,
    # validateServicePort: ValidateDNS1123Label); the schema leaves it a plain string.
    assert DNS_LABEL.match(port["name"]), port
    assert b.resolved["url"] == (
        f"redis://{r.service_name}.{b.cfg.namespace}.svc.cluster.local:{contract.REDIS_PORT}/0"
    )
    assert "p" * 32 not in b.resolved["url"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["metadata"]["namespace"] == service["metadata"]["namespace"] == b.cfg.namespace
    probe = c["readinessProbe"]
    assert probe["exec"]["command"][:2] == ["sh", "-c"] and "redis-cli ping" in probe["exec"]["command"][2]
    assert "PONG" in probe["exec"]["command"][2] and probe["periodSeconds"] > 0
    assert c["livenessProbe"]["tcpSocket"] == {"port": contract.REDIS_PORT}
    assert c["livenessProbe"]["initialDelaySeconds"] >= probe["initialDelaySeconds"]
    auth = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert auth == {"REDISCLI_AUTH": {"name": r.secret_name, "key": r.password_key}}
    assert _mebibytes(c["resources"]["requests"]["memory"]) <= _mebibytes(c["resources"]["limits"]["memory"])
    assert not pod_security_violations(pod_spec, "restricted") and pod_spec["automountServiceAccountToken"] is False


def _mebibytes(quantity: str) -> int:
    return int(quantity[:-2]) * {"Mi": 1, "Gi": 1024}[quantity[-2:]]


def test_redis_keeps_its_data_on_its_own_claim_and_its_password_secret() -> None:
    b = build(_redis)
    r = b.made["redis"]
    claim = b.one("kubernetes:core/v1:PersistentVolumeClaim").inputs
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}  # binds on first consumer
    assert claim["spec"]["resources"]["requests"]["storage"].endswith("Gi")
    secret = b.one("kubernetes:core/v1:Secret")
    assert secret.masked_inputs["stringData"] == {r.password_key: render.MASK, "auth.conf": render.MASK}
    assert secret.inputs["metadata"]["name"] == r.secret_name and secret.inputs["type"] == "Opaque"
    password = b.one("random:index/randomPassword:RandomPassword").inputs
    assert password["length"] >= 32 and password["special"] is False  # unquoted in a config line
    pod_spec = b.one("kubernetes:apps/v1:Deployment").inputs["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    (c,) = pod_spec["containers"]
    kinds = {next(k for k in v if k != "name"): v for v in volumes.values()}
    assert kinds["persistentVolumeClaim"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    auth = kinds["secret"]["secret"]
    assert auth["secretName"] == r.secret_name
    mode = int(auth["defaultMode"])
    assert mode & 0o040 and not mode & 0o007  # readable through fsGroup, not by others
    assert pod_spec["securityContext"]["fsGroup"] == pod_spec["securityContext"]["runAsGroup"]
    (mount,) = [m for m in c["volumeMounts"] if volumes[m["name"]].get("secret")]
    assert mount["readOnly"] is True


def test_redis_started_from_its_rendered_arguments_requires_the_password_and_fsyncs(tmp_path: Path) -> None:
    """The Deployment's own args and the Secret's own auth.conf, with the mounts on real folders."""
    b = build(_redis)
    deployment = b.one("kubernetes:apps/v1:Deployment").inputs["spec"]["template"]["spec"]
    (c,) = deployment["containers"]
    secret = b.one("kubernetes:core/v1:Secret").inputs
    volumes = {v["name"]: v for v in deployment["volumes"]}
    folders: dict[str, Path] = {}
    for m in c["volumeMounts"]:
        folders[m["mountPath"]] = tmp_path / m["name"]
        folders[m["mountPath"]].mkdir()
        for item in volumes[m["name"]].get("secret", {}).get("items", []):
            (folders[m["mountPath"]] / item["path"]).write_text(secret["stringData"][item["key"]])
    port = free_port()
    args = []
    for arg in c["args"]:
        for at, folder in folders.items():
            arg = str(folder) + arg[len(at) :] if arg == at or arg.startswith(at + "/") else arg
        args.append(str(port) if arg == str(contract.REDIS_PORT) else arg)
    proc = subprocess.Popen([find_redis_server(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        password = secret["stringData"][b.made["redis"].password_key]
        client = redis_py.Redis(port=port, password=password, socket_timeout=5)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis_py.ConnectionError:
                assert proc.poll() is None, f"redis-server exited {proc.returncode} with args {args}"
                os.sched_yield()
                subprocess.run(["sleep", "0.05"], check=True)
        assert client.config_get("append*") == {
            **client.config_get("append*"),
            "appendonly": "yes",
            "appendfsync": "always",
        }
        assert client.config_get("dir")["dir"] == str(folders["/data"].resolve())
        with pytest.raises(redis_py.AuthenticationError):
            redis_py.Redis(port=port, socket_timeout=5).ping()
        # The readiness probe, as the kubelet runs it in the container: its own command, with the container's
        # env (the password from the Secret it names). It passes on this Redis; without the password or with
        # Redis gone it fails (the pod leaves the Service's endpoints).
        probe = c["readinessProbe"]["exec"]["command"]
        container_env = {}
        for var in c["env"]:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == b.made["redis"].secret_name
            container_env[var["name"]] = secret["stringData"][ref["key"]]
        assert probe_passes(probe, port, tmp_path, container_env)
        assert not probe_passes(probe, port, tmp_path, {})
    finally:
        proc.kill()
        proc.wait()
    assert not probe_passes(probe, port, tmp_path, container_env)


def probe_passes(command: list[str], port: int, tmp_path: Path, env: dict[str, str]) -> bool:
    """Run an exec probe's command as the kubelet would, in the Redis image's shell with redis-cli on PATH. The
    Redis under test listens on a free port rather than the pod's 6379: the `redis-cli` found first on PATH is
    the real one (the binary next to redis-server) told that port."""
    bin_dir = tmp_path / "probe-bin"
    bin_dir.mkdir(exist_ok=True)
    cli = Path(find_redis_server()).with_name("redis-cli")
    cli = cli if cli.is_file() else Path(shutil.which("redis-cli") or "redis-cli")
    (bin_dir / "redis-cli").write_text(f'#!/bin/sh\nexec {shlex.quote(str(cli))} -p {port} "$@"\n')
    (bin_dir / "redis-cli").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(command, env={"PATH": path, **env}, timeout=30, capture_output=True).returncode == 0
