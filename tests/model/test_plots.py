"""The run's pictures are written, as real PNGs, whatever state the run is in."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.text import Text

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
    _legend_clear_of_the_axes(metrics_fig)
    pr_text = _texts(plots._pr_figure(pr, history, "wide"))
    assert f"model after 2018-04-05: average precision {history[-1]['average_precision']:.3f}" in pr_text
    assert "random guess (base rate" in pr_text


def test_a_test_period_without_fraud_says_so() -> None:
    no_fraud = metrics.evaluate(np.array([0.2, 0.9]), np.array([0, 0]), np.array([0, 0]))
    history = [{"shard": "training/a.parquet", "first_day": "2018-04-01", **no_fraud}]
    assert "the test days hold no fraud" in _texts(plots._metrics_figure(history, "main", {}))
    assert "no precision-recall curve" in _texts(plots._pr_figure(metrics.pr_curve(np.array([0.2]), np.array([0])),
                                                                 history, "main"))


# The documented look of both pictures, read back from matplotlib's objects.

def _days(n: int, **extra: object) -> list[dict]:
    """`n` applied days with fraud on their test days, each figure distinct."""
    return [{"shard": f"training/{i}.parquet", "first_day": f"2018-04-{i + 1:02d}", "average_precision": 0.3 + i / 100,
             "roc_auc": 0.8 + i / 1000, "card_precision_top100": 0.1 + i / 100, "recall_at_1pct_fpr": 0.2 + i / 100,
             "base_rate": 0.03, "n_fraud": 12, **extra} for i in range(n)]


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from the PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _text(figure: Figure, text: str) -> Text:
    """The one text artist of `figure` that reads `text`."""
    found = [t for t in figure.findobj(Text) if t.get_text() == text]
    assert len(found) == 1, f"{text!r} found {len(found)} times"
    return found[0]


def _legend(figure: Figure):
    """The picture's legend: the figure's, under everything (None when there is none)."""
    return figure.legends[0] if figure.legends else None


def _legend_clear_of_the_axes(figure: Figure) -> None:
    """The legend lies under the axes with their tick labels and label, overlapping none of them, and inside
    the picture; the subtitle too lies inside it (a long one ran off both edges, the legend covered the x label)."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()  # place everything as the saved picture has it
    renderer = canvas.get_renderer()
    axes = figure.axes[0]
    legend, around = _legend(figure).get_window_extent(renderer), axes.get_tightbbox(renderer)
    assert legend.y1 <= around.y0 and not legend.overlaps(around), (legend, around)
    title = axes.title.get_window_extent(renderer)
    for box in (legend, title):
        assert 0 <= box.x0 and box.x1 <= figure.bbox.x1 and 0 <= box.y0 and box.y1 <= figure.bbox.y1, box
    _every_text_inside_and_the_titles_above(figure)


