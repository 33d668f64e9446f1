"""JustRL's rule stage (``grade_answer_verl``): the rule verdict of the paper's evaluation (``eval.protocol: justrl``).

A port, written from the source, of thunlp/JustRL @ cf444e9920b599c865ee6742c88dc162dcabcec2 ``evals/utils.py``
(itself POLARIS' / DeepScaleR's checker: Hendrycks' MATH normalisation, then a sympy comparison), kept line for line
in behaviour so that its verdicts equal JustRL's (benchmarks/bench_justrl_agreement.py checks them against the
fetched original; tests/test_justrl_grading.py pins them). Its two stages:

    mathd   ``mathd_normalize_answer`` of both strings (``\\text{}`` unwrapped, ``\\left``/``\\right``, ``\\!``,
            degrees, ``\\$``, ``\\%``, units after ``\\text{ ``, ``k = ``, ``\\frac12``, ``a/b``, spaces) and ``==``;
    sympy   ``_normalize`` (units, ``$``, ``%``, ``{}``, thousands separators, LaTeX to text by pylatexenc,
            lower case), tuples split element-wise, then equal strings, or ``sympy.simplify(gold - answer) == 0``
            (not for integers against non-integers, nor for unreduced fractions).

The answer is the content of the LAST ``\\boxed{...}`` of the whole completion (no ``\\fbox``, no ``\\boxed 5``,
an unclosed last box is no answer); a gold containing ``\\boxed`` is unboxed the same way.

Unlike the rest of this harness, JustRL's sympy stage evaluates model text (``sympy.parse_expr`` is ``eval``); this
port keeps that, as the paper's numbers depend on it. JustRL's own guard applies (``should_allow_eval``: at most two
distinct letters besides ``sqrt``/``frac``, no ``^{``, ``^(``, or towers of powers), and stapo.tasks.grading runs it
only in its worker processes, under an address-space limit and a deadline. Where JustRL writes a bare ``except:``, this
port catches ``Exception``, so that the grader's deadline (a BaseException) is never swallowed.
Dependencies as JustRL's README pins them: pylatexenc 2.10; sympy (JustRL 1.13.1; here math-verify's).
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["grade_answer_verl", "extract_answer", "last_boxed_only_string", "remove_boxed", "mathd_normalize_answer",
           "grade_answer_mathd", "grade_answer_sympy", "grade_extracted", "JUSTRL_SOURCE"]

JUSTRL_SOURCE = "thunlp/JustRL@cf444e9920b599c865ee6742c88dc162dcabcec2:evals/utils.py"


# ------------------------------------------------------------------------------------- extraction (the last box)


def last_boxed_only_string(string: str) -> str | None:
    """``\\boxed...{...}`` from the last ``\\boxed`` (else the last ``\\fbox``) to its closing brace, or None.

    JustRL counts braces from the command on (a ``}`` before the first ``{`` counts too), as this does; braces are
    found with a regular expression (C speed) instead of a character loop.
    """
    idx = string.rfind("\\boxed")
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None
    depth = 0
    for match in _BRACE.finditer(string, idx):
        depth += 1 if match.group() == "{" else -1
        if match.group() == "}" and depth == 0:
            return string[idx : match.end()]
    return None


_BRACE = re.compile(r"[{}]")


def remove_boxed(s: str | None) -> str | None:
    """The content of ``\\boxed{...}``; None for anything else (``\\fbox{}``, ``\\boxed 5``, None)."""
    left = "\\boxed{"
    if s is None or s[: len(left)] != left or not s or s[-1] != "}":
        return None
    return s[len(left) : -1]


def extract_answer(passage: str) -> str | None:
    """The last box's content, if ``passage`` contains ``\\boxed`` at all."""
    if "\\boxed" in passage:
        return remove_boxed(last_boxed_only_string(passage))
    return None


# ------------------------------------------------------------------------------ mathd (Hendrycks' normalisation)


def mathd_normalize_answer(answer: str | None) -> str | None:
    if answer is None:
        return None
    answer = answer.strip()
    try:
        m = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)  # enclosing \text{}
        if m is not None:
            answer = m.group("text").strip()
        return _strip_string(answer)
    except Exception:
        return answer


