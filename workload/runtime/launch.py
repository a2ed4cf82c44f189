"""The launcher (``launch``): starts the training and scoring Jobs on the schedule, only for work to do, one
training Job at a time, and the scoring pod's wait for the newest models.

GPU pods cannot wait on a CPU step inside themselves (a pod's GPU is reserved for its whole life, init
containers included), so a small CPU pod decides and creates the Jobs. It is not the loader: the loader parses
the bank's files and holds the bucket and the share, and an account that may create Jobs can start any image
as any service account of its namespace. The scheduled loader only records what it added (``seed
--request-launch``: WorkQueue.request_launch); the launcher (its own service account, no share, no Google
identity: infra/schedule.py) reads that from Redis and posts the Jobs whose bodies Pulumi rendered from the
same code as the stack's Jobs (infra/jobs.py), mounted from a ConfigMap. An admission policy lets its
account create those two Jobs only (infra/admission.py).

The decisions are tested against a real Redis; the HTTP calls against an HTTPS server on loopback, not a real
API server (none can run on the development machines, and a hand-made one would only test our guess of it).
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
from workload.queue.workqueue import Counts, LaunchRequest, WorkQueue

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


# A Job is finished once one of these conditions is True (kubernetes.io "Jobs": terminal conditions; since 1.31
# they are added only after the Job's pods have terminated, so a "running" answer covers pods still stopping).
FINISHED_CONDITIONS = frozenset({"Complete", "Failed"})


class LaunchError(RuntimeError):
    """The API server refused or could not be reached: the launcher exits with the infrastructure code."""


def should_launch(added: int, counts: Counts) -> bool:
    """Train only what is new or still waiting: items this seed enqueued, or pending ones left by an
    earlier Job (failed, deadline, preempted out). Leased items alone have a live worker already."""
    return added > 0 or counts.pending > 0


def should_score(new_scoring_days: int, training_launched: bool) -> bool:
    """Score again only when there is something new to score: new scoring/ days, or models that the
    training Job just launched will change."""
    return new_scoring_days > 0 or training_launched


def wait_drained(queue: WorkQueue, share: Path | None, deadline_s: float, poll_s: float = 5.0) -> bool:
    """Wait until nothing is pending or leased (every item done or dead-lettered) AND the share holds every
    day of its plan in each run's newest checkpoint (`plan.not_done`), so the scorer reads the newest models;
    False when ``deadline_s`` passed first, with why in one line. A wiped Redis (empty, unseeded) is not a
    drained queue, nor is one that calls days done that the share lacks (restored from an older snapshot, or
    the share from an older backup): the workers restore and train them, and this waits for it. The whole
    queue, not only the scored runs: a run's newest model is final only when its days are applied, and the
    queue's counts are one atomic read (WorkQueue.counts) where a per-run view would need its own script.
    Without a share (the launcher, which mounts none) only Redis is asked: the scoring pod it posts checks the
    share in its own first step."""
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


def _waiting_for(queue: WorkQueue, share: Path | None) -> str | None:
    """What the scorer still waits for, in words; None when the queue is drained and the share holds its plan."""
    c = queue.counts()
    counts = f"{c.pending} pending, {c.leased} leased"
    if not c.drained or share is None:
        return None if c.drained else counts
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


def _service_account(sa_dir: Path, doing: str) -> tuple[str, str, str]:
    """(the pod's namespace, its token, the API server's base URL), or one line saying what is missing."""
    try:
        namespace = (sa_dir / "namespace").read_text().strip()
        token = (sa_dir / "token").read_text().strip()
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    except (OSError, KeyError) as exc:
        raise LaunchError(f"cannot {doing}: not in a pod with a service-account token and "
                          f"KUBERNETES_SERVICE_HOST ({exc})") from exc
    return namespace, token, f"https://{url_host(host)}:{port}/apis/batch/v1/namespaces/{namespace}/jobs"


def _call(method: str, url: str, token: str, sa_dir: Path, doing: str, body: dict[str, Any] | None,
          sleep: Callable[[float], None]) -> Any:
    """One API call with the pod's token, verified by the cluster's CA; on 429 and 5xx again, ATTEMPTS times in
    all, after the reply's Retry-After (``retry_wait_s``). Returns the last reply."""
    import requests  # in the image through google-cloud-storage

    for attempt in range(1, ATTEMPTS + 1):
        try:
            reply = requests.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"},
                                     verify=str(sa_dir / "ca.crt"), timeout=API_TIMEOUT_S)
        except requests.RequestException as exc:
            raise LaunchError(f"{doing} at {url}: {exc}") from exc
        if reply.status_code not in RETRY_STATUSES or attempt == ATTEMPTS:
            return reply
        wait = retry_wait_s(reply.headers, attempt)
        log.warning("%s: HTTP %d, attempt %d of %d; again in %.1fs", doing, reply.status_code, attempt, ATTEMPTS, wait)
        sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def _refused(reply: Any, url: str, doing: str) -> LaunchError:
    tries = f" (after {ATTEMPTS} attempts)" if reply.status_code in RETRY_STATUSES else ""
    return LaunchError(f"{doing} at {url}: HTTP {reply.status_code}{tries}: {reply.text[:300]}")


def create_job(body: dict[str, Any], sa_dir: Path = SERVICE_ACCOUNT_DIR, what: str = "training",
               sleep: Callable[[float], None] = time.sleep) -> str:
    """POST the Job to the pod's own namespace (``_call``: bounded retries on 429 and 5xx).

    Returns "created" or "exists": a Job of that name still present (training or finished, before its
    ttlSecondsAfterFinished removes it) drains the same queue, so a second one is not needed."""
    doing = f"creating the {what} Job"
    _, token, url = _service_account(sa_dir, f"create the {what} Job")
    reply = _call("POST", url, token, sa_dir, doing, body, sleep)
    if reply.status_code == 409:
        return "exists"
    if reply.status_code >= 300:
        raise _refused(reply, url, doing)
    return "created"


