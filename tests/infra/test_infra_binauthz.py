"""Issue 36: Binary Authorization admits only this stack's signed images (infra/binauthz.py).

The payload's bytes, the signature's verification with a real P-256 key (Cloud KMS itself cannot run here:
its asymmetricSign signs the SHA-256 digest the request carries, as ``Prehashed`` does below), and, under the
mock engine, that every pod-making object waits for its image's attestation and the project's policy."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import dill
import pytest
import requests
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed
from pulumi.dynamic.dynamic import serialize_provider

from infra import binauthz, render
from infra.render import Registered, Rendered

Render = Callable[..., Rendered]
DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = f"us-central1-docker.pkg.dev/p/spot-trainer-prod/trainer@{DIGEST}"
OCCURRENCE = "gcp:containeranalysis/occurence:Occurence"
WORKLOADS = ("kubernetes:batch/v1:Job", "kubernetes:batch/v1:CronJob", "kubernetes:apps/v1:Deployment")


def test_the_signature_payload_is_gclouds_bytes() -> None:
    """gcloud's MakeSignaturePayload: sorted keys, two-space indent, ': ' separators, a final newline."""
    assert binauthz.signature_payload(IMAGE) == (
        '{\n'
        '  "critical": {\n'
        '    "identity": {\n'
        '      "docker-reference": "us-central1-docker.pkg.dev/p/spot-trainer-prod/trainer"\n'
        '    },\n'
        '    "image": {\n'
        f'      "docker-manifest-digest": "{DIGEST}"\n'
        '    },\n'
        '    "type": "Google cloud binauthz container signature"\n'
        '  }\n'
        '}\n'
    ).encode()
    assert binauthz.resource_uri(IMAGE) == f"https://{IMAGE}"
    for bad in ("redis:7.4", "https://gcr.io/a/b@sha256:00", "gcr.io/a/b@md5:00"):
        with pytest.raises(ValueError, match="only a digest can be attested"):
            binauthz.signature_payload(bad)


def test_a_kms_signature_of_the_payload_verifies_as_binary_authorization_checks_it() -> None:
    """The request carries the payload's SHA-256; a P-256 key's signature of that digest (what KMS returns) verifies
    against the payload with the public key, ECDSA/SHA-256 (the attestor's algorithm); another image's does not."""
    key = ec.generate_private_key(ec.SECP256R1())
    payload = binauthz.signature_payload(IMAGE)
    digest = base64.b64decode(binauthz.sign_request(payload)["digest"]["sha256"])
    signature = key.sign(digest, ec.ECDSA(Prehashed(hashes.SHA256())))  # Cloud KMS asymmetricSign's part
    key.public_key().verify(signature, payload, ec.ECDSA(hashes.SHA256()))  # Binary Authorization's part
    other = binauthz.signature_payload(IMAGE.replace("0123", "4567"))
    with pytest.raises(InvalidSignature):
        key.public_key().verify(signature, other, ec.ECDSA(hashes.SHA256()))
    assert digest == hashlib.sha256(payload).digest()


