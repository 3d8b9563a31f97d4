"""The study figures: one line per group of seeds, seeds averaged, distinct colours, legend off the axes,
y range fitted to the data."""

from __future__ import annotations

import pytest

from mathrl.ablate.report import plot_accuracy_curves, plot_maj_pass, plot_series


def _run(name: str, group: str, method: str, after: dict, train: list, curve: list) -> dict:
    return {"name": name, "group": group, "method": method, "baseline": "b0",
            "before": {"greedy": 0.03, "pass@1": 0.04, "pass@4": 0.11, "maj@4": 0.043},
            "after": after, "train_curve": train, "curve": curve}


def _data(groups: int = 2) -> dict:
    runs = [
        _run("grpo-seed0", "grpo", "grpo", {"greedy": 0.06, "pass@1": 0.05, "pass@4": 0.14, "maj@4": 0.05},
             [[1, 0.1], [2, 0.2], [3, 0.3]], [{"step": 0, "greedy": 0.03}, {"step": 20, "greedy": 0.06}]),
        _run("grpo-seed1", "grpo", "grpo", {"greedy": 0.04, "pass@1": 0.07, "pass@4": 0.12, "maj@4": 0.07},
             [[1, 0.3], [2, 0.4]], [{"step": 0, "greedy": 0.03}, {"step": 20, "greedy": 0.08}]),
    ]
    for g in range(groups - 1):
        runs.append(_run(f"rft{g}", f"rft{g}", "rft", {"greedy": 0.05, "pass@1": 0.05, "pass@4": 0.13, "maj@4": 0.06},
                         [[1, 0.05]], [{"step": 0, "greedy": 0.03}, {"step": 20, "greedy": 0.05}]))
    return {"study": "t", "runs": runs}


def test_seeds_of_a_group_are_one_series_with_the_mean_of_the_seeds():
    series = plot_series(_data())
    assert [s["label"] for s in series] == ["grpo (mean of 2 seeds)", "rft0"]
    grpo = series[0]
    assert grpo["after"] == pytest.approx({"greedy": 0.05, "pass@1": 0.06, "pass@4": 0.13, "maj@4": 0.06})
    # per step, the mean over the seeds; a step that only one seed has (step 3) is not drawn
    assert [s for s, _ in grpo["train_curve"]] == [1, 2]
    assert [v for _, v in grpo["train_curve"]] == pytest.approx([0.2, 0.3])
    assert [s for s, _ in grpo["curve"]] == [0, 20]
    assert [v for _, v in grpo["curve"]] == pytest.approx([0.03, 0.07])
    assert series[1]["after"]["greedy"] == pytest.approx(0.05) and series[1]["method"] == "rft"


def test_a_run_without_a_group_is_its_own_series():
    data = _data()
    for r in data["runs"]:
        del r["group"]
    assert [s["label"] for s in plot_series(data)] == ["grpo-seed0", "grpo-seed1", "rft0"]


@pytest.mark.parametrize("groups", [3, 10, 11, 16, 20])
def test_every_series_has_its_own_colour_up_to_twenty(groups):
    from matplotlib.colors import to_hex

    colours = [to_hex(s["color"]) for s in plot_series(_data(groups))]
    assert len(colours) == groups and len(set(colours)) == groups


def test_figures_put_the_legend_outside_the_axes(tmp_path, monkeypatch):
    from mathrl.eval.report import pyplot

    plt = pyplot()
    seen, tops = [], []
    save = plt.Figure.savefig

    def record(fig, *a, **kw):
        axes_box = fig.axes[0].get_window_extent().union([ax.get_window_extent() for ax in fig.axes])
        legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        seen.append([(axes_box, leg.get_window_extent()) for leg in legends])
        tops.append(max(ax.get_ylim()[1] for ax in fig.axes))
        return save(fig, *a, **kw)

    monkeypatch.setattr(plt.Figure, "savefig", record)
    data = _data(12)
    for plot, name in ((plot_maj_pass, "mp.png"), (plot_accuracy_curves, "acc.png")):
        assert plot(data, tmp_path / name).stat().st_size > 0
    assert len(seen) == 2
    for figure in seen:
        assert len(figure) == 1  # one legend per figure
        (axes_box, legend_box), = figure
        assert legend_box.x0 >= axes_box.x1  # right of every axes: it covers no line
    # accuracies of a few percent (at most 30% here) are not drawn on a 0-100 axis
    assert max(tops) < 35