def get_job(name: str, sa_dir: Path = SERVICE_ACCOUNT_DIR, sleep: Callable[[float], None] = time.sleep
            ) -> dict[str, Any] | None:
    """The Job ``name`` of the pod's namespace as the API server has it, or None where there is none (404)."""
    doing = f"reading the Job {name}"
    _, token, url = _service_account(sa_dir, f"read the Job {name}")
    url = f"{url}/{name}"
    reply = _call("GET", url, token, sa_dir, doing, None, sleep)
    if reply.status_code == 404:
        return None
    if reply.status_code >= 300:
        raise _refused(reply, url, doing)
    try:
        body = reply.json()
    except ValueError as exc:
        raise LaunchError(f"{doing} at {url}: not JSON: {reply.text[:300]}") from exc
    return body if isinstance(body, dict) else {}


def job_running(job: dict[str, Any] | None) -> bool:
    """Whether a Job (as ``get_job`` returns it) may still run pods: it exists and has no True terminal
    condition. Suspended or not yet started counts as running: its pods may start any moment."""
    if job is None:
        return False
    conditions = (job.get("status") or {}).get("conditions") or []
    return not any(c.get("type") in FINISHED_CONDITIONS and c.get("status") == "True" for c in conditions)


def training_decision(request: LaunchRequest, counts: Counts, stack_job_running: bool, stack_job: str) -> str | None:
    """Why no training Job is posted, or None to post it. One training Job at a time per stack: while the stack's
    own training Job (Pulumi's) may run, its workers take what the loads added (they exit only once the queue is
    drained), and a second Job would double the GPU pods the quota check sized. The scheduled Job's fixed name
    does the same against itself (409)."""
    if not should_launch(request.added, counts):
        return "nothing new: no training Job"
    if stack_job_running:
        return f"the stack's training Job {stack_job} still runs and takes the new work: no second training Job"
    return None


def wait_for_load(queue: WorkQueue, deadline_s: float, poll_s: float = 5.0) -> LaunchRequest:
    """The launch request once a scheduled load has recorded one; after ``deadline_s`` whatever is there (a
    failed load records nothing, and pending work left by an earlier Job is still worth a launch)."""
    end = time.monotonic() + deadline_s
    while True:
        request = queue.launch_request()
        left = end - time.monotonic()
        if request.loads > 0 or left <= 0:
            return request
        time.sleep(min(poll_s, left))


def launch_training(queue: WorkQueue, request: LaunchRequest, job: Path, stack_job: str | None) -> tuple[bool, str]:
    """Post the training Job when there is work and no training Job of the stack runs; (posted, log line)."""
    counts = queue.counts()
    running = job_running(get_job(stack_job)) if stack_job and should_launch(request.added, counts) else False
    why_not = training_decision(request, counts, running, stack_job or "")
    if why_not:
        return False, why_not
    body = read_job(job)
    name = body.get("metadata", {}).get("name")
    return True, (f"training Job {name}: {create_job(body)} for {request.added} new, {counts.pending} pending "
                  "item(s)")


def launch_scoring(queue: WorkQueue, request: LaunchRequest, job: Path, training_launched: bool,
                   drain_s: float, poll_s: float = 5.0) -> str:
    """Post the scoring Job when there are new scoring/ days or new models coming, once the queue is drained:
    the wait is this small pod's, not the scoring pod's (whose requests are its scorers' for its whole life)."""
    if not should_score(request.scoring_days + request.rescore, training_launched):
        return "nothing new to score: no scoring Job"
    body = read_job(job, "scoring")
    if not wait_drained(queue, None, drain_s, poll_s):
        raise LaunchError(f"scoring Job: the queue was not drained within {drain_s:g}s; the next launch "
                          "tries again")
    name = body.get("metadata", {}).get("name")
    return f"scoring Job {name}: {create_job(body, what='scoring')} for {request.scoring_days} new scoring day(s)"


def run(queue: WorkQueue, job: Path, scoring: Path | None, stack_job: str | None, load_wait_s: float,
        drain_s: float, poll_s: float = 5.0) -> list[str]:
    """The launcher, step by step; returns its log lines.

    1. wait for the scheduled load's request (what it added, which scoring/ days it published);
    2. post the training Job if there is work and the stack's training Job is not running;
    3. post the scoring Job if there is something new to score, once the queue is drained.
    After each Job, what was acted on is subtracted from the request (a launcher that dies first leaves it for the
    next): a scoring Job that timed out waiting is owed, and a training Job once posted is not posted again."""
    lines: list[str] = []

    def say(line: str) -> None:
        log.info("%s", line)
        lines.append(line)

    request = wait_for_load(queue, load_wait_s, poll_s)
    say(f"{request.loads} load(s) recorded {request.added} new item(s), {request.scoring_days} new scoring day(s)")
    launched, line = launch_training(queue, request, job, stack_job)
    say(line)
    queue.launch_done(LaunchRequest(loads=request.loads, added=request.added), owe_scoring=launched and bool(scoring))
    if scoring is not None:
        say(launch_scoring(queue, request, scoring, launched, drain_s, poll_s))
        queue.launch_done(LaunchRequest(scoring_days=request.scoring_days, rescore=request.rescore + launched))
    return lines
