"""Shared fixtures for the infra tests: each (stack, overrides) is rendered under mocks once."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
from typing import Any

import pulumi_gcp as gcp
import pulumi_kubernetes as k8s
import pytest

from infra.render import Rendered, render

# The SDKs import their submodules lazily, on first use: pulumi_gcp.compute alone is seconds of class
# building. Loaded here, when the tests are collected, so a process forked after collection (mutmut's
# forkserver runs every mutant in one; pytest-xdist workers collect too) does not pay for it again in
# its first render. Only modules are loaded: nothing the program computes is kept across tests.
_SDK_MODULES = (
    gcp.artifactregistry.Repository, gcp.compute.Network, gcp.container.Cluster, gcp.filestore.Instance,
    gcp.projects.Service, gcp.serviceaccount.Account, gcp.storage.BucketIAMMember, gcp.organizations,
    k8s.apiextensions.CustomResource, k8s.apps.v1.Deployment, k8s.batch.v1.Job, k8s.core.v1.Secret,
    k8s.networking.v1.NetworkPolicy,
)  # fmt: skip

# ...and moved out of the garbage collector's sight: pytest collects garbage several times as a session
# ends (unraisableexception's gc_collect_harder), and walking the SDKs' tens of thousands of classes cost a
# mutant's test process more than its test. They live as long as the process anyway.
gc.freeze()

_CACHE: dict[tuple[str, str], Rendered] = {}


@pytest.fixture
def rendered() -> Callable[..., Rendered]:
    """``rendered("dev", clusterMode="standard")``: the program's resources for that stack and config.

    Not cached under mutmut (MUTANT_UNDER_TEST): it maps each test to the functions the test called, and a test
    served from the cache would call none, so it would never run against the program's mutants (bench/mutation.py).
    """

    def get(stack: str, **overrides: Any) -> Rendered:
        key = (stack, json.dumps(overrides, sort_keys=True))
        if os.environ.get("MUTANT_UNDER_TEST"):
            return render(stack, overrides)
        if key not in _CACHE:
            _CACHE[key] = render(stack, overrides)
        return _CACHE[key]

    return get
