"""The launcher in-process: its decisions, the Job templates it reads, the load's request and the scorer's wait
against a real Redis, and its API calls (POST a Job, GET the stack's training Job) against a real HTTPS server on
loopback holding a self-signed certificate that the pod's CA file names (test_launch.py drives the loader's half
through `seed` processes, which mutation testing cannot trace)."""

from __future__ import annotations

import functools
import json
import logging
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apiserver import ApiServer, api_server
from harness import Cluster

from workload.queue import plan
from workload.queue.workqueue import Counts, Item, LaunchRequest
from workload.runtime import launch

JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "trainer-7"}, "spec": {"parallelism": 2}}


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiServer]:
    with api_server(tmp_path, monkeypatch) as state:
        yield state


def test_a_job_is_posted_to_the_pods_namespace_with_its_token(api: ApiServer) -> None:
    assert launch.create_job(JOB, api.sa_dir) == "created"
    assert api.posts == [("/apis/batch/v1/namespaces/fraud/jobs", "Bearer pod-token", JOB)]
    api.status = 409  # a Job of that name is still there: it drains the same queue
    assert launch.create_job(JOB, api.sa_dir, what="scoring") == "exists"


@pytest.mark.parametrize(("status", "what", "tries"), [
    (300, "training", ""), (403, "scoring", ""), (500, "training", f" (after {launch.ATTEMPTS} attempts)")])
def test_a_refusal_is_one_error_naming_the_job_the_url_and_the_reply(
        api: ApiServer, status: int, what: str, tries: str) -> None:
    api.status, api.text = status, "x" * 299 + "yz"
    waits: list[float] = []
    with pytest.raises(launch.LaunchError) as err:
        launch.create_job(JOB, api.sa_dir, what=what, sleep=waits.append)
    assert str(err.value) == f"creating the {what} Job at {api.url}: HTTP {status}{tries}: {'x' * 299}y"
    assert len(api.posts) == (launch.ATTEMPTS if tries else 1) and len(waits) == len(api.posts) - 1


def test_429_and_5xx_are_retried_after_the_servers_retry_after(api: ApiServer) -> None:
    api.answers = [(429, {"Retry-After": "7"}), (503, {}), (500, {"Retry-After": "999"})]
    waits: list[float] = []
    assert launch.create_job(JOB, api.sa_dir, sleep=waits.append) == "created"
    assert waits == [7.0, 2.0, launch.MAX_WAIT_S]  # its own header; no header: backoff; capped
    assert len(api.posts) == 4
    api.posts.clear()
    api.answers = [(503, {})]
    api.status = 409  # the first POST had created it after all
    assert launch.create_job(JOB, api.sa_dir, sleep=waits.append) == "exists" and len(api.posts) == 2


def test_a_retry_after_date_and_nonsense_are_read_as_the_rfc_says() -> None:
    now = 1_700_000_000.0
    date = "Tue, 14 Nov 2023 22:13:30 GMT"  # now + 10 s
    assert launch.retry_wait_s({"Retry-After": date}, 1, now=now) == 10.0
    assert launch.retry_wait_s({"Retry-After": "soon"}, 3, now=now) == 4.0  # unusable: the backoff
    assert launch.retry_wait_s({"Retry-After": "Mon, 13 Nov 2023 00:00:00 GMT"}, 1, now=now) == 0.0  # past


def test_an_ipv6_api_host_is_put_in_brackets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert launch.url_host("fd00::1") == "[fd00::1]" and launch.url_host("10.0.0.1") == "10.0.0.1"
    assert launch.url_host("[fd00::1]") == "[fd00::1]"
    with api_server(tmp_path, monkeypatch, host="::1") as api:
        assert launch.create_job(JOB, api.sa_dir) == "created"
        assert api.url.startswith("https://[::1]:") and len(api.posts) == 1


