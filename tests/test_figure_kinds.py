"""stapo.report.kinds: the one figure registry (each kind declared once: series, drawing, caption, group, scope)
and its one save loop."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stapo import study as stapo_study
from stapo.report.comparison import COMPARISON_KINDS, STUDY_KINDS
from stapo.report.kinds import (FIGURES, GROUPS, FigureInputs, FigureKind, figure_groups, figure_kinds,
                                register_figure, write_figures)
from stapo.report.figures import FIGURE_KINDS, Panel, Series, draw_figure

ORDER = ["entropy", "reward", "accuracy", "silenced", "quadrants", "entropy_quantiles", "pareto", "sweep_tau_p",
         "sweep_q", "masking_accuracy", "masking_entropy", "fullmask", "spurious_ratio", "time_breakdown"]


def test_every_kind_is_declared_once_in_the_index_order():
    assert [k.key for k in figure_kinds()] == ORDER
    assert FIGURE_KINDS == tuple(ORDER[:6]) and COMPARISON_KINDS == tuple(ORDER[6:12])
    assert STUDY_KINDS == ("spurious_ratio",)
    assert [title for title, _ in figure_groups()] == list(GROUPS)
    assert [k.key for _, kinds in figure_groups()[2:4] for k in kinds] == ["sweep_tau_p", "sweep_q",
                                                                          "masking_accuracy", "masking_entropy"]
    assert all(k.caption and k.reproduces for k in figure_kinds())
    assert [FIGURES[k].stem(None if FIGURES[k].scope == "study" else "m") for k in ("pareto", "spurious_ratio")] \
        == ["m_pareto", "spurious_ratio"]


def test_the_registry_is_complete_whichever_module_is_imported_first():
    code = ("from stapo.report import cost; from stapo.report.kinds import figure_kinds; "
            "print(' '.join(k.key for k in figure_kinds()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ORDER


def test_a_kind_declared_twice_or_in_an_unknown_group_is_an_error():
    kind = FIGURES["entropy"]
    with pytest.raises(ValueError, match="'entropy' is declared twice"):
        register_figure(kind)
    with pytest.raises(ValueError, match="group 'nowhere'"):
        register_figure(FigureKind("new_kind", kind.series, kind.draw, "r", "c", "nowhere"))
    assert "new_kind" not in FIGURES


def test_the_save_loop_draws_each_model_removes_a_stale_figure_and_says_why(tmp_path):
    drawn = Panel("entropy", (Series("stapo", (1, 2), (0.5, 0.25)),), "x", "y")
    missing = Panel("demo", (), None, None, missing="nothing to show")
    kind = FigureKind("demo", lambda model, i: drawn if model == "a" else missing,
                      lambda panel, model, i: draw_figure("entropy", model, [], {}, ["stapo"], study=i.study,
                                                          panel=panel),
                      "r", "c", GROUPS[0])
    stale = tmp_path / "figures" / "b_demo.pdf"
    stale.parent.mkdir()
    stale.write_bytes(b"an earlier report's")
    inputs = FigureInputs(["a", "b"], ["stapo"], [], {}, {}, stapo_study.default())
    entries = write_figures(tmp_path, inputs, [kind])
    assert entries == [("a_demo", "demo", "a", None, []), ("b_demo", "demo", "b", "nothing to show", [])]
    assert (tmp_path / "figures" / "a_demo.png").read_bytes()[:4] == b"\x89PNG" and not stale.exists()


@pytest.mark.parametrize("methods, rotation", [(("grpo", "stapo"), 0), (("grpo", "entropy20", "justrl", "stapo"), 90)])
def test_quadrant_bars_over_few_tokens_are_hatched_and_crowded_counts_turned(methods, rotation):
    """A quadrant bar over fewer than SMALL_N tokens is hatched and pale (a mean of a handful of tokens is noise),
    the others plain; a bar's token count is its label, turned upright when 3+ methods crowd each quadrant (the
    demo's four methods printed "n=456n=471" over each other)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from stapo.report.figures import QUADRANT_LABELS, SMALL_N, _draw

    counts = (0, SMALL_N - 1, SMALL_N, 400)
    panel = Panel("quadrants", tuple(Series(m, tuple(QUADRANT_LABELS), (0.0, 0.8, 0.1, 0.2), counts=counts)
                                     for m in methods), None, "mean ‖∇‖")
    fig, ax = plt.subplots()
    _draw(ax, panel, list(methods), stapo_study.default())
    drawn = [list(c) for c in ax.containers if len(c) == 4]  # one per method; the legend's proxies are single bars
    assert len(drawn) == len(methods)
    for mine in drawn:
        assert [bool(b.get_hatch()) for b in mine] == [False, True, False, False]  # n = 0: no bar to mark
        assert [b.get_alpha() for b in mine] == [None, 0.35, None, None]
    labels = [t for t in ax.texts if t.get_text().startswith("n=")]
    assert [t.get_text() for t in labels[:4]] == ["n=0", f"n={SMALL_N - 1}", f"n={SMALL_N}", "n=400"]
    assert {t.get_rotation() for t in labels} == {rotation}
    assert f"hatched: n < {SMALL_N} tokens" in ax.get_legend_handles_labels()[1]
    plt.close(fig)
