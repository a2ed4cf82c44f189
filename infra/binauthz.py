"""Binary Authorization: only this stack's signed images run on its cluster (binaryAuthorization: true).

What the stack declares (pulumi_gcp 10.2, generated from terraform-provider-google; arguments read in the SDK
installed in .venv):
- a Cloud KMS key of its own that signs: ``kms.CryptoKey(purpose="ASYMMETRIC_SIGN",
  version_template={"algorithm": "EC_SIGN_P256_SHA256"})`` in a key ring of its own (protected like the cluster);
- a Container Analysis note (``containeranalysis.Note(attestation_authority={"hint": ...})``) and the attestor
  that names it with the key's public key: ``binaryauthorization.Attestor(attestation_authority_note=
  {note_reference, public_keys=[{id, pkix_public_key={public_key_pem, signature_algorithm}}]})``, the public key
  read with ``kms.get_kms_crypto_key_version_output`` (the SDK's own "Binary Authorization Attestor Kms" example);
- the project's policy (``binaryauthorization.Policy``): default rule ALWAYS_DENY; the stack's cluster
  (``cluster_admission_rules[].cluster`` = ``{location}.{clusterId}``) REQUIRE_ATTESTATION by this attestor,
  ENFORCED_BLOCK_AND_AUDIT_LOG; ``global_policy_evaluation_mode="ENABLE"`` so Google's GKE system images pass.
  The policy is a project singleton: one stack owns it (docs/security.md), and it carries Pulumi ``protect``;
- one attestation per image the stack runs, made during ``pulumi up``: the simple-signing payload
  (``signature_payload``), its signature by the key (``KmsSignature``, Cloud KMS ``asymmetricSign`` over REST:
  no provider resource signs), and a ``containeranalysis.Occurence`` (the SDK's spelling) on the image's
  ``https://`` digest URL with ``attestation={serialized_payload, signatures=[{public_key_id, signature}]}``,
  both base64 as the SDK's example (``std.filebase64``) has them. ``attested`` hands the image reference on only
  once its occurrence and the policy exist, so every Job, CronJob and Deployment that runs it waits for both.

Redis (through the stack's Docker Hub proxy) is attested too, by the same key, rather than allowlisted: an
``admission_whitelist_patterns`` entry is a path pattern (``registry/path/to/image``, trailing ``*``), which admits
whatever is pushed or cached under that path, while an attestation names one digest (``redisImage``'s).

Evidence for the formats: the payload's bytes are gcloud's ``MakeSignaturePayload``
(googlecloudsdk/command_lib/container/binauthz/util.py: ``json.dumps(..., ensure_ascii=True, indent=2,
separators=(",", ": "), sort_keys=True)`` plus a newline; type "Google cloud binauthz container signature");
the occurrence's resource URI is ``NormalizeArtifactUrl`` (the artifact URL with scheme ``https``); the key's ID
``//cloudkms.googleapis.com/v1/<key version name>`` (what gcloud's ``attestors public-keys add --keyversion`` and
Kritis' KMS signer use); ECDSA_P256_SHA256 is EC_SIGN_P256_SHA256 (both 9 in binaryauthorization v1's
``PkixPublicKey.SignatureAlgorithm``). Cloud KMS ``asymmetricSign`` (cloud.google.com/kms/docs/reference/rest/v1/
projects.locations.keyRings.cryptoKeys.cryptoKeyVersions/asymmetricSign) takes ``{"digest": {"sha256": <b64>}}``
and returns ``{"signature": <b64>}``, a DER ECDSA signature over that digest: the signature of the payload that
Binary Authorization verifies. Nothing here was run against a live project.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra.config import Site

SIGNING_ALGORITHM = "EC_SIGN_P256_SHA256"  # Cloud KMS CryptoKeyVersionAlgorithm
ATTESTOR_ALGORITHM = "ECDSA_P256_SHA256"  # Binary Authorization's name for the same (enum value 9)
PAYLOAD_TYPE = "Google cloud binauthz container signature"
KMS_KEY_ID = "//cloudkms.googleapis.com/v1/"
ENFORCE = "ENFORCED_BLOCK_AND_AUDIT_LOG"
# What the identity running `pulumi up` needs to attest, each on the one resource (docs/ci.md): sign with the
# stack's attestation key, attach occurrences to the stack's note.
SIGNER_ROLE = "roles/cloudkms.signerVerifier"
ATTACHER_ROLE = "roles/containeranalysis.notes.attacher"


def signature_payload(image: str) -> bytes:
    """The simple-signing payload of ``image`` (``name@sha256:<hex>``), byte for byte as gcloud writes it."""
    name, sep, digest = image.partition("@")
    if not sep or not digest.startswith("sha256:") or "://" in name:
        raise ValueError(f"image {image!r} is not name@sha256:<digest>: only a digest can be attested")
    payload = {"critical": {"identity": {"docker-reference": name},
                            "image": {"docker-manifest-digest": digest}, "type": PAYLOAD_TYPE}}
    return (json.dumps(payload, ensure_ascii=True, indent=2, separators=(",", ": "), sort_keys=True) + "\n").encode()


def resource_uri(image: str) -> str:
    """The occurrence's resource: the image's digest URL with scheme https (gcloud's NormalizeArtifactUrl)."""
    return f"https://{image}"


def public_key_id(key_version_name: str) -> str:
    """The attestor's and the signature's ID of a Cloud KMS key version (``projects/../cryptoKeyVersions/1``)."""
    return KMS_KEY_ID + key_version_name


def member_of(email: str) -> str:
    """The IAM member of the identity running `pulumi up`: a service account in CI, a person on a laptop."""
    return f"serviceAccount:{email}" if email.endswith(".gserviceaccount.com") else f"user:{email}"


class _KmsSigner(pulumi.dynamic.ResourceProvider):
    """Signs ``payload`` (base64) with ``key_version`` on create; a new payload or key is a new signature.

    Self-contained: Pulumi pickles the provider into the state with dill, which pickles a class of an importable
    module by reference, and the dynamic provider host that unpickles it need not import ``infra`` (pulumi/pulumi
    #7453). So the class is marked ``__main__`` (pickled by value, pulumi/pulumi#7755's approach, which the SDK
    3.272 here does not apply itself) and everything it calls lives in it (tests/infra/test_infra_binauthz.py
    unpickles it in an interpreter where ``infra`` is not importable)."""

    api = "https://cloudkms.googleapis.com/v1/"
    scope = "https://www.googleapis.com/auth/cloud-platform"
    timeout_s = 60.0  # a Cloud KMS that does not answer fails `pulumi up` after this, never hangs it

    @staticmethod
    def request(payload: bytes) -> dict[str, Any]:
        """The body of Cloud KMS ``asymmetricSign`` for ``payload``: its SHA-256 digest (a P-256/SHA-256 key)."""
        import base64

        return {"digest": {"sha256": base64.b64encode(hashlib.sha256(payload).digest()).decode()}}

    def sign(self, key_version: str, payload: bytes) -> str:
        """``payload`` signed by the key version, base64 (DER ECDSA), with the deployer's application default
        credentials (in CI the deploy identity, granted SIGNER_ROLE on this key only)."""
        import google.auth  # only `pulumi up` signs: renders and previews never import it
        from google.auth.transport.requests import AuthorizedSession

        credentials, _ = google.auth.default(scopes=[self.scope])
        reply = AuthorizedSession(credentials).post(
            f"{self.api}{key_version}:asymmetricSign", json=self.request(payload), timeout=self.timeout_s)
        if reply.status_code != 200:
            raise RuntimeError(f"Cloud KMS asymmetricSign with {key_version} failed: {reply.status_code} {reply.text}")
        return str(reply.json()["signature"])

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        import base64

        payload = base64.b64decode(props["payload"])
        signature = self.sign(props["key_version"], payload)
        return pulumi.dynamic.CreateResult(hashlib.sha256(payload).hexdigest(), {**props, "signature": signature})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changed = [k for k in ("payload", "key_version") if olds.get(k) != news.get(k)]
        return pulumi.dynamic.DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=False)


