"""A command line people can learn from `--help`; `status --dir` reads a running `local`."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import ROOT, interruptible

from workload import cli


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and "-h" not in a.option_strings]


def shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_every_command_has_an_example_and_every_flag_its_default_and_env(monkeypatch) -> None:
    for var in ("SHARE_DIR", "REDIS_URL", "QUEUE_PREFIX", "MAX_ATTEMPTS", "RUNS_FILE", "DATASETS_SRC", "DATASET",
                "DATASET_PRESET", "WORKER_ID", "LEASE_TTL_SECONDS", "CHECKPOINT_INTERVAL_SECONDS", "TORCH_THREADS",
                "OUTPUT_URI"):
        monkeypatch.delenv(var, raising=False)
    assert set(commands()) >= {"seed", "worker", "status", "export", "score", "local"}
    for name, p in commands().items():
        assert re.search(rf"^example:\n  .*python -m workload {name}\b", p.epilog or ""), f"{name}: no example"
        for action in flags(p):
            where = f"{name} {action.option_strings[0]}"
            assert action.help and ("env " in action.help or "no env" in action.help), f"{where}: says no env"
            assert "default" in action.help or "required" in action.help, f"{where}: says no default"
            if action.default is not None and not action.required:
                assert f"default {shown(action.default)}" in action.help, f"{where}: help disagrees with the default"


def test_every_commands_help_keeps_its_example_on_a_line_of_its_own(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    for name, p in commands().items():
        assert re.match(r"example:\n  \S", p.epilog), name
        assert f"\n\n{p.epilog}\n" in p.format_help(), f"{name}: argparse refilled the example: {p.format_help()}"


def test_each_env_variable_named_in_a_help_text_sets_its_flag(monkeypatch) -> None:
    checked = 0
    for name, p in commands().items():
        for action in flags(p):
            var = re.search(r"\benv ([A-Z_]+)[;)]", action.help)
            if not var:
                continue
            monkeypatch.setenv(var[1], "7")
            required = {"score": ["--model", "m", "--datasets", "d"], "launch": ["--job", "j"]}.get(name, [])
            value = getattr(cli.parser().parse_args([name, *required]), action.dest)
            monkeypatch.delenv(var[1])
            assert str(value) in ("7", "7.0"), f"{name} {action.option_strings[0]}: env {var[1]} is not read"
            checked += 1
    assert checked >= 15


def test_the_share_and_redis_flags_say_where_the_password_and_the_volume_come_from(monkeypatch) -> None:
    """What `--help` prints for --redis-url and --share, read as a user reads it (argparse wraps the lines): the
    password comes from REDIS_PASSWORD only, and every variable is named as it is spelled, in capitals."""
    monkeypatch.setenv("COLUMNS", "80")
    redis_url = ("--redis-url REDIS_URL Redis URL without the password, which comes from env REDIS_PASSWORD only "
                 "(env REDIS_URL; default redis://localhost:6379/0)")
    share = "--share SHARE the shared volume: datasets/, runs/, output/ (env SHARE_DIR; default /mnt/share)"
    offered = {"--redis-url": set(), "--share": set()}
    for name, p in commands().items():
        text = " ".join(p.format_help().split())
        for flag, sentence in (("--redis-url", redis_url), ("--share", share)):
            if f"{flag} " in text:
                assert sentence in text, f"{name}: {text}"
                offered[flag].add(name)
    assert offered == {"--redis-url": {"seed", "launch", "worker", "status", "requeue", "wait-drained"},
                       "--share": {"seed", "worker", "status", "export", "wait-drained"}}


# Every text `--help` prints, as reviewed: argparse's layout changes between Python versions, so the texts are kept,
# not the rendering. After changing one on purpose: REWRITE_HELP_TEXTS=1 pytest tests/workload/test_help.py
HELP_TEXTS = Path(__file__).with_name("cli_help_texts.json")


def help_texts() -> dict[str, object]:
    top = cli.parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help for a in sub._choices_actions}  # each command's line in the top-level --help
    return {"": {"description": top.description, "epilog": top.epilog},
            **{name: {"summary": summaries.get(name), "description": p.description, "epilog": p.epilog,
                      "flags": {" ".join(a.option_strings): a.help for a in flags(p)},
                      "arguments": {a.dest: a.help for a in p._actions if not a.option_strings}}
               for name, p in commands().items()}}


def test_every_help_text_is_the_reviewed_one(monkeypatch) -> None:
    for var in ("SHARE_DIR", "REDIS_URL", "QUEUE_PREFIX", "MAX_ATTEMPTS"):  # texts never show the variables' values
        monkeypatch.setenv(var, "from-the-environment")
    texts = help_texts()
    if os.environ.get("REWRITE_HELP_TEXTS"):
        HELP_TEXTS.write_text(json.dumps(texts, indent=1, sort_keys=True) + "\n")
    assert texts == json.loads(HELP_TEXTS.read_text()), (
        f"a help text changed: if on purpose, REWRITE_HELP_TEXTS=1 rewrites {HELP_TEXTS.name}, then review its diff")


def test_every_flag_names_its_variable_as_it_is_spelled() -> None:
    for name, p in commands().items():
        for action in flags(p):
            named = re.findall(r"\benv ([A-Za-z_]+)", action.help)
            assert named or "no env" in action.help, f"{name} {action.option_strings[0]}: {action.help}"
            assert all(v.isupper() for v in named), f"{name} {action.option_strings[0]}: {action.help}"


def test_flags_that_mean_nothing_for_a_command_are_not_offered() -> None:
    offered = {name: {s for a in flags(p) for s in a.option_strings} for name, p in commands().items()}
    for name in ("seed", "status"):
        assert "--max-attempts" not in offered[name], name  # only claims and releases count attempts
    for name in ("export", "score", "local"):
        assert not {"--redis-url", "--queue-prefix", "--max-attempts"} & offered[name], name
    assert "--share" not in offered["score"] and "--share" not in offered["local"]


def test_status_dir_reads_a_running_local_without_showing_its_password(tmp_path: Path, dataset_src: Path) -> None:
    base = tmp_path / "local"
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"main": {"epochs": 400}}))
    proc = subprocess.Popen([sys.executable, "-m", "workload", "local", "--dir", str(base), "--datasets",
                             str(dataset_src), "--runs-file", str(runs), "--workers", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=interruptible)  # Ctrl-C below, whatever this test run inherited
    try:
        connection = base / "redis" / "connection.json"
        deadline = time.monotonic() + 120
        while not list((base / "share" / "output").glob("*/checkpoints/manifest-t*.json")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        assert connection.stat().st_mode & 0o777 == 0o600
        password = json.loads(connection.read_text())["password"]
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_PASSWORD", "SHARE_DIR")}
        out = subprocess.run([sys.executable, "-m", "workload", "status", "--dir", str(base)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "run main: " in out.stdout and "leased: main/training/" in out.stdout, out.stdout
        assert password not in out.stdout + out.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        log, _ = proc.communicate(timeout=60)
    assert f"queue status from another terminal: {sys.executable} -m workload status --dir {base}" in log, log
    assert password not in log
    assert not connection.exists(), "a stopped local leaves no connection file behind"
    # Ended, the folder still answers: a Redis of status's own reads its AOF, and nothing of it is left running.
    out = subprocess.run([sys.executable, "-m", "workload", "status", "--dir", str(base)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ended = f"(the `local` in {base} has ended: read from its folder)\nqueue spottrain: "
    assert out.stdout.startswith(ended), out.stdout
    assert "run main: " in out.stdout and "share vs queue" in out.stdout, out.stdout
    assert not connection.exists() and not list(base.glob("redis/*.pid"))
    out = subprocess.run([sys.executable, "-m", "workload", "status", "--dir", str(tmp_path / "never")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no `python -m workload local` ran there" in out.stderr, out.stderr


def test_every_parser_in_the_repository_refuses_abbreviations() -> None:
    """argparse takes `--dataset x` as `--datasets x` unless told not to: every parser is told, and a prefix of a
    flag is refused as an unknown option."""
    import ast

    calls = []
    for folder in ("workload", "infra", "policy", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                        "ArgumentParser", "add_parser"):
                    refused = any(k.arg == "allow_abbrev" and getattr(k.value, "value", None) is False
                                  for k in node.keywords)
                    calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", refused))
    assert len(calls) >= 10 and [where for where, refused in calls if not refused] == []
    assert all(p.allow_abbrev is False for p in [cli.parser(), *commands().values()])
    for argv in (["score", "--model", "m", "--dataset", "x"], ["local", "--dataset", "x"], ["seed", "--run-file", "f"],
                 ["worker", "--lease", "3"]):
        try:
            cli.parser().parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 2, argv
        else:
            raise AssertionError(f"{argv} was accepted")


def test_the_top_level_help_names_every_command(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = " ".join(cli.parser().format_help().split())
    description = text.split(" positional arguments:")[0]
    listed = description.split("entrypoint): ", 1)[1].rstrip(".").split(", ")
    assert sorted(listed) == sorted(commands()), description  # today's main ended "... score,"
