"""Starting the training and scoring Jobs from the scheduled loader (``seed --launch-job FILE
--launch-scoring FILE``), only for work to do, and the scoring pod's wait for the newest models.

GPU pods cannot wait on a CPU step inside themselves (a pod's GPU is reserved for its whole life, init
containers included), so the scheduled loader, on CPU, decides and creates the training Job itself. The
Job's body is the file Pulumi rendered from the same code as the stack's training Job (infra/jobs.py),
mounted from a ConfigMap; the pod's service account may only create Jobs in its namespace.

The decision is tested against a real Redis. The HTTP call itself is untested here: no Kubernetes API
server can run on the development machines, and a hand-made one would only test our own guess of it.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workload.data.dayfile import DatasetError
from workload.queue import plan
from workload.queue.workqueue import Counts, WorkQueue

log = logging.getLogger(__name__)

# Where Kubernetes mounts a pod's service-account credentials (kubernetes.io/docs, "Accessing the
# Kubernetes API from a Pod": token, ca.crt, namespace under this folder; the API server's address in
# KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
API_TIMEOUT_S = 30.0
# Bounded retries of the POST on the answers that ask for one: 429 (API priority and fairness, with a
# Retry-After header) and 5xx (an API server restarting, an etcd leader change). Kubernetes' own clients do
# the same (client-go rest/request.go: retries honouring Retry-After). A retried POST that had in fact created
# the Job gets 409, which is "exists": the name makes the call idempotent.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
ATTEMPTS = 5
FIRST_WAIT_S = 1.0  # without Retry-After: 1, 2, 4, 8 s
MAX_WAIT_S = 30.0  # a Retry-After above it waits this long


class LaunchError(RuntimeError):
    """The API server refused or could not be reached: the loader exits with the infrastructure code."""


def should_launch(added: int, counts: Counts) -> bool:
    """Train only what is new or still waiting: items this seed enqueued, or pending ones left by an
    earlier Job (failed, deadline, preempted out). Leased items alone have a live worker already."""
    return added > 0 or counts.pending > 0


def should_score(new_scoring_days: int, training_launched: bool) -> bool:
    """Score again only when there is something new to score: new scoring/ days, or models that the
    training Job just launched will change."""
    return new_scoring_days > 0 or training_launched


def wait_drained(queue: WorkQueue, share: Path, deadline_s: float, poll_s: float = 5.0) -> bool:
    """Wait until nothing is pending or leased (every item done or dead-lettered) AND the share holds every
    day of its plan in each run's newest checkpoint (`plan.not_done`), so the scorer reads the newest models;
    False when ``deadline_s`` passed first, with why in one line. A wiped Redis (empty, unseeded) is not a
    drained queue, nor is one that calls days done that the share lacks (restored from an older snapshot, or
    the share from an older backup): the workers restore and train them, and this waits for it. The whole
    queue, not only the scored runs: a run's newest model is final only when its days are applied, and the
    queue's counts are one atomic read (WorkQueue.counts) where a per-run view would need its own script."""
    end = time.monotonic() + deadline_s
    while True:
        why = _waiting_for(queue, share)
        if why is None:
            return True
        left = end - time.monotonic()
        if left <= 0:
            log.error("queue not drained after %.0fs: %s", deadline_s, why)
            return False
        log.info("waiting for training to finish: %s", why)
        time.sleep(min(poll_s, left))


def _waiting_for(queue: WorkQueue, share: Path) -> str | None:
    """What the scorer still waits for, in words; None when the queue is drained and the share holds its plan."""
    c = queue.counts()
    counts = f"{c.pending} pending, {c.leased} leased"
    if not c.drained:
        return counts
    from workload.model import lineage  # torch: only once the queue looks drained

    try:
        why = plan.not_done(queue, share, lineage.applied_days)
    except (plan.PlanError, DatasetError) as exc:
        why = f"cannot read the share's plan: {exc}"
    return None if why is None else f"{counts}, but {why}"


