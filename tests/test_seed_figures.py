"""Training curves of a several-seed study: the across-seed mean with the seeds' range as a band
(stapo.report.figures.across_seeds), per optimiser step in the paper's rollout-step unit."""

from __future__ import annotations

import pytest

from stapo.report.figures import across_seeds, draw_figure, figure_series


def _rows(entropies, silenced=None):
    return [{"step": i + 1, "entropy_mean": h, "silenced_fraction": (silenced or [0.0] * len(entropies))[i]}
            for i, h in enumerate(entropies)]


METRICS = {("m", "stapo/seed0"): _rows([1.0, 2.0, 3.0], [0.0, 1e-3, 2e-3]),
           ("m", "stapo/seed1"): _rows([2.0, 2.0, 5.0], [0.0, 3e-3, 0.0]),
           ("m", "stapo/seed2"): _rows([3.0, 5.0], [0.0, 2e-3]),          # killed after step 2
           ("m", "justrl"): _rows([4.0, 4.0, 4.0]),                       # a one-seed run of another method
           ("other", "stapo/seed0"): _rows([9.0, 9.0, 9.0])}


def test_mean_and_range_over_the_steps_every_seed_logged():
    runs = [METRICS[("m", f"stapo/seed{k}")] for k in range(3)]
    xs, mean, lo, hi = across_seeds(runs, "entropy_mean")
    assert xs == [1, 2]  # seed 2 stopped at step 2
    assert mean == pytest.approx([2.0, 3.0]) and lo == [1.0, 2.0] and hi == [3.0, 5.0]


def test_entropy_figure_draws_the_seed_mean_with_a_band():
    panel = figure_series("entropy", "m", [], METRICS, ["justrl", "stapo"])
    stapo, justrl = panel.of("stapo"), panel.of("justrl")
    assert stapo.steps == (1, 2) and stapo.values == pytest.approx((2.0, 3.0))
    assert stapo.lo == (1.0, 2.0) and stapo.hi == (3.0, 5.0)
    assert justrl.values == (4.0, 4.0, 4.0) and justrl.lo == () and justrl.hi == ()  # one seed: no band
    assert figure_series("entropy", "other", [], METRICS, ["stapo"]).of("stapo").values == (9.0, 9.0, 9.0)


def test_silenced_figure_keeps_the_steps_whose_mean_is_positive():
    s = figure_series("silenced", "m", [], METRICS, ["stapo"]).of("stapo")
    assert s.steps == (2,) and s.values == pytest.approx((2e-3,)) and s.lo == (1e-3,) and s.hi == (3e-3,)


def test_band_is_drawn(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    fig = draw_figure("entropy", "m", [], METRICS, ["justrl", "stapo"])
    bands = [c for c in fig.axes[0].collections if c.__class__.__name__ == "FillBetweenPolyCollection"]
    assert len(bands) == 1  # stapo's three seeds; justrl's one run has none


def test_accuracy_curve_of_several_seeds_maps_checkpoints_through_a_seeds_metrics_with_the_ci_band():
    from stapo.report.table import Score

    def score(method, ckpt, acc, lo, hi, n_seeds):
        return Score("m", method, ckpt, "arith", "t1.0_p1.0", acc, lo, hi, n_seeds=n_seeds)

    scores = [score("base", "base", 30.0, 20.0, 40.0, 1),
              score("stapo", "checkpoint-2", 50.0, 41.0, 58.0, 3),   # the across-seed cells (stapo.report.table)
              score("stapo", "final", 60.0, 52.0, 67.0, 3)]
    s = figure_series("accuracy", "m", scores, METRICS, ["stapo"]).of("stapo", "t1.0_p1.0")
    assert s.steps == (0, 2, 3)  # checkpoint-2 is step 2 of seed 0's metrics; final its last step
    assert s.values == (30.0, 50.0, 60.0) and s.lo == (20.0, 41.0, 52.0) and s.hi == (40.0, 58.0, 67.0)
    one_seed = figure_series("accuracy", "m", [score("base", "base", 30.0, 20.0, 40.0, 1),
                                               score("justrl", "final", 45.0, 35.0, 55.0, 1)], METRICS, ["justrl"])
    justrl = one_seed.of("justrl", "t1.0_p1.0")
    assert justrl.steps == (0, 3) and justrl.lo == ()  # one run: no band
