"""`make render|diff STACK=dev ARGS='key=value ...'`: a value is read as YAML where it is YAML (runs, numbers), and
is the string it is otherwise, whatever it starts with, as `pulumi config set` stores it (a '%' gave a 20-line
YAML traceback)."""

from __future__ import annotations

import pytest

from infra import render


@pytest.mark.parametrize("value", ["%d/%m/%Y %H:%M", "%Y-%m-%d", "@daily", "*x", "!tag 1", "`cmd`"])
def test_a_value_that_is_not_yaml_is_its_own_string(value: str) -> None:
    assert render.parse_overrides([f"datasetDatetimeFormat={value}"]) == {"datasetDatetimeFormat": value}


def test_yaml_values_keep_their_shape() -> None:
    assert render.parse_overrides(["runs={main: {}}", "parallelism=3", "zone=us-central1-b"]) == {
        "runs": {"main": {}}, "parallelism": 3, "zone": "us-central1-b"}


def test_make_render_takes_a_format_starting_with_percent(tmp_path, capsys) -> None:
    from policy import offline

    assert offline.main(["staging", "--out", str(tmp_path), "datasetDatetimeFormat=%d/%m/%Y %H:%M"]) == 0
    assert "staging:" in capsys.readouterr().out