def _every_text_inside_and_the_titles_above(figure: Figure) -> None:
    """Every text of the saved picture (tick labels, axis labels, titles, legend entries) lies inside it, at least
    3 pixels from its edges; the subtitle lies above the axes and the title above the subtitle, none overlapping."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    inside = figure.bbox.padded(-3)
    axes = figure.axes[0]
    ticks = {*axes.get_xticklabels(), *axes.get_yticklabels()}
    texts = [t for t in figure.findobj(Text) if t.get_visible() and t.get_text() and t not in ticks]
    texts += plots._shown(axes.get_xticklabels(), axes.get_xlim(), 0)
    texts += plots._shown(axes.get_yticklabels(), axes.get_ylim(), 1)
    assert len(texts) > 10 and {t.get_text() for t in axes.get_yticklabels()} > {"0.0", "1.0"}
    for text in texts:
        box = text.get_window_extent(renderer)
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, (
            text.get_text(), box)
    subtitle = axes.title.get_window_extent(renderer)
    title = [t for t in texts if t is figure._suptitle][0].get_window_extent(renderer)  # noqa: SLF001
    assert axes.bbox.y1 < subtitle.y0 and subtitle.y1 < title.y0, (axes.bbox, subtitle, title)


def test_the_pictures_are_990_by_605_and_660_square_pixels(tmp_path: Path) -> None:
    history, pr = _history()
    metrics_png, pr_png = plots.write_plots(tmp_path, history, pr)
    assert _png_size(metrics_png) == (990, 605)  # 9 x 5.5 inches at 110 dpi
    assert _png_size(pr_png) == (660, 660)  # 6 x 6 inches at 110 dpi
    for figure in (plots._metrics_figure(history, "main", None), plots._pr_figure(pr, history, "main")):
        _every_text_inside_and_the_titles_above(figure)  # labels and legend not clipped


def test_the_metrics_picture_draws_each_figure_per_day_and_the_base_rate_dashed_grey() -> None:
    history = _days(3)
    del history[1]["card_precision_top100"]  # a day from before the field's figure existed
    del history[2]["base_rate"]
    axes = plots._metrics_figure(history, "main", None).axes[0]
    *curves, base = axes.get_lines()
    assert [line.get_label() for line in curves] == ["average precision (AUPRC)", "ROC AUC",
                                                     "card precision@100 / day", "recall at 1% FPR"]
    for line, (key, _) in zip(curves, plots.CURVES, strict=True):
        assert list(line.get_xdata()) == [0, 1, 2]
        np.testing.assert_array_equal(line.get_ydata(), [float(h.get(key, np.nan)) for h in history])
        assert (line.get_marker(), line.get_markersize(), line.get_linestyle()) == ("o", 3, "-")
    assert np.isnan(curves[2].get_ydata()[1])
    assert base.get_label() == "base rate (fraud share): a random guess's AP"
    np.testing.assert_array_equal(base.get_ydata(), [0.03, 0.03, np.nan])
    assert (base.get_linestyle(), to_hex(base.get_color()), base.get_marker()) == ("--", "#808080", "None")


@pytest.mark.parametrize(("days", "step"), [(5, 1), (12, 1), (24, 2), (37, 3)])
def test_long_runs_label_every_len_over_12th_day(days: int, step: int) -> None:
    history = _days(days)
    axes = plots._metrics_figure(history, "main", None).axes[0]
    assert list(axes.get_xticks()) == list(range(0, days, step))
    labels = axes.get_xticklabels()
    assert [t.get_text() for t in labels] == [h["first_day"] for h in history[::step]]
    for label in labels:
        assert (label.get_rotation(), label.get_ha(), label.get_fontsize()) == (45, "right", 8)


def test_the_metrics_picture_has_its_titles_labels_scale_grid_and_legend() -> None:
    figure = plots._metrics_figure(_days(5), "wide", {"lr": 0.002, "hidden": [128, 64]})
    axes = figure.axes[0]
    assert _text(figure, "Fraud detection on the test days after each training day").get_fontsize() == 11
    assert (axes.get_title(), axes.title.get_fontsize()) == ("run 'wide': hidden=[128, 64], lr=0.002", 8)
    assert axes.get_xlabel() == "model after training on day"
    assert axes.get_ylabel() == "on the held-out test days"
    assert axes.get_ylim() == (0, 1.02)
    for grid in (*axes.xaxis.get_gridlines(), *axes.yaxis.get_gridlines()):
        assert grid.get_visible() and grid.get_alpha() == 0.3
    assert list(axes.texts) == []  # no message over the curves
    legend = _legend(figure)
    assert [t.get_text() for t in legend.get_texts()] == [
        "average precision (AUPRC)", "ROC AUC", "card precision@100 / day", "recall at 1% FPR",
        "base rate (fraud share): a random guess's AP"]
    assert [t.get_fontsize() for t in legend.get_texts()] == [8] * 5
    assert not legend.get_frame_on()
    _legend_clear_of_the_axes(figure)
    columns = {round(t.get_window_extent().x0) for t in legend.get_texts()}
    assert len(columns) == 3  # five entries in three columns


def _message(axes: Axes) -> Text:
    [text] = axes.texts
    assert text.get_position() == (0.5, 0.5)
    assert (text.get_ha(), text.get_va()) == ("center", "center")
    return text


def test_the_metrics_picture_says_when_no_day_is_applied_or_no_test_day_holds_fraud() -> None:
    axes = plots._metrics_figure([], "main", None).axes[0]
    assert _message(axes).get_text() == "no training day applied yet"
    assert _message(axes).get_transform() is axes.transAxes  # the middle of the axes, whatever the data
    axes = plots._metrics_figure(_days(2, n_fraud=0), "main", None).axes[0]
    assert _message(axes).get_text() == "the test days hold no fraud: nothing to find, every figure is undefined"
    assert _message(axes).get_transform() is axes.transAxes
    some_fraud = _days(2, n_fraud=0)
    some_fraud[1]["n_fraud"] = 3
    unknown = [{k: v for k, v in day.items() if k != "n_fraud"} for day in _days(2)]  # older days: not counted
    for history in (some_fraud, unknown):
        assert list(plots._metrics_figure(history, "main", None).axes[0].texts) == []


def test_the_pr_picture_steps_through_the_newest_curve_over_the_dashed_base_rate() -> None:
    history = _days(2)
    history[-1].update(first_day="2018-04-02", last_day="2018-04-03", average_precision=0.45678, base_rate=0.03456)
    precision, recall = np.array([1.0, 0.5, 0.4]), np.array([0.2, 0.6, 1.0])
    figure = plots._pr_figure((precision, recall), history, "wide")
    axes = figure.axes[0]
    curve, base = axes.get_lines()
    assert curve.get_label() == "model after 2018-04-02..2018-04-03: average precision 0.457"
    assert curve.get_drawstyle() == "steps-post"
    np.testing.assert_array_equal(curve.get_xdata(), recall)
    np.testing.assert_array_equal(curve.get_ydata(), precision)
    assert base.get_label() == "random guess (base rate 3.46%)"
    assert list(base.get_ydata()) == [0.03456, 0.03456]
    assert (base.get_linestyle(), to_hex(base.get_color())) == ("--", "#808080")
    assert list(axes.texts) == []
    del history[-1]["average_precision"]
    [curve, _] = plots._pr_figure((precision, recall), history, "wide").axes[0].get_lines()
    assert curve.get_label() == "model after 2018-04-02..2018-04-03: average precision nan"


def test_the_pr_picture_has_its_titles_labels_scale_grid_and_legend() -> None:
    history, pr = _history()
    figure = plots._pr_figure(pr, history, "wide")
    axes = figure.axes[0]
    assert _text(figure, "Precision-recall on the test days").get_fontsize() == 11
    assert (axes.get_title(), axes.title.get_fontsize()) == ("run 'wide'", 8)
    assert axes.get_xlabel() == "recall (share of fraud found)"
    assert axes.get_ylabel() == "precision (share of flagged that is fraud)"
    assert (axes.get_xlim(), axes.get_ylim()) == ((0, 1), (0, 1.02))
    for grid in (*axes.xaxis.get_gridlines(), *axes.yaxis.get_gridlines()):
        assert grid.get_visible() and grid.get_alpha() == 0.3
    legend = _legend(figure)
    assert [t.get_fontsize() for t in legend.get_texts()] == [8, 8]
    assert not legend.get_frame_on()
    _legend_clear_of_the_axes(figure)


def test_the_pr_picture_says_why_there_is_no_curve_and_draws_the_base_rate_only_when_positive() -> None:
    no_fraud = "the test days hold no fraud:\nno precision-recall curve to draw"
    empty = (np.array([]), np.array([]))
    cases = [  # (pr, history, message, base-rate line)
        (None, [], "no model yet", None),
        (None, _days(2), "no model yet", 0.03),  # fraud on the test days, no curve handed in
        (empty, _days(1, n_fraud=3, base_rate=float("nan")), "no model yet", None),
        (empty, [{"shard": "training/old.parquet"}], "no model yet", None),  # a day from before n_fraud existed
        (empty, _days(1, n_fraud=0, base_rate=0.0), no_fraud, None),
    ]
    for pr, history, message, base_rate in cases:
        figure = plots._pr_figure(pr, history, "main")
        axes = figure.axes[0]
        assert _message(axes).get_text() == message
        if base_rate is None:
            assert axes.get_lines() == [] and _legend(figure) is None
        else:
            [line] = axes.get_lines()
            assert list(line.get_ydata()) == [base_rate, base_rate]
            assert [t.get_text() for t in _legend(figure).get_texts()] == ["random guess (base rate 3.00%)"]


@pytest.mark.parametrize(("item", "label"), [
    ({}, "?"),
    ({"shard": "training/a.parquet"}, "training/a.parquet"),
    ({"shard": "training/a.parquet", "first_day": "", "last_day": ""}, "training/a.parquet"),
    ({"shard": "s", "first_day": "2018-04-01"}, "2018-04-01"),
    ({"shard": "s", "first_day": "2018-04-01", "last_day": "2018-04-01"}, "2018-04-01"),
    ({"shard": "s", "first_day": "2018-04-01", "last_day": "2018-04-03"}, "2018-04-01..2018-04-03"),
])
def test_a_day_is_labelled_by_its_days_else_its_file(item: dict, label: str) -> None:
    assert plots.day_label(item) == label


def test_a_full_set_of_hyperparameters_and_weekly_day_labels_still_fit() -> None:
    """Every default hyperparameter in the subtitle (wrapped, inside the picture) and files of several days each
    as tick labels (the legend below them all, not over the x label): as metrics.png drew a real run's."""
    from workload.model.hparams import HParams

    history = [{**item, "last_day": f"2018-05-{i + 1:02d}"} for i, item in enumerate(_days(20))]
    figure = plots._metrics_figure(history, "main", HParams().to_dict())
    assert figure.axes[0].get_title().count("\n") >= 1
    _legend_clear_of_the_axes(figure)
    _legend_clear_of_the_axes(plots._pr_figure(_history()[1], history, "main"))


