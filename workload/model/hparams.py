"""Per-run hyperparameters: plain values, validated at the boundary, importable without torch.

The same rules apply wherever a run is declared (the stack's `runs` map at `pulumi preview`, a
`--runs-file`, the queue, a checkpoint): types are strict, so `"hidden": "64"` or `"epochs": 2.7`
is refused with the key, the value and what is allowed instead of being coerced into another model.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workload.share.paths import check_name

# key -> (kind, what is allowed). "int": a whole number (not a bool, not 2.0); "number": int or float.
_RULES: dict[str, tuple[str, str]] = {
    "hidden": ("layers", "a list of layer sizes, each a whole number >= 1 ([] is logistic regression)"),
    "lr": ("number", "0 < lr < 1 (a number)"),
    "weight_decay": ("number", "a number >= 0"),
    "epochs": ("int", "a whole number >= 1"),
    "batch_size": ("int", "a whole number >= 1"),
    "pos_weight_cap": ("number", "a number >= 1"),
    "seed": ("int", "a whole number >= 0"),
    "ema_decay": ("number", "0 <= ema_decay < 1 (0: score with the raw weights)"),
    "min_steps": ("int", "a whole number >= 0 (0: every day trains `epochs` epochs)"),
    "window_days": ("int", "a whole number >= 1 (1: each day trains on its own rows only)"),
    "full_window_days": ("int", "a whole number >= 0 (0: every window trains `epochs` epochs, however many days it "
                                "holds)"),
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and v == v and abs(v) != float("inf")


@dataclass(frozen=True)
class HParams:
    """Per-run hyperparameters (a run is one model lineage)."""

    # 256-128, batches of 128, weight decay 1e-4 and fraud weighed at most 5x, with the window and full_window_days
    # below: the default measured against the tree baselines at 4 days, a week and 12 weeks (README, Model;
    # bench/quality.py).
    hidden: tuple[int, ...] = (256, 128)
    lr: float = 2e-3
    weight_decay: float = 1e-4
    epochs: int = 4
    batch_size: int = 128
    pos_weight_cap: float = 5.0  # fraud is ~0.5%: weight it up (5x ranked best; 25x overstates it more)
    seed: int = 0
    # Predictions come from an exponential moving average of the weights (decay per training step;
    # 0 scores with the raw weights): it smooths out the last batches' noise. On the handbook's
    # split it lifted average precision from 0.672 to 0.704 (docs/benchmarks.md).
    ema_decay: float = 0.999
    # A run's first days train more epochs (up to MAX_EPOCH_FACTOR x `epochs`) until the run has made
    # `min_steps` optimizer steps: a few days of data are otherwise too few steps to fit (README, Model).
    min_steps: int = 0
    # A day trains on its own rows and those of the run's `window_days - 1` newest applied days before it,
    # `epochs` times over (the normalisation statistics take each day once). Warm-started day by day alone, a
    # run forgets its first days: on 4 days or a week the model then ranked well below one fitted on all of
    # them at once (AP 0.60 against 0.68 at 4 days). A checkpoint written before the key existed trained
    # with 1, and keeps it (Trainer.from_state).
    window_days: int = 14
    # A window of up to `full_window_days` days trains `epochs` epochs; a window of L longer days trains
    # ceil(epochs * full_window_days / L), at least 1: the same rows trained per day (28 days' worth by default),
    # and each row about as many times over its life. So a run of a few days or a week trains as with a 7-day
    # window, and a longer run keeps 2 weeks in memory at 2 epochs, where 7 days x 4 epochs forgot its first
    # weeks (12-week AP 0.704, below the forest's 0.707: README, Model). 0 turns it off; a checkpoint written
    # before the key existed has 0 (Trainer.from_state).
    full_window_days: int = 7

    @classmethod
    def from_dict(cls, data: Any, where: str = "hyperparameters") -> HParams:
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected an object of hyperparameters, got {type(data).__name__} {data!r}")
        unknown = sorted(set(data) - set(_RULES))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(_RULES)}")
        for key, value in data.items():
            kind, allowed = _RULES[key]
            ok = (_is_int(value) if kind == "int" else _is_number(value) if kind == "number" else
                  isinstance(value, list | tuple) and all(_is_int(h) for h in value))
            if not ok:
                raise ValueError(f"{where}: {key}={value!r} is not allowed; must be {allowed}")
        values = {**dataclasses.asdict(cls()), **data}
        hp = cls(hidden=tuple(values["hidden"]), lr=float(values["lr"]), weight_decay=float(values["weight_decay"]),
                 epochs=values["epochs"], batch_size=values["batch_size"],
                 pos_weight_cap=float(values["pos_weight_cap"]), seed=values["seed"],
                 ema_decay=float(values["ema_decay"]), min_steps=values["min_steps"],
                 window_days=values["window_days"],
                 full_window_days=values["full_window_days"])
        checks = [("hidden", all(h >= 1 for h in hp.hidden)), ("lr", 0 < hp.lr < 1),
                  ("weight_decay", hp.weight_decay >= 0), ("epochs", hp.epochs >= 1),
                  ("batch_size", hp.batch_size >= 1), ("pos_weight_cap", hp.pos_weight_cap >= 1),
                  ("seed", 0 <= hp.seed < 2**63), ("ema_decay", 0 <= hp.ema_decay < 1),
                  ("min_steps", hp.min_steps >= 0), ("window_days", hp.window_days >= 1),
                  ("full_window_days", hp.full_window_days >= 0)]
        for key, ok in checks:
            if not ok:
                raise ValueError(f"{where}: {key}={getattr(hp, key)!r} is not allowed; must be {_RULES[key][1]}")
        return hp

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "hidden": list(self.hidden)}


def default_seed(run: str) -> int:
    """A run's seed when its spec names none: stable for the name, different between names, so the
    runs of a sweep do not share initial weights and batch order by accident."""
    return int.from_bytes(hashlib.sha256(run.encode()).digest()[:4], "little") & 0x7FFF_FFFF


def parse_runs(specs: Any, where: str) -> dict[str, HParams]:
    """A sweep: {run name: {hyperparameters}} -> {run name: HParams}, strictly.

    Run names follow the share's folder-name rule; a run without `seed` gets `default_seed(name)`;
    two runs with the same hyperparameters (seed included) would train the same model twice and
    are refused. `where` names the source in errors (a config key or a file)."""
    if not isinstance(specs, Mapping) or not specs:
        raise ValueError(f"{where}: expected a non-empty object {{run name: {{hyperparameters}}}}, got {specs!r}")
    runs: dict[str, HParams] = {}
    for name, spec in specs.items():
        check_name(name, f"{where}: run name")
        spec = {} if spec is None else spec
        if isinstance(spec, Mapping) and "seed" not in spec:
            spec = {**spec, "seed": default_seed(name)}
        runs[name] = HParams.from_dict(spec, where=f"{where}: run {name!r}")
    seen: dict[HParams, str] = {}
    for name, hp in runs.items():
        if hp in seen:
            raise ValueError(f"{where}: runs {seen[hp]!r} and {name!r} have the same hyperparameters {hp.to_dict()}; "
                             "they would train the same model twice: change one, or give it another seed")
        seen[hp] = name
    return runs
