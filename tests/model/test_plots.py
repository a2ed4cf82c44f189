"""The run's pictures are written, as real PNGs, whatever state the run is in."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workload.model import metrics, plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _history() -> tuple[list[dict], tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    labels = (rng.random(2000) < 0.05).astype(float)
    days = np.repeat(np.arange(4), 500)
    history = []
    for i in range(5):
        scores = rng.random(2000) + labels * i * 0.3
        history.append({"shard": f"2018-04-0{i + 1}", **metrics.evaluate(scores, labels, days)})
    return history, metrics.pr_curve(scores, labels)


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG"
    assert len(data) > 10_000, f"{path.name} is only {len(data)} bytes"


def test_write_plots_makes_both_pictures(tmp_path: Path) -> None:
    history, pr = _history()
    paths = plots.write_plots(tmp_path / "run", history, pr)
    assert [p.name for p in paths] == ["metrics.png", "pr_curve.png"]
    for path in paths:
        _assert_png(path)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["metrics.png", "pr_curve.png"]


def test_refreshing_replaces_the_pictures(tmp_path: Path) -> None:
    history, pr = _history()
    first = [p.read_bytes() for p in plots.write_plots(tmp_path, history[:2], pr)]
    second = [p.read_bytes() for p in plots.write_plots(tmp_path, history, pr)]
    assert first[0] != second[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.png", "pr_curve.png"], "temp files left"


def test_empty_and_degenerate_runs_still_plot(tmp_path: Path) -> None:
    for path in plots.write_plots(tmp_path / "empty", [], None):
        assert path.read_bytes()[:8] == PNG_SIGNATURE
    no_fraud = metrics.evaluate(np.array([0.2, 0.9]), np.array([0, 0]), np.array([0, 0]))
    history = [{"shard": "2018-04-01", **no_fraud}]
    undefined_curve = metrics.pr_curve(np.array([0.2]), np.array([0]))
    for path in plots.write_plots(tmp_path / "nan", history, undefined_curve):
        assert path.read_bytes()[:8] == PNG_SIGNATURE


def _texts(figure) -> str:
    return "\n".join(t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text")))


def test_pictures_name_days_the_run_its_hyperparameters_and_the_models_ap() -> None:
    history, pr = _history()
    for i, item in enumerate(history):
        item.update(shard=f"training/file-{i}.parquet", first_day=f"2018-04-0{i + 1}", last_day=f"2018-04-0{i + 1}")
    metrics_fig = plots._metrics_figure(history, "wide", {"hidden": [128, 64], "lr": 0.002})
    ticks = [t.get_text() for t in metrics_fig.axes[0].get_xticklabels()]
    assert ticks == [f"2018-04-0{i + 1}" for i in range(5)]  # dates, not file names
    text = _texts(metrics_fig)
    assert "run 'wide': hidden=[128, 64], lr=0.002" in text
    legend = metrics_fig.axes[0].get_legend()
    assert legend is not None and legend.get_bbox_to_anchor().y0 < metrics_fig.axes[0].bbox.y0  # below the axes
    pr_text = _texts(plots._pr_figure(pr, history, "wide"))
    assert f"model after 2018-04-05: average precision {history[-1]['average_precision']:.3f}" in pr_text
    assert "random guess (base rate" in pr_text


def test_a_test_period_without_fraud_says_so() -> None:
    no_fraud = metrics.evaluate(np.array([0.2, 0.9]), np.array([0, 0]), np.array([0, 0]))
    history = [{"shard": "training/a.parquet", "first_day": "2018-04-01", **no_fraud}]
    assert "the test days hold no fraud" in _texts(plots._metrics_figure(history, "main", {}))
    assert "no precision-recall curve" in _texts(plots._pr_figure(metrics.pr_curve(np.array([0.2]), np.array([0])),
                                                                 history, "main"))
