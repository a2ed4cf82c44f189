"""Shared fixtures for the infra tests: each (stack, overrides) is rendered under mocks once."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.render import Rendered, render

_CACHE: dict[tuple[str, str], Rendered] = {}


@pytest.fixture
def rendered() -> Callable[..., Rendered]:
    """``rendered("dev", clusterMode="standard")``: the program's resources for that stack and config."""

    def get(stack: str, **overrides: Any) -> Rendered:
        key = (stack, json.dumps(overrides, sort_keys=True))
        if key not in _CACHE:
            _CACHE[key] = render(stack, overrides)
        return _CACHE[key]

    return get