@pytest.mark.parametrize("days", [1, 6, 84])
def test_days_labelled_by_long_file_names_still_fit(days: int) -> None:
    """A bank's export whose days carry no dates of their own is labelled by its file names, ~50 characters each,
    rotated: the first ones reach left past the axes, and the picture makes room for them."""
    history = [{**item, "first_day": "", "shard": f"training/a-very-long-bank-export-file-name-{i:03d}.parquet"}
               for i, item in enumerate(_days(days))]
    figure = plots._metrics_figure(history, "a-long-run-name", {"lr": 0.002})
    assert figure.axes[0].get_xticklabels()[0].get_text() == "training/a-very-long-bank-export-file-name-000.parquet"
    _legend_clear_of_the_axes(figure)
    _legend_clear_of_the_axes(plots._pr_figure(_history()[1], history, "a-long-run-name"))


def test_day_labels_too_long_for_any_picture_are_cut_and_the_pictures_still_written(tmp_path: Path) -> None:
    """A day file's name of 200 characters needs more room than the picture has: the axes keep `MIN_AXES` of it
    each way and the label is cut at the edge, as a report must be written whatever the user named the files
    (matplotlib refuses margins that meet, and a failed report would fail the item)."""
    history = [{**item, "first_day": "", "shard": "training/" + "x" * 200 + f"-{i}.parquet"}
               for i, item in enumerate(_days(3))]
    paths = plots.write_plots(tmp_path, history, _history()[1], run="main", hparams={"lr": 0.002})
    for path in paths:
        _assert_png(path)
    box = plots._metrics_figure(history, "main", {"lr": 0.002}).axes[0].get_position()
    assert box.width >= plots.MIN_AXES - 1e-9 and box.height >= plots.MIN_AXES - 1e-9, box


def test_the_title_names_the_run_and_its_sorted_hyperparameters() -> None:
    assert plots._title("main", None) == "run 'main'"
    assert plots._title("main", {}) == "run 'main'"
    assert plots._title("wide", {"lr": 0.002, "hidden": [128, 64]}) == "run 'wide': hidden=[128, 64], lr=0.002"


def _png(figure: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buf, pil_kwargs=plots.PNG_OPTIONS)
    return buf.getvalue()


def test_write_plots_draws_the_given_run_or_its_folders_name_and_creates_the_folder(tmp_path: Path) -> None:
    history, pr = _history()
    hparams = {"lr": 0.002}
    given = plots.write_plots(tmp_path / "a", history, pr, run="wide", hparams=hparams)
    assert [p.read_bytes() for p in given] == [_png(plots._metrics_figure(history, "wide", hparams)),
                                              _png(plots._pr_figure(pr, history, "wide"))]
    nested = tmp_path / "output" / "deep" / "night"
    named = plots.write_plots(nested, history, pr)  # parents created; the run is the folder's name
    assert named[0].read_bytes() == _png(plots._metrics_figure(history, "night", None))
    assert plots.write_plots(nested, history, pr) == named  # an existing folder is fine