def test_the_signer_unpickles_where_the_program_cannot_be_imported(tmp_path: Any) -> None:
    """Pulumi stores the dynamic provider pickled (by value: pulumi/pulumi#7755) and its host unpickles it without
    the program on sys.path: a fresh interpreter outside the repository, ``-I`` (no cwd, no PYTHONPATH), loads it
    and builds the same KMS request; a signer that called a module function of ``infra`` would fail here."""
    pickled = serialize_provider(binauthz.KmsSignature.provider())
    script = ("import base64, dill, sys; signer = dill.loads(base64.b64decode(sys.stdin.read())); "
              "print(signer.request(b'payload')['digest']['sha256'])")
    # Under mutation testing the pickled signer carries mutmut's trampolines: a mutant's name in the environment
    # selects that mutant in the fresh interpreter too, but its call-recording run ("stats") would look for
    # mutmut's configuration in the interpreter's cwd, and what a child records is never read back anyway.
    env = {k: v for k, v in os.environ.items() if (k, v) != ("MUTANT_UNDER_TEST", "stats")}
    done = subprocess.run([sys.executable, "-I", "-c", script], input=pickled, capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == binauthz.sign_request(b"payload")["digest"]["sha256"]


def _images(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k in ("containers", "initContainers"):
                yield from (c["image"] for c in v)
            else:
                yield from _images(v)
    elif isinstance(value, list):
        for v in value:
            yield from _images(v)


def _signature_of(r: Rendered, occurrence: Registered) -> Registered:
    (urn,) = [u for u in occurrence.dependencies if "dynamic:Resource" in u]
    return r.by_urn(urn)


def test_prod_attests_every_image_it_runs_before_any_pod_runs_it(rendered: Render) -> None:
    """Each image a Job, CronJob or Deployment names has an occurrence on its https digest URL, whose payload is
    that image's and whose signature comes from the stack's key; the object depends on that occurrence and on
    the policy (so no pod is created before its attestation exists)."""
    r = rendered("prod", datasetUri="gs://acme-fraud/exports", outputUri="gs://acme-results/runs/v1",
                 schedule="0 3 * * *")
    occurrences = {o.inputs["resourceUri"]: o for o in r.of_type(OCCURRENCE)}
    policy = r.one("gcp:binaryauthorization/policy:Policy")
    attestor = r.one("gcp:binaryauthorization/attestor:Attestor")
    (key_id,) = [k["id"] for k in attestor.inputs["attestationAuthorityNote"]["publicKeys"]]
    workloads = [w for w in r.resources if w.type in WORKLOADS]
    assert {w.type for w in workloads} == set(WORKLOADS)
    for workload in workloads:
        for image in _images(workload.inputs):
            occurrence = occurrences[binauthz.resource_uri(image)]
            assert occurrence.urn in workload.dependencies and policy.urn in workload.dependencies, workload.urn
            attestation = occurrence.inputs["attestation"]
            assert base64.b64decode(attestation["serializedPayload"]) == binauthz.signature_payload(image)
            (signature,) = attestation["signatures"]
            assert signature == {"publicKeyId": key_id, "signature": render.KMS_SIGNATURE}
            signer = _signature_of(r, occurrence)
            assert signer.inputs["payload"] == attestation["serializedPayload"]
            assert key_id == binauthz.public_key_id(signer.inputs["key_version"])
    assert len(occurrences) == 2  # the training image and Redis through the stack's Docker Hub proxy


def test_the_projects_policy_denies_all_but_this_clusters_attested_images(rendered: Render) -> None:
    r = rendered("prod")
    policy = r.one("gcp:binaryauthorization/policy:Policy")
    attestor = r.one("gcp:binaryauthorization/attestor:Attestor")
    cluster = r.one("gcp:container/cluster:Cluster")
    assert policy.inputs["globalPolicyEvaluationMode"] == "ENABLE"  # GKE's system images
    assert policy.inputs["defaultAdmissionRule"] == {"evaluationMode": "ALWAYS_DENY",
                                                     "enforcementMode": "ENFORCED_BLOCK_AND_AUDIT_LOG"}
    (rule,) = policy.inputs["clusterAdmissionRules"]
    assert rule == {"cluster": f"us-central1.{cluster.outputs['name']}", "evaluationMode": "REQUIRE_ATTESTATION",
                    "enforcementMode": "ENFORCED_BLOCK_AND_AUDIT_LOG", "requireAttestationsBies": [attestor.id]}
    assert "admissionWhitelistPatterns" not in policy.inputs  # Redis is attested, not allowlisted
    assert policy.protect and r.one("gcp:kms/cryptoKey:CryptoKey", "binauthz-attestor").protect
    key = r.one("gcp:kms/cryptoKey:CryptoKey", "binauthz-attestor")
    assert key.inputs["purpose"] == "ASYMMETRIC_SIGN"
    assert key.inputs["versionTemplate"]["algorithm"] == "EC_SIGN_P256_SHA256"
    note = r.one("gcp:containeranalysis/note:Note")
    assert attestor.inputs["attestationAuthorityNote"]["noteReference"] == note.inputs["name"]
    (public_key,) = attestor.inputs["attestationAuthorityNote"]["publicKeys"]
    assert public_key["pkixPublicKey"] == {"publicKeyPem": render.KMS_PUBLIC_KEY,
                                           "signatureAlgorithm": "ECDSA_P256_SHA256"}
    apis = {s.inputs["service"] for s in r.of_type("gcp:projects/service:Service")}
    assert {"binaryauthorization.googleapis.com", "containeranalysis.googleapis.com",
            "cloudkms.googleapis.com"} <= apis


def test_the_deployer_may_sign_with_the_stacks_key_and_attach_to_its_note_only(rendered: Render) -> None:
    r = rendered("prod")
    member = f"serviceAccount:{render.DEPLOYER_EMAIL}"
    signs = r.one("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember", "binauthz-deployer-signs")
    key = r.one("gcp:kms/cryptoKey:CryptoKey", "binauthz-attestor")
    assert (signs.inputs["role"], signs.inputs["member"]) == ("roles/cloudkms.signerVerifier", member)
    assert signs.property_dependencies["cryptoKeyId"] == [key.urn]
    attaches = r.one("gcp:containeranalysis/noteIamMember:NoteIamMember", "binauthz-deployer-attaches")
    note = r.one("gcp:containeranalysis/note:Note")
    assert (attaches.inputs["role"], attaches.inputs["member"]) == ("roles/containeranalysis.notes.attacher", member)
    assert attaches.property_dependencies["note"] == [note.urn]
    for occurrence in r.of_type(OCCURRENCE):  # signing waits for both grants
        assert {signs.urn, attaches.urn} <= set(_signature_of(r, occurrence).dependencies)
    assert binauthz.member_of("me@example.com") == "user:me@example.com"


def test_a_stack_without_binary_authorization_declares_none_of_it(rendered: Render) -> None:
    r = rendered("dev")
    assert not [x for x in r.resources if "binaryauthorization" in x.type or "containeranalysis" in x.type
                or x.type == "pulumi-python:dynamic:Resource"]


def test_a_docker_reference_with_two_ats_or_beyond_ascii_is_written_as_gcloud_would() -> None:
    """Only the first '@' ends the name (a reference with two is refused, not read from its last), and the payload
    escapes what is not ASCII as gcloud's json.dumps(ensure_ascii=True) does."""
    with pytest.raises(ValueError, match="only a digest can be attested"):
        binauthz.signature_payload(f"gcr.io/a@b@{DIGEST}")
    payload = binauthz.signature_payload(f"gcr.io/caf\u00e9@{DIGEST}")
    assert b'"docker-reference": "gcr.io/caf\\u00e9"' in payload and payload.isascii()


SCOPE = "https://www.googleapis.com/auth/cloud-platform"
PROVIDER = "urn:pulumi:prod::spot-trainer::pulumi:pulumi:Stack$pulumi:providers:gcp::gcp::"


def test_every_part_of_it_is_the_components_own_in_the_stacks_project_through_the_stacks_provider(
        rendered: Render) -> None:
    """The key ring, key, note, attestor, policy, grants, signatures and occurrences are children of the
    BinaryAuthorization component (so the stack's gcp provider and its protection reach them), each names the
    stack's project and its stack-scoped name, and the two lookups it makes go to the stack's provider too."""
    r = rendered("prod")
    (component,) = [x for x in r.resources if x.name == "binauthz"]
    assert component.type == "spot-trainer:gcp:BinaryAuthorization"
    parts = [x for x in r.resources if x.parent == component.urn]
    assert sorted((x.type.rsplit(":", 1)[-1], x.name) for x in parts) == sorted([
        ("KeyRing", "binauthz-attestor"), ("CryptoKey", "binauthz-attestor"), ("Note", "binauthz-attestor"),
        ("Attestor", "binauthz-attestor"), ("Policy", "binauthz-policy"),
        ("CryptoKeyIAMMember", "binauthz-deployer-signs"), ("NoteIamMember", "binauthz-deployer-attaches"),
        ("Resource", "binauthz-trainer-signature"), ("Resource", "binauthz-redis-signature"),
        ("Occurence", "binauthz-trainer"), ("Occurence", "binauthz-redis")])
    project = r.config.site.project_id
    for part in parts:
        if part.type != "pulumi-python:dynamic:Resource":
            assert part.provider.startswith(PROVIDER), part.urn
        if part.type.rsplit(":", 1)[-1] not in ("CryptoKey", "CryptoKeyIAMMember", "Resource"):
            assert part.inputs["project"] == project, part.urn
    named = {x.type.rsplit(":", 1)[-1]: x.inputs for x in parts}
    assert named["KeyRing"]["name"] == "spot-trainer-prod-binauthz"
    assert (named["CryptoKey"]["name"], named["CryptoKey"]["labels"]) == (
        "attestor", {"app": "spot-trainer", "env": "prod", "team": "ml-platform"})
    assert named["Note"]["name"] == "spot-trainer-prod-attestor"
    assert named["Note"]["attestationAuthority"] == {
        "hint": {"humanReadableName": "spot-trainer prod: built and pushed by pulumi up"}}
    assert named["Attestor"]["name"] == "spot-trainer-prod"
    assert named["Policy"]["description"] == "spot-trainer prod: only images its attestor signed"
    lookups = {c.token.rsplit(":", 1)[-1]: c.provider for c in r.calls}
    for lookup in ("getKMSCryptoKeyVersion", "getClientOpenIdUserInfo"):
        assert lookups[lookup].startswith(PROVIDER), lookup


class _Kms(http.server.BaseHTTPRequestHandler):
    """Cloud KMS's asymmetricSign and an STS token exchange, as their REST references define them, on a local port:
    Cloud KMS itself cannot run here, and its reply is a real P-256 signature of the digest the request carries.
    The token endpoint stands where workload identity federation's STS is for a CI deployer (an external_account
    credential file, which names its token URL)."""

    key = ec.generate_private_key(ec.SECP256R1())
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/token" and urllib.parse.parse_qs(body.decode()).get("scope") != [SCOPE]:
            self._reply(400, {"error": "invalid_scope", "error_description": "a scope is required"})
        elif self.path == "/token":
            self._reply(200, {"access_token": "t0ken", "issued_token_type":
                              "urn:ietf:params:oauth:token-type:access_token", "token_type": "Bearer",
                              "expires_in": 3600})
        elif self.headers.get("Authorization") != "Bearer t0ken":
            self._reply(401, {"error": {"code": 401, "message": "no credentials"}})
        elif self.path.endswith("/cryptoKeyVersions/9:asymmetricSign"):  # a Cloud KMS that does not answer
            time.sleep(3)
            self._reply(200, {"signature": "dG9vIGxhdGU="})
        elif self.path.endswith("/cryptoKeyVersions/1:asymmetricSign"):
            request = json.loads(body)
            type(self).bodies.append(request)
            digest = base64.b64decode(request["digest"]["sha256"])
            signature = self.key.sign(digest, ec.ECDSA(Prehashed(hashes.SHA256())))
            self._reply(200, {"signature": base64.b64encode(signature).decode(), "name": self.path})
        else:
            self._reply(403, {"error": {"code": 403, "message": "Permission 'cloudkms.cryptoKeyVersions.useToSign' "
                                        "denied"}})

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def kms(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A local Cloud KMS (``_Kms``) and application default credentials that reach it: the URL to sign at."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Kms)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    (tmp_path / "oidc").write_text("a-ci-oidc-token")
    (tmp_path / "adc.json").write_text(json.dumps({
        "type": "external_account", "audience": "//iam.googleapis.com/locations/global/workloadIdentityPools/ci/"
        "providers/github", "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": f"{url}/token", "credential_source": {"file": str(tmp_path / "oidc")}}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "adc.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    _Kms.bodies.clear()
    try:
        yield f"{url}/v1/"
    finally:
        server.shutdown()
        server.server_close()


def test_pulumi_up_signs_the_payload_with_the_key_version_and_a_new_payload_or_key_is_a_new_signature(
        kms: str) -> None:
    """The dynamic provider's create: the payload's digest sent to asymmetricSign on the stack's key version with
    the deployer's credentials; the ID is the payload's SHA-256, the signature verifies against the payload; a
    refusal is an error naming the key version and Cloud KMS's reply. Its diff replaces on a new payload or key."""
    signer = binauthz.KmsSignature.provider()
    signer.api = kms  # type: ignore[attr-defined]
    payload = binauthz.signature_payload(IMAGE)
    version = "projects/p/locations/us-central1/keyRings/r/cryptoKeys/attestor/cryptoKeyVersions/1"
    props = {"payload": base64.b64encode(payload).decode(), "key_version": version, "signature": None}
    made = signer.create(props)
    assert made.id == hashlib.sha256(payload).hexdigest()
    assert made.outs == {**props, "signature": made.outs["signature"]}
    _Kms.key.public_key().verify(base64.b64decode(made.outs["signature"]), payload, ec.ECDSA(hashes.SHA256()))
    assert _Kms.bodies == [binauthz.sign_request(payload)]
    other = version.replace("cryptoKeyVersions/1", "cryptoKeyVersions/2")
    with pytest.raises(RuntimeError, match=rf"^Cloud KMS asymmetricSign with {re.escape(other)} failed: 403 .*"
                       r"useToSign' denied"):
        signer.create({**props, "key_version": other})
    signer.timeout_s = 0.5  # type: ignore[attr-defined]
    started = time.monotonic()
    with pytest.raises(requests.exceptions.Timeout):
        signer.create({**props, "key_version": version.replace("cryptoKeyVersions/1", "cryptoKeyVersions/9")})
    assert time.monotonic() - started < 2.5, "a stalled Cloud KMS fails the signature, it does not hang pulumi up"
    assert _diff(signer.diff(made.id, made.outs, {**props})) == (False, [], False)
    assert _diff(signer.diff(made.id, made.outs, {**props, "key_version": other})) == (True, ["key_version"], False)
    news = {**props, "payload": "bmV3", "key_version": other}
    assert _diff(signer.diff(made.id, made.outs, news)) == (True, ["payload", "key_version"], False)


def _diff(result: Any) -> tuple[bool, list[str], bool]:
    return result.changes, result.replaces, result.delete_before_replace


def test_the_signature_resource_carries_the_signer_pulumi_will_run(rendered: Render) -> None:
    """What the engine stores with each signature is the pickled _KmsSigner (the provider `pulumi up` runs)."""
    signature = rendered("prod").one("pulumi-python:dynamic:Resource", "binauthz-trainer-signature")
    signer = dill.loads(base64.b64decode(signature.inputs["__provider"]))
    assert signer.request(b"payload") == binauthz.sign_request(b"payload")
    assert type(signer).__name__ == "_KmsSigner" and hasattr(signer, "create")