def _fix_fracs(string: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``; the input unchanged if malformed."""
    substrs = string.split("\\frac")
    new_str = substrs[0]
    for substr in substrs[1:]:
        new_str += "\\frac"
        if substr[0] == "{":  # IndexError on "\\frac" at the end: mathd_normalize_answer's except, as JustRL's
            new_str += substr
            continue
        if len(substr) < 2:
            return string
        a, b, post = substr[0], substr[1], substr[2:]
        new_str += "{" + a + "}{" + b + "}" + post if b != "{" else "{" + a + "}" + b + post
    return new_str


def _fix_a_slash_b(string: str) -> str:
    if len(string.split("/")) != 2:
        return string
    a, b = string.split("/")
    try:
        a, b = int(a), int(b)
    except ValueError:
        return string
    if string != f"{a}/{b}":
        return string
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _remove_right_units(string: str) -> str:
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        assert len(splits) == 2  # noqa: S101 - JustRL's; mathd_normalize_answer catches it (answer kept)
        return splits[0]
    return string


def _fix_sqrt(string: str) -> str:
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        # split[0] raises IndexError on "\\sqrt" at the end, caught by mathd_normalize_answer, as JustRL's
        new_string += "\\sqrt{" + split[0] + "}" + split[1:] if split[0] != "{" else "\\sqrt" + split
    return new_string


def _strip_string(string: str) -> str:
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
                     ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        string = string.replace(old, new)
    string = _remove_right_units(string)
    string = string.replace("\\%", "")
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:  # "k = 3" -> "3"
        string = string.split("=")[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def grade_answer_mathd(given_answer: str | None, ground_truth: str | None) -> bool:
    return mathd_normalize_answer(ground_truth) == mathd_normalize_answer(given_answer)


# ------------------------------------------------------------------------------------------ sympy (DeepScaleR's)

BAD_SUBSTRINGS = ["^{", "^("]  # sympy might hang on these: not lenient there
BAD_REGEXES = [r"\^[0-9]+\^", r"\^[0-9][0-9]+"]
TUPLE_CHARS = "()[]"
_UNITS = ["degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year",
          "foot", "feet", "inch", "yard"]
_UNIT_RES = [re.compile(rf"{unit}(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS]


def _sympy_parse(expr: str):
    """``sympy.parse_expr`` with implicit multiplication (an ``eval``: see the module docstring)."""
    from sympy.parsing import sympy_parser

    return sympy_parser.parse_expr(
        expr.replace("^", "**"),
        transformations=sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,))


@lru_cache(maxsize=1)
def _latex_to_text():
    """One pylatexenc converter (JustRL builds one per call; it keeps no state between calls).

    ImportError without pylatexenc: :func:`grade_extracted` calls this first, outside any ``except``, since
    JustRL's ``except:`` around its use would otherwise turn a missing package into silently different verdicts.
    """
    try:
        from pylatexenc import latex2text
    except ImportError as err:
        raise ImportError("eval.protocol justrl's rule stage needs pylatexenc 2.10 (pyproject.toml; make install)") \
            from err
    return latex2text.LatexNodes2Text()


def _parse_latex(expr: str) -> str:
    """LaTeX to a string sympy can read (pylatexenc's latex2text)."""
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = _latex_to_text().latex_to_text(expr)
    for old, new in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        expr = expr.replace(old, new)
    return expr.strip()


def _is_float(num: str) -> bool:
    try:
        float(num)
        return True
    except ValueError:
        return False


def _is_int(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except Exception:
        return False


def _is_frac(expr: str) -> bool:
    return bool(re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", expr))


def _str_is_int(x: str) -> bool:
    try:
        x = float(_strip_properly_formatted_commas(x))
        return abs(x - int(round(x))) <= 1e-7
    except Exception:
        return False


def _str_to_int(x: str) -> int:
    return int(float(x.replace(",", "")))


def _inject_implicit_mixed_number(step: str) -> str:
    """``7 3/4`` -> ``7+3/4``."""
    return re.sub(r"([0-9]) +([0-9])", r"\1+\2", step)


def _strip_properly_formatted_commas(expr: str) -> str:
    """``1,234`` -> ``1234``, leaving tuple commas."""
    pattern = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
    while True:
        next_expr = pattern.sub(r"\1\3\4", expr)
        if next_expr == expr:
            return next_expr
        expr = next_expr


@lru_cache(maxsize=4096)
def _normalize(expr: str | None) -> str | None:
    """DeepScaleR's normalisation before the sympy comparison (a pure function: cached, golds repeat N times)."""
    if expr is None:
        return None
    m = re.search(r"^\\text\{(?P<text>.+?)\}$", expr)
    if m is not None:
        expr = m.group("text")
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "), (" and ", " , "),
                     ("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        expr = expr.replace(old, new)
    for unit in _UNIT_RES:
        expr = unit.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if len(expr) > 0 and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_int(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        try:
            expr = _parse_latex(expr)
        except Exception:
            pass
    expr = re.sub("- *", "-", expr)  # mixed numbers and negative signs
    expr = _inject_implicit_mixed_number(expr)
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(_str_to_int(expr))
    return expr


def count_unknown_letters_in_expr(expr: str) -> int:
    expr = expr.replace("sqrt", "").replace("frac", "")
    return len({x for x in expr if x.isalpha()})


def should_allow_eval(expr: str) -> bool:
    """JustRL's guard before sympy: no unknown text, no functions of more than two variables, no power towers."""
    if count_unknown_letters_in_expr(expr) > 2:
        return False
    if any(bad in expr for bad in BAD_SUBSTRINGS):
        return False
    return not any(re.search(bad, expr) is not None for bad in BAD_REGEXES)


def are_equal_under_sympy(ground_truth_normalized: str, given_normalized: str) -> bool:
    import sympy

    try:
        expr = f"({ground_truth_normalized})-({given_normalized})"
        if should_allow_eval(expr) and sympy.simplify(_sympy_parse(expr)) == 0:
            return True
    except Exception:
        pass
    return False


def split_tuple(expr: str) -> list[str]:
    """The elements of a tuple or interval (thousands separators are not element separators)."""
    expr = _strip_properly_formatted_commas(expr)
    if len(expr) == 0:
        return []
    if len(expr) > 2 and expr[0] in TUPLE_CHARS and expr[-1] in TUPLE_CHARS and \
            all(ch not in expr[1:-1] for ch in TUPLE_CHARS):
        return [elem.strip() for elem in expr[1:-1].split(",")]
    return [expr]


def grade_answer_sympy(given_answer: str, ground_truth: str | None) -> bool:
    ground_truth_normalized = _normalize(ground_truth)
    given_normalized = _normalize(given_answer)
    if ground_truth_normalized is None:
        return False
    if ground_truth_normalized == given_normalized:
        return True
    if len(given_normalized) == 0:
        return False
    ground_truth_elems = split_tuple(ground_truth_normalized)
    given_elems = split_tuple(given_normalized)
    if len(ground_truth_elems) > 1 and (ground_truth_normalized[0] != given_normalized[0]
                                        or ground_truth_normalized[-1] != given_normalized[-1]):
        return False  # an interval's brackets must match
    if len(ground_truth_elems) != len(given_elems):
        return False
    for ground_truth_elem, given_elem in zip(ground_truth_elems, given_elems):
        if _is_frac(ground_truth_elem) and _is_frac(given_elem):
            is_correct = ground_truth_elem == given_elem  # unreduced fractions are not simplified
        elif _str_is_int(ground_truth_elem) != _str_is_int(given_elem):
            is_correct = False  # an integer gold needs a strict match
        else:
            is_correct = are_equal_under_sympy(ground_truth_elem, given_elem)
        if not is_correct:
            return False
    return True


# ----------------------------------------------------------------------------------------------- the verdict


def grade_answer_verl(solution_str: str, ground_truth: str) -> bool:
    """JustRL's rule verdict of one completion against its gold (``evals/grade.py`` calls this per response)."""
    return grade_extracted(extract_answer(solution_str), ground_truth)


def grade_extracted(given_answer: str | None, ground_truth: str) -> bool:
    """``grade_answer_verl`` on an answer already extracted by :func:`extract_answer` (what a grading worker runs:
    the parent extracts, so only the box crosses the pipe)."""
    _latex_to_text()  # ImportError here, not a silently different verdict, without pylatexenc
    if not ground_truth:
        return False
    if "\\boxed" in ground_truth:
        ground_truth = extract_answer(ground_truth)
    if given_answer is None:
        return False
    return grade_answer_mathd(given_answer, ground_truth) or grade_answer_sympy(given_answer, ground_truth)
