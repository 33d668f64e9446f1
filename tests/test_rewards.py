"""Rewards: the paper's DAPO strict verifier (JustRL compute_score, ±1), its lenient
variant and math-verify (±1 / 1-0), including calls from a worker thread, where SIGALRM timeouts cannot work."""

from __future__ import annotations

import threading

import pytest

from stapo.tasks.rewards import DAPO_TAIL_CHARS, REWARDS, dapo_lenient, dapo_strict, math_verify, math_verify_01


# JustRL train/verl/utils/reward_score/math_dapo.py, compute_score(strict_box_verify=True), gold "18" / "1000"
STRICT_CASES = [
    (r"so \boxed{18}", "18", 1.0),
    (r"\boxed{18}" + " and that is the final answer, checked twice over by substitution into both equations." * 2,
     "18", -1.0),                                            # > 100 characters after the box: outside the window
    (r"\boxed{18}" + "." * 80, "18", 1.0),                    # box ends within the last 100 characters
    (r"\boxed{18.}", "18", -1.0),                             # no normalisation: a trailing period is wrong
    (r"\boxed{ 18 }", "18", -1.0),                            # nor spaces
    (r"\boxed{$18$}", "18", -1.0),                            # nor dollar signs
    (r"$\boxed{18}$", "18", 1.0),                             # math mode around the box is fine
    (r"\boxed{1,000}", "1000", -1.0),                         # nor thousands separators
    (r"\boxed{30^\circ}", "30", -1.0),                        # nor degree signs
    (r"\fbox{18}", "18", -1.0),                               # only \boxed{ counts
    (r"\boxed 18", "18", -1.0),                               # no space form
    ("The answer is 18.", "18", -1.0),                        # no box
    (r"\boxed{18} no wait \boxed{19}", "18", -1.0),           # the last box counts
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),             # nested braces are matched
    (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", -1.0),           # dfrac is not frac
    (r"\boxed{18", "18", -1.0),                               # unclosed box
]


@pytest.mark.parametrize("completion, gold, expected", STRICT_CASES)
def test_dapo_strict_is_justrl_compute_score(completion, gold, expected):
    assert dapo_strict(prompts=None, completions=[completion], answer=[gold]) == [expected]


def test_dapo_strict_searches_the_last_100_of_the_last_300_characters():
    box = r"\boxed{42}"
    assert dapo_strict(completions=["x" * 500 + box + "y" * (100 - len(box))], answer=["42"]) == [1.0]
    assert dapo_strict(completions=["x" * 500 + box + "y" * (101 - len(box))], answer=["42"]) == [-1.0]


def test_dapo_lenient_known_strings():
    filler = "x" * DAPO_TAIL_CHARS
    completions = [
        r"Adding gives \boxed{42}.",                  # correct
        r"\boxed{41}",                                # wrong value
        "The answer is 42.",                          # no box: −1 even though the number is right
        r"\boxed{42}" + filler,                       # box before the last 300 characters: −1
        filler + r"\boxed{42}",                       # box inside the last 300 characters: +1
        r"\boxed{42} hmm, no: \boxed{43}",            # the LAST box counts
        r"\boxed{1,000}",                             # light normalisation against gold "1000"
        r"\boxed{\dfrac{1}{2}}",                      # dfrac == frac, but 0.5 would not be (string match)
        r"\boxed{0.5}",
    ]
    gold = ["42", "42", "42", "42", "42", "42", "1000", r"\frac{1}{2}", r"\frac{1}{2}"]
    assert dapo_lenient(prompts=None, completions=completions, answer=gold) == [1, -1, -1, -1, 1, -1, 1, 1, -1]


def test_dapo_strict_conversational_completions():
    completions = [[{"role": "assistant", "content": r"\boxed{7}"}], [{"role": "assistant", "content": "7"}]]
    assert dapo_strict(completions=completions, answer=["7", "7"]) == [1.0, -1.0]


def test_math_verify_values_and_equivalence():
    completions = [r"\boxed{\frac{1}{2}}", r"so it is \boxed{0.5}", r"\boxed{3}", "the sum is 16", "no answer"]
    gold = ["0.5", r"\frac{1}{2}", "4", "16", "2"]
    assert math_verify(completions=completions, answer=gold) == [1.0, 1.0, -1.0, 1.0, -1.0]
    assert math_verify_01(completions=completions, answer=gold) == [1.0, 1.0, 0.0, 1.0, 0.0]


def test_math_verify_is_safe_in_a_worker_thread():
    """TRL/Snakemake may call rewards off the main thread; math-verify's SIGALRM would raise there."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(r=math_verify(completions=[r"\boxed{2/4}", r"\boxed{3}"],
                                                                      answer=["1/2", "4"])))
    thread.start()
    thread.join(timeout=120)
    assert out["r"] == [1.0, -1.0]


def test_reward_registry_names_the_key():
    from stapo.study import train_settings

    assert REWARDS["dapo_strict"] is dapo_strict
    with pytest.raises(ValueError, match="train.reward: unknown reward 'exact'"):
        train_settings({"reward": "exact"})
    with pytest.raises(ValueError, match="answer"):
        dapo_strict(completions=["x"])


def test_math_verify_never_executes_model_text(tmp_path):
    marker = tmp_path / "pwned"
    evil = f"__import__('os').system('touch {marker}')"
    assert math_verify(completions=[evil, f"x = {evil}"], answer=["x", "x"]) == [-1.0, -1.0]
    assert not marker.exists()