# Pickled by value, not as references into this module: dill does that for ``__main__``'s classes and functions only.
_KmsSigner.__module__ = "__main__"
for _method in vars(_KmsSigner).values():
    if callable(getattr(_method, "__func__", _method)):
        getattr(_method, "__func__", _method).__module__ = "__main__"
sign_request = _KmsSigner.request


class KmsSignature(pulumi.dynamic.Resource):
    """A Cloud KMS signature of a payload; ``signature`` is base64 (DER ECDSA)."""

    signature: pulumi.Output[str]

    @staticmethod
    def provider() -> pulumi.dynamic.ResourceProvider:
        return _KmsSigner()

    def __init__(self, name: str, payload: pulumi.Input[str], key_version: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(self.provider(), name,
                         {"payload": payload, "key_version": key_version, "signature": None}, opts)


@dataclass(frozen=True)
class BinauthzArgs:
    """Where it goes; the cluster its rule names (``{location}.{name}``); whether it is protected."""

    site: Site
    cluster_name: pulumi.Input[str]
    protected: bool


class BinaryAuthorization(pulumi.ComponentResource):
    """The stack's attestor, key and note, the project's policy, and ``attested`` for each image it runs."""

    def __init__(self, name: str, args: BinauthzArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spot-trainer:gcp:BinaryAuthorization", name, None, opts)
        site, child = args.site, pulumi.ResourceOptions(parent=self)
        kept = pulumi.ResourceOptions(parent=self, protect=args.protected)
        self._name, self._site = name, site
        ring = gcp.kms.KeyRing(f"{name}-attestor", project=site.project_id, location=site.region,
                               name=f"{site.labels.app}-{site.slug}-binauthz", opts=child)
        key = gcp.kms.CryptoKey(
            f"{name}-attestor", key_ring=ring.id, name="attestor", purpose="ASYMMETRIC_SIGN",
            version_template=gcp.kms.CryptoKeyVersionTemplateArgs(algorithm=SIGNING_ALGORITHM),
            labels=site.labels.as_dict(), opts=kept)
        version = gcp.kms.get_kms_crypto_key_version_output(crypto_key=key.id, opts=pulumi.InvokeOutputOptions(
            parent=self))
        self.key_version: pulumi.Output[str] = version.name
        self.note = gcp.containeranalysis.Note(
            f"{name}-attestor", project=site.project_id, name=f"{site.labels.app}-{site.slug}-attestor",
            attestation_authority=gcp.containeranalysis.NoteAttestationAuthorityArgs(
                hint=gcp.containeranalysis.NoteAttestationAuthorityHintArgs(
                    human_readable_name=f"{site.labels.app} {site.stack}: built and pushed by pulumi up")),
            opts=child)
        self.attestor = gcp.binaryauthorization.Attestor(
            f"{name}-attestor", project=site.project_id, name=f"{site.labels.app}-{site.slug}",
            attestation_authority_note=gcp.binaryauthorization.AttestorAttestationAuthorityNoteArgs(
                note_reference=self.note.name,
                public_keys=[gcp.binaryauthorization.AttestorAttestationAuthorityNotePublicKeyArgs(
                    id=version.name.apply(public_key_id),
                    pkix_public_key=gcp.binaryauthorization.AttestorAttestationAuthorityNotePublicKeyPkixPublicKeyArgs(
                        public_key_pem=version.public_keys[0].pem, signature_algorithm=ATTESTOR_ALGORITHM))]),
            opts=child)
        self.policy = self._policy(name, args)
        self._grants = self._deployer_grants(name, key)
        self.register_outputs({"attestor": self.attestor.id, "policy": self.policy.id})

    def _policy(self, name: str, args: BinauthzArgs) -> gcp.binaryauthorization.Policy:
        """The project's policy: nothing runs but this cluster's attested images and GKE's system images."""
        cluster = pulumi.Output.concat(args.site.region, ".", args.cluster_name)
        return gcp.binaryauthorization.Policy(
            f"{name}-policy", project=args.site.project_id,
            description=f"{args.site.labels.app} {args.site.stack}: only images its attestor signed",
            global_policy_evaluation_mode="ENABLE",
            default_admission_rule=gcp.binaryauthorization.PolicyDefaultAdmissionRuleArgs(
                evaluation_mode="ALWAYS_DENY", enforcement_mode=ENFORCE),
            cluster_admission_rules=[gcp.binaryauthorization.PolicyClusterAdmissionRuleArgs(
                cluster=cluster, evaluation_mode="REQUIRE_ATTESTATION", enforcement_mode=ENFORCE,
                require_attestations_bies=[self.attestor.id])],
            opts=pulumi.ResourceOptions(parent=self, protect=args.protected))

    def _deployer_grants(self, name: str, key: gcp.kms.CryptoKey) -> list[pulumi.Resource]:
        """Whoever runs `pulumi up` signs with this key and attaches to this note: each role on that one resource."""
        me = gcp.organizations.get_client_open_id_user_info_output(opts=pulumi.InvokeOutputOptions(parent=self))
        member = me.email.apply(member_of)
        child = pulumi.ResourceOptions(parent=self)
        return [
            gcp.kms.CryptoKeyIAMMember(f"{name}-deployer-signs", crypto_key_id=key.id, role=SIGNER_ROLE,
                                       member=member, opts=child),
            gcp.containeranalysis.NoteIamMember(f"{name}-deployer-attaches", project=self._site.project_id,
                                                note=self.note.name, role=ATTACHER_ROLE, member=member, opts=child),
        ]

    def attested(self, label: str, image: pulumi.Input[str]) -> pulumi.Output[str]:
        """``image`` (by digest), handed on once its attestation and the policy exist: whatever runs it waits."""
        payload = pulumi.Output.from_input(image).apply(
            lambda ref: base64.b64encode(signature_payload(ref)).decode())
        after = pulumi.ResourceOptions(parent=self, depends_on=self._grants)
        signature = KmsSignature(f"{self._name}-{label}-signature", payload, self.key_version, opts=after)
        occurrence = gcp.containeranalysis.Occurence(
            f"{self._name}-{label}", project=self._site.project_id, note_name=self.note.id,
            resource_uri=pulumi.Output.from_input(image).apply(resource_uri),
            attestation=gcp.containeranalysis.OccurenceAttestationArgs(
                serialized_payload=payload,
                signatures=[gcp.containeranalysis.OccurenceAttestationSignatureArgs(
                    public_key_id=self.key_version.apply(public_key_id), signature=signature.signature)]),
            opts=after)
        return pulumi.Output.all(image, occurrence.id, self.policy.id).apply(lambda parts: str(parts[0]))