def test_an_api_server_that_cannot_be_trusted_or_reached_is_a_launch_error(
        api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stranger = tmp_path / "stranger"
    shutil.copytree(api.sa_dir, stranger)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(tmp_path / "k2"), "-out", str(stranger / "ca.crt"), "-days", "1",
                    "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    with pytest.raises(launch.LaunchError, match=rf"^creating the scoring Job at {api.url}: .*CERTIFICATE_VERIFY"):
        launch.create_job(JOB, stranger, what="scoring")
    assert api.posts == []
    monkeypatch.setattr(launch, "API_TIMEOUT_S", 0.5)
    api.delay_s = 3.0  # an API server that does not answer within the budget
    started = time.monotonic()
    with pytest.raises(launch.LaunchError, match=rf"^creating the training Job at {api.url}: .*timed out"):
        launch.create_job(JOB, api.sa_dir)
    assert time.monotonic() - started < 2.5
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT")  # the API server's default port, where nothing listens here
    with pytest.raises(launch.LaunchError, match=r"^creating the training Job at https://127\.0\.0\.1:443/apis/"):
        launch.create_job(JOB, api.sa_dir)


def test_outside_a_pod_there_is_nothing_to_post_with(api: ApiServer, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(launch.LaunchError, match=r"^cannot create the scoring Job: not in a pod with a "
                                                 r"service-account token and KUBERNETES_SERVICE_HOST \(.*namespace"):
        launch.create_job(JOB, tmp_path / "absent", what="scoring")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(launch.LaunchError, match=r"^cannot create the training Job: .*\('KUBERNETES_SERVICE_HOST'\)$"):
        launch.create_job(JOB, api.sa_dir)
    assert api.posts == []


def test_only_new_or_waiting_work_launches_training_and_only_new_days_or_models_launch_scoring() -> None:
    def counts(pending: int, leased: int = 0) -> Counts:
        return Counts(pending=pending, leased=leased, done=5, dead=0, total=5 + pending + leased)

    assert not launch.should_launch(0, counts(0, leased=3))  # a live worker has it already
    assert launch.should_launch(1, counts(0)) and launch.should_launch(0, counts(1))
    assert not launch.should_score(0, False)
    assert launch.should_score(1, False) and launch.should_score(0, True)
    nothing, new = LaunchRequest(loads=1), LaunchRequest(loads=1, added=2)
    assert launch.training_decision(nothing, counts(0), False, "st") == "nothing new: no training Job"
    assert launch.training_decision(nothing, counts(0), True, "st") == "nothing new: no training Job"
    assert launch.training_decision(new, counts(2), False, "st") is None
    assert launch.training_decision(nothing, counts(2), True, "st") == (
        "the stack's training Job st still runs and takes the new work: no second training Job")


@pytest.mark.parametrize(("job", "running"), [
    (None, False),  # no such Job (404)
    ({}, True),  # created, no status yet
    ({"status": {"active": 2}}, True),
    ({"spec": {"suspend": True}, "status": {}}, True),  # its pods may start any moment
    ({"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}}, True),  # pods still stopping
    ({"status": {"conditions": [{"type": "Complete", "status": "False"}]}}, True),
    ({"status": {"conditions": [{"type": "Suspended", "status": "True"}, {"type": "Complete", "status": "True"}]}},
     False),
    ({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}, False),
])  # fmt: skip
def test_a_job_runs_until_a_terminal_condition_is_true(job: dict | None, running: bool) -> None:
    assert launch.job_running(job) is running


def test_the_stacks_training_job_is_read_by_name_with_the_pods_token(api: ApiServer) -> None:
    assert launch.get_job("spot-trainer-worker", api.sa_dir) is None  # 404
    api.jobs["spot-trainer-worker"] = {"kind": "Job", "status": {"active": 1}}
    api.answers = [(503, {"Retry-After": "3"})]
    waits: list[float] = []
    assert launch.get_job("spot-trainer-worker", api.sa_dir, sleep=waits.append) == api.jobs["spot-trainer-worker"]
    assert waits == [3.0] and api.gets == ["/apis/batch/v1/namespaces/fraud/jobs/spot-trainer-worker"] * 3
    api.answers = [(403, {})]
    with pytest.raises(launch.LaunchError, match=rf"^reading the Job spot-trainer-worker at {api.url}/"
                                                 r"spot-trainer-worker: HTTP 403: "):
        launch.get_job("spot-trainer-worker", api.sa_dir)
    with pytest.raises(launch.LaunchError, match=r"^cannot read the Job x: not in a pod"):
        launch.get_job("x", api.sa_dir / "absent")
    assert api.posts == []


@pytest.fixture
def posting(api: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ApiServer, Path, Path]:
    """The API server, with the launcher's calls pointed at its service-account folder, and the two Job bodies."""
    monkeypatch.setattr(launch, "create_job", functools.partial(launch.create_job, sa_dir=api.sa_dir))
    monkeypatch.setattr(launch, "get_job", functools.partial(launch.get_job, sa_dir=api.sa_dir))
    bodies = []
    for kind in ("training", "scoring"):
        bodies.append(tmp_path / f"{kind}.json")
        bodies[-1].write_text(json.dumps({**JOB, "metadata": {"name": kind}}))
    return api, bodies[0], bodies[1]


# Two days of one run, as a load enqueues them (the launcher reads only the queue's counts).
DAYS = [Item(run="main", shard=f"training/2018-04-0{d}.parquet", dataset="fraud", seq=d) for d in (1, 2)]


def _posted(api: ApiServer) -> list[str]:
    return [body["metadata"]["name"] for _, _, body in api.posts]


def test_the_launcher_acts_once_on_the_loads_request_and_scores_once_the_queue_is_drained(
    cluster: Cluster, posting: tuple[ApiServer, Path, Path]
) -> None:
    """Training at once; scoring only on a drained queue (the wait is the launcher's, not the scoring pod's); what
    was acted on is taken from the request, what was not (the scoring Job, past its wait) is left for the next."""
    api, training, scoring = posting
    queue = cluster.queue()
    assert queue.enqueue(DAYS) == 2
    queue.request_launch(added=2, scoring_days=1)
    not_drained = r"^scoring Job: the queue was not drained within 0\.2s; the next launch tries again$"
    with pytest.raises(launch.LaunchError, match=not_drained):
        launch.run(queue, training, scoring, "stack-job", load_wait_s=5.0, drain_s=0.2, poll_s=0.05)
    assert _posted(api) == ["training"] and api.gets[-1].endswith("/jobs/stack-job")
    assert queue.launch_request() == LaunchRequest(loads=0, added=0, scoring_days=1, rescore=1)

    queue.mark_done(DAYS)  # trained: the next launcher scores, and trains nothing again
    lines = launch.run(queue, training, scoring, "stack-job", load_wait_s=0.1, drain_s=1.0, poll_s=0.05)
    assert lines == ["0 load(s) recorded 0 new item(s), 1 new scoring day(s)", "nothing new: no training Job",
                     "scoring Job scoring: created for 1 new scoring day(s)"]
    assert _posted(api) == ["training", "scoring"] and queue.launch_request() == LaunchRequest()
    lines = launch.run(queue, training, scoring, "stack-job", load_wait_s=0.1, drain_s=1.0, poll_s=0.05)
    assert lines[1:] == ["nothing new: no training Job", "nothing new to score: no scoring Job"]
    assert _posted(api) == ["training", "scoring"]


def test_no_second_training_job_while_the_stacks_own_runs(
    cluster: Cluster, posting: tuple[ApiServer, Path, Path]
) -> None:
    """One training Job per stack: while Pulumi's training Job may run, its workers take the load's items."""
    api, training, _ = posting
    queue = cluster.queue()
    queue.enqueue(DAYS)
    queue.request_launch(added=2, scoring_days=0)
    api.jobs["spot-trainer-worker"] = {"kind": "Job", "status": {"active": 4}}
    lines = launch.run(queue, training, None, "spot-trainer-worker", load_wait_s=1.0, drain_s=1.0)
    assert lines[1] == ("the stack's training Job spot-trainer-worker still runs and takes the new work: no second "
                        "training Job")
    assert api.posts == [] and queue.launch_request() == LaunchRequest()

    queue.request_launch(added=0, scoring_days=0)  # the next load: nothing new, the stack's Job has finished
    api.jobs["spot-trainer-worker"]["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    lines = launch.run(queue, training, None, "spot-trainer-worker", load_wait_s=1.0, drain_s=1.0)
    assert lines[1] == "training Job training: created for 0 new, 2 pending item(s)"  # left by the stack's Job
    assert _posted(api) == ["training"]


def test_the_launcher_waits_for_the_load_and_then_decides_on_the_queue_alone(cluster: Cluster) -> None:
    queue = cluster.queue()
    started = time.monotonic()
    assert launch.wait_for_load(queue, 0.3, poll_s=0.05) == LaunchRequest()  # no load finished: waited it out
    assert 0.3 <= time.monotonic() - started < 2.0
    queue.request_launch(added=3, scoring_days=0)
    queue.request_launch(added=1, scoring_days=2)  # a second load before any launcher: summed, not overwritten
    started = time.monotonic()
    assert launch.wait_for_load(queue, 30.0) == LaunchRequest(loads=2, added=4, scoring_days=2)
    assert time.monotonic() - started < 1.0
    queue.launch_done(LaunchRequest(loads=1, added=3), owe_scoring=True)
    assert queue.launch_request() == LaunchRequest(loads=1, added=1, scoring_days=2, rescore=1)


@pytest.mark.parametrize(("text", "what", "error"), [
    (None, "training", "training Job template {path}: [Errno 2] No such file or directory"),
    ("{not json", "scoring", "scoring Job template {path}: Expecting property name enclosed in double quotes"),
    ("[1]", "training", "training Job template {path}: not a JSON object"),
    ('{"kind": "Pod"}', "scoring", "scoring Job template {path}: not a Job manifest (kind 'Pod')"),
    ("{}", "training", "training Job template {path}: not a Job manifest (kind None)"),
])
def test_a_broken_job_template_names_the_file(tmp_path: Path, text: str | None, what: str, error: str) -> None:
    path = tmp_path / "job.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(launch.LaunchError) as err:
        launch.read_job(path, what)
    assert str(err.value).startswith(error.format(path=path))
    if what == "training":  # the default
        with pytest.raises(launch.LaunchError, match=r"^training Job template "):
            launch.read_job(path)
    path.write_text(json.dumps(JOB))
    assert launch.read_job(path) == JOB


def test_the_scorer_waits_for_a_drained_queue_within_its_deadline(cluster: Cluster,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    cluster.seed()
    queue = cluster.queue()
    lease = queue.claim("peer", ttl_s=600)
    assert lease is not None
    pending = queue.counts().pending
    caplog.set_level(logging.INFO, logger=launch.log.name)
    started = time.monotonic()
    assert not launch.wait_drained(queue, cluster.share, 0.3, poll_s=5.0)  # waits its deadline, not a whole poll
    assert time.monotonic() - started < 2.0
    assert f"waiting for training to finish: {pending} pending, 1 leased" in caplog.messages
    assert f"queue not drained after 0s: {pending} pending, 1 leased" in caplog.messages
    queue.mark_done(plan.items(cluster.share))
    caplog.clear()
    assert not launch.wait_drained(queue, cluster.share, 0.0, poll_s=0.01)  # the leased one: still not drained
    assert caplog.messages == ["queue not drained after 0s: 0 pending, 1 leased"]
    assert queue.ack(lease)
    caplog.clear()
    assert launch.wait_drained(queue, cluster.share / "no-plan", 0.0)  # a share with no run records: Redis decides
    assert caplog.messages == []


def test_the_scorer_waits_for_the_shares_plan_not_only_for_redis(cluster: Cluster,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Redis drained is not enough: days Redis calls done that no checkpoint on the share records, a wiped
    (unseeded) Redis, and a Redis that lacks days of the share's plan each keep the scorer waiting, and its
    deadline's line says which."""
    cluster.seed()
    queue = cluster.queue()
    queue.mark_done(plan.items(cluster.share))  # "done" in Redis, nothing trained on the share
    caplog.set_level(logging.ERROR, logger=launch.log.name)
    assert not launch.wait_drained(queue, cluster.share, 0.0)
    assert caplog.messages == [
        "queue not drained after 0s: 0 pending, 0 leased, but Redis calls 6 day(s) done that their run's newest "
        "checkpoint on the share does not record (main/training/2018-04-01.parquet, main/training/2018-04-02.parquet, "
        "main/training/2018-04-03.parquet and 3 more): a worker trains them"]
    cluster.wipe_redis()
    caplog.clear()
    assert not launch.wait_drained(queue, cluster.share, 0.0)
    assert caplog.messages == ["queue not drained after 0s: 0 pending, 0 leased, but the queue is empty and unseeded "
                               "while the share records 1 run(s) (Redis lost its data?): a worker restores it from "
                               "the share"]
    queue.mark_seeded()  # seeded, but empty: a Redis from before the seed that added the run
    caplog.clear()
    assert not launch.wait_drained(queue, cluster.share, 0.0)
    assert caplog.messages[0].startswith("queue not drained after 0s: 0 pending, 0 leased, but the queue lacks 6 "
                                         "item(s) of the share's plan (main/training/2018-04-01.parquet, ")