def read_job(path: Path, what: str = "training") -> dict[str, Any]:
    """The ``what`` Job's body as Pulumi rendered it (a Job manifest in JSON)."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{what} Job template {path}: {exc}") from exc
    if not isinstance(body, dict) or body.get("kind") != "Job":
        raise LaunchError(f"{what} Job template {path}: not a Job manifest (kind {body.get('kind')!r})"
                          if isinstance(body, dict) else f"{what} Job template {path}: not a JSON object")
    return body


def url_host(host: str) -> str:
    """The API server's host as a URL writes it: an IPv6 address in brackets (RFC 3986; an IPv6-only or
    dual-stack cluster gives KUBERNETES_SERVICE_HOST as a bare address such as fd00::1)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def retry_wait_s(headers: Mapping[str, str], attempt: int, now: float | None = None) -> float:
    """How long to wait before attempt ``attempt + 1``: the reply's Retry-After (seconds, or an HTTP date;
    RFC 9110 10.2.3) where it has a usable one, else FIRST_WAIT_S doubled per attempt; never over MAX_WAIT_S."""
    value = (headers.get("Retry-After") or "").strip()
    wait = FIRST_WAIT_S * 2 ** (attempt - 1)
    if value.isdigit():
        wait = float(value)
    elif value:
        try:
            wait = email.utils.parsedate_to_datetime(value).timestamp() - (time.time() if now is None else now)
        except (TypeError, ValueError):
            pass
    return min(max(wait, 0.0), MAX_WAIT_S)


def create_job(body: dict[str, Any], sa_dir: Path = SERVICE_ACCOUNT_DIR, what: str = "training",
               sleep: Callable[[float], None] = time.sleep) -> str:
    """POST the Job to the pod's own namespace with the pod's token, verified by the cluster's CA; on 429 and
    5xx again, ATTEMPTS times in all, after the reply's Retry-After (``retry_wait_s``).

    Returns "created" or "exists": a Job of that name still present (training or finished, before its
    ttlSecondsAfterFinished removes it) drains the same queue, so a second one is not needed. Tested against an
    HTTPS server on loopback (tests/workload/test_launch_inprocess.py), not a real API server."""
    import requests  # in the image through google-cloud-storage

    try:
        namespace = (sa_dir / "namespace").read_text().strip()
        token = (sa_dir / "token").read_text().strip()
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    except (OSError, KeyError) as exc:
        raise LaunchError(f"cannot create the {what} Job: not in a pod with a service-account token and "
                          f"KUBERNETES_SERVICE_HOST ({exc})") from exc
    url = f"https://{url_host(host)}:{port}/apis/batch/v1/namespaces/{namespace}/jobs"
    for attempt in range(1, ATTEMPTS + 1):
        try:
            reply = requests.post(url, json=body, headers={"Authorization": f"Bearer {token}"},
                                  verify=str(sa_dir / "ca.crt"), timeout=API_TIMEOUT_S)
        except requests.RequestException as exc:
            raise LaunchError(f"creating the {what} Job at {url}: {exc}") from exc
        if reply.status_code not in RETRY_STATUSES or attempt == ATTEMPTS:
            break
        wait = retry_wait_s(reply.headers, attempt)
        log.warning("creating the %s Job: HTTP %d, attempt %d of %d; again in %.1fs",
                    what, reply.status_code, attempt, ATTEMPTS, wait)
        sleep(wait)
    if reply.status_code == 409:
        return "exists"
    if reply.status_code >= 300:
        tries = f" (after {ATTEMPTS} attempts)" if reply.status_code in RETRY_STATUSES else ""
        raise LaunchError(f"creating the {what} Job at {url}: HTTP {reply.status_code}{tries}: {reply.text[:300]}")
    return "created"


def launch(path: Path, added: int, counts: Counts) -> str:
    """Create the training Job when there is work; returns what happened, for the log."""
    if not should_launch(added, counts):
        return "nothing new: no training Job"
    body = read_job(path)
    name = body.get("metadata", {}).get("name")
    return f"training Job {name}: {create_job(body)} for {added} new, {counts.pending} pending item(s)"


def launch_scoring(path: Path, new_scoring_days: int, training_launched: bool) -> str:
    """Create the scoring Job when there are new scoring/ days or new models coming; its pod waits for
    the queue to drain first (``wait-drained``). Returns what happened, for the log."""
    if not should_score(new_scoring_days, training_launched):
        return "nothing new to score: no scoring Job"
    body = read_job(path, "scoring")
    name = body.get("metadata", {}).get("name")
    return f"scoring Job {name}: {create_job(body, what='scoring')} for {new_scoring_days} new scoring day(s)"
