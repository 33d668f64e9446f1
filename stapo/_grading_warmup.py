"""Imported once by the grading forkserver (``stapo.grading._context``): grade a fixed corpus of typical answers.

math-verify parses LaTeX with an ANTLR parser whose prediction (DFA) cache, like sympy's cache, fills lazily: the
first few hundred answers a process grades cost about twice what later ones do. Every grading worker is forked
from the forkserver, so warming the forkserver once gives every worker (and every replacement of a killed one) the
warm caches; without it, each worker pays the warm-up on its own share of the answers and two workers are ~1.4x,
not ~2x, as fast as one process (benchmarks/bench_grading.py).

The corpus is generic answer shapes (integers, fractions, roots, intervals, sets, matrices, degrees, units, text,
equations, plain-text numbers), not benchmark data.
"""

from stapo.grading import grade_one

CORPUS = [
    ("19", "19"), ("-7", "-7"), ("3.5", "\\frac{7}{2}"), ("0.25", "\\frac14"), ("\\dfrac{3}{4}", "\\frac{3}{4}"),
    ("\\frac{-1}{2}", "-\\frac{1}{2}"), ("2\\sqrt{3}", "\\sqrt{12}"), ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("\\sqrt[3]{2}", "2^{1/3}"), ("3\\pi", "3\\pi"), ("\\frac{\\pi}{6}", "30^\\circ"), ("45^{\\circ}", "45"),
    ("(1, 2)", "(1,2)"), ("\\left(-\\infty, 3\\right]", "(-\\infty,3]"), ("[0, \\frac{1}{2})", "[0,0.5)"),
    ("\\{1, 2, 3\\}", "1,2,3"), ("x = 2", "2"), ("y=3x+1", "y = 1 + 3x"), ("2, -3", "-3, 2"),
    ("\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}"),
    ("\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}"),
    ("10\\%", "0.1"), ("5 \\text{ cm}", "5"), ("\\text{(B)}", "B"), ("\\text{Evelyn}", "\\text{Evelyn}"),
    ("x^2 + 2x + 1", "(x+1)^2"), ("\\log_2 8", "3"), ("\\ln 2", "\\log 2"), ("e^{-2t}", "\\exp(-2t)"),
    ("\\sin^2 x + \\cos^2 x", "1"), ("\\tan \\theta", "\\frac{\\sin\\theta}{\\cos\\theta}"), ("3 + 4i", "4i + 3"),
    ("\\binom{5}{2}", "10"), ("5!", "120"), ("1.2 \\times 10^{3}", "1200"), ("2^{10}", "1024"),
    ("\\frac{a+b}{c}", "\\frac{b+a}{c}"), ("\\frac{1}{s+1}", "\\frac{1}{1+s}"), ("k(k+1)/2", "\\frac{k^2+k}{2}"),
    ("\\infty", "\\infty"), ("\\emptyset", "\\varnothing"), ("|x - 1|", "|1 - x|"), ("\\pm 3", "3, -3"),
    ("x \\in [1, 4]", "[1,4]"), ("a_{n} = 2n - 1", "2n-1"), ("\\omega_{d}", "\\omega_d"), ("m \\ddot{x}", "m\\ddot x"),
    ("\\dfrac{1}{3} + \\dfrac{1}{6}", "\\frac12"), ("\\mathbf{v}", "\\mathbf{v}"), ("1,000", "1000"),
]


def warm_up() -> None:
    for answer, gold in CORPUS:
        grade_one(f"Reasoning. Therefore the final answer is $\\boxed{{{answer}}}$.", gold)
        grade_one(f"So the answer is {answer}.", gold)


warm_up()
