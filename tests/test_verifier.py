"""stapo.eval.verifier: CompassVerifier's prompt and verdict parsing, and the correction stage inside `stapo eval`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stapo.tasks.problems import EvalProtocol

from stapo.eval.verifier import CV_PROMPT, check_verifier_config, parse_verdict, verdict_for, verifier_prompt, \
    verifier_question

TINY = "bundled:tiny-qwen3"  # a bundled random-init model stands in for CompassVerifier-3B on CPU

# Replies in the formats CompassVerifier produces (model card: a bare letter; CoT prompt: "Final Judgment:
# \boxed{X} - LABEL") and the near misses a small or confused verifier writes.
REPLIES = [
    ("A", "A"), ("B", "B"), ("C", "C"), (" A\n", "A"), ("A.", "A"), ("(B)", "B"), ("**C**", "C"),
    ("A: CORRECT", "A"), ("B: INCORRECT", "B"), ("C: INVALID", "C"),
    ("CORRECT", "A"), ("INCORRECT", "B"), ("INVALID", "C"), ("Correct", "A"), ("incorrect.", "B"),
    ("Final Judgment: \\boxed{A} - CORRECT", "A"),
    ("Analysis step by step:\n1. **Validity Check**: complete.\n2. The candidate's answer (B) 0.6875 equals 11/16.\n"
     "Final Judgment: \\boxed{A} - CORRECT", "A"),
    ("Analysis step by step: ... does not match.\n\nFinal Judgment: \\boxed{B} - INCORRECT", "B"),
    ("\\boxed{C} - INCOMPLETE", "C"), ("Final Judgment: \\boxed{ C } - REPETITIVE", "C"),
    ("B\n\nThe candidate's final answer 7 differs from 8.", "B"),
    ("Answer: B", "B"), ("Final Judgment: B", "B"),
    ("", None), ("   ", None), ("I cannot judge this.", None), ("The grading is done.", None), (None, None),
]


@pytest.mark.parametrize("reply,verdict", REPLIES)
def test_parse_verdict_real_format_replies(reply, verdict):
    assert parse_verdict(reply) == verdict


# eval.protocol justrl: JustRL's evals/grade.py (thunlp/JustRL @ cf444e9) counts a sample only when
# ``output.outputs[0].text.strip() == "A"``; every other reply is incorrect (here: B/C kept, anything else None).
JUSTRL_REPLIES = [
    ("A", "A"), (" A\n", "A"), ("\nA", "A"), ("B", "B"), ("C", "C"),
    ("A: CORRECT", None), ("CORRECT", None), ("\\boxed{A}", None), ("A.", None), ("(A)", None), ("a", None),
    ("Final Judgment: \\boxed{A} - CORRECT", None), ("B: INCORRECT", None), ("", None), (None, None),
]


@pytest.mark.parametrize("reply,verdict", JUSTRL_REPLIES)
def test_justrl_protocol_counts_only_a_bare_A(reply, verdict):
    assert verdict_for(reply, EvalProtocol.JUSTRL) == verdict


@pytest.mark.parametrize("reply,verdict", REPLIES)
def test_harness_protocol_parses_leniently(reply, verdict):
    assert verdict_for(reply, EvalProtocol.HARNESS) == verdict == parse_verdict(reply)


def test_question_given_to_the_verifier_per_protocol():
    assert verifier_question("What is 1+1?", EvalProtocol.JUSTRL) == ""  # JustRL's grade.py: df[i].get("question", "")
    assert verifier_question("What is 1+1?", EvalProtocol.HARNESS) == "What is 1+1?"
    assert "<Original Question Begin>:\n\n<Original Question End>" in verifier_prompt("", "2", "So 2.")


def test_cv_prompt_is_justrls_byte_for_byte():
    # JustRL's evals/grade.py CV_PROMPT, its opening and the lines the harness's copy must not drift from
    assert CV_PROMPT.startswith("\nPlease as a grading expert, judge whether the final answers given by the "
                                "candidates below are consistent with the standard answers, that is, whether the "
                                "candidates answered correctly. \nHere are some evaluation criteria:\n")
    assert "A: CORRECT \nB: INCORRECT\nC: INVALID\n" in CV_PROMPT
    assert CV_PROMPT.endswith("<Candidate's Answer Begin>: \n{llm_response}\n<Candidate's Answer End>\n"
                              "Judging the correctness of the candidate's answer:\n")


def test_prompt_is_compassverifiers_format_in_the_chat_template():
    from transformers import AutoTokenizer

    from stapo.models import resolve_model

    raw = verifier_prompt("What is 1+1?", "2", "So \\boxed{2}.")
    assert raw.startswith("\nPlease as a grading expert, judge whether the final answers")
    assert "5. If the prediction is given with \\boxed{}, please ignore the \\boxed{}" in raw  # braces unescaped
    assert ("<Original Question Begin>:\nWhat is 1+1?\n<Original Question End>\n<Standard Answer Begin>:\n2\n"
            "<Standard Answer End>\n<Candidate's Answer Begin>: \nSo \\boxed{2}.\n<Candidate's Answer End>\n"
            "Judging the correctness of the candidate's answer:\n") in raw
    import string

    assert {f for _, f, _, _ in string.Formatter().parse(CV_PROMPT) if f} == {"question", "gold_answer", "llm_response"}
    tok = AutoTokenizer.from_pretrained(resolve_model(TINY))  # a ChatML template, like CompassVerifier's (Qwen2.5)
    chat = verifier_prompt("What is 1+1?", "2", "So \\boxed{2}.", tok)
    assert chat.startswith("<|im_start|>user\n" + raw) or chat.startswith("<|im_start|>user\n" + raw.strip())
    assert "<|im_start|>assistant\n" in chat[len(raw):]


def test_config_check_names_the_key():
    check_verifier_config(None)
    check_verifier_config({"model": "opencompass/CompassVerifier-3B", "max_new_tokens": 8})
    with pytest.raises(ValueError, match=r"eval.verifier.prompt: unknown key"):
        check_verifier_config({"prompt": "x"})
    with pytest.raises(ValueError, match="eval.verifier.model"):
        check_verifier_config({"model": ""})
    with pytest.raises(ValueError, match="eval.verifier.max_new_tokens"):
        check_verifier_config({"max_new_tokens": "many"})
    with pytest.raises(ValueError, match="eval.verifier: expected a mapping"):
        check_verifier_config("opencompass/CompassVerifier-3B")


def _eval_with_verifier(tmp_path: Path, verifier: dict, tag: str, protocol: str = "justrl") -> tuple[dict, list[dict]]:
    from stapo.eval import evaluate
    from stapo.cli import main

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"eval": {"backend": "hf", "verifier": verifier, "protocol": protocol}}))
    out = tmp_path / tag / "aime24.jsonl"
    assert main(["eval", "--model", TINY, "--benchmark", "aime24", "--setting", "t1.0_p1.0", "--out", str(out),
                 "--recipe", str(recipe), "--samples", "2", "--limit", "2", "--max-new-tokens", "8"]) == 0
    summary = json.loads(evaluate.summary_path(out).read_text())
    return summary, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["harness", "justrl"])
def test_verifier_stage_bookkeeping(tmp_path, monkeypatch, protocol):
    """Wiring through lm-eval's HF backend with scripted verifier replies: A on problem 0's gold, "B: INCORRECT"
    otherwise (a B under harness, unparsed = incorrect under justrl); the question only under harness."""
    from lm_eval.models.huggingface import HFLM

    real = HFLM.generate_until
    seen = []
    gold = "\\boxed{204}" if protocol == "justrl" else "204"  # JustRL's gold string for aime24 problem 0 is boxed

    def replies(lm, requests, disable_tqdm=False):
        if "Please as a grading expert" not in requests[0].args[0]:
            return real(lm, requests, disable_tqdm)  # the policy's own generation
        seen.extend(r.args for r in requests)
        return ["A" if f"<Standard Answer Begin>:\n{gold}\n" in r.args[0] else "B: INCORRECT" for r in requests]

    monkeypatch.setattr(HFLM, "generate_until", replies)
    summary, records = _eval_with_verifier(tmp_path, {"model": TINY, "max_new_tokens": 4}, "scripted", protocol)
    assert len(seen) == 4 and all(kw["do_sample"] is False and kw["max_gen_toks"] == 4 for _, kw in seen)
    empty = "<Original Question Begin>:\n\n<Original Question End>"
    assert all((empty in p) == (protocol == "justrl") for p, _ in seen)
    assert any("Every morning Aya" in p for p, _ in seen) == (protocol == "harness")  # aime24 problem 0
    assert all("<Candidate's Answer Begin>: \n" + r["completion"] + "\n<Candidate's Answer End>" in p
               for (p, _), r in zip(seen, records))
    assert [r["correct"] for r in records] == [False] * 4  # a random model: the rule grader says wrong
    b = "B" if protocol == "harness" else ""
    assert [r["verifier"] for r in records] == ["A", "A", b, b]
    assert [r["correct_verified"] for r in records] == [True, True, False, False]
    assert (summary["avg_at_n"], summary["avg_at_n_corrected"]) == (0.0, 50.0)
    assert summary["generation"]["protocol"] == protocol
    verdicts = {"A": 2, "B": 2, "C": 0, "unparsed": 0} if protocol == "harness" else \
        {"A": 2, "B": 0, "C": 0, "unparsed": 2}
    assert summary["verifier"] == {"model": TINY, "protocol": protocol, "judged": 4, "flipped": 2,
                                   "verdicts": verdicts}


@pytest.mark.slow
def test_verifier_stage_runs_a_real_model_and_resumes(tmp_path, monkeypatch):
    from lm_eval.models.huggingface import HFLM

    summary, records = _eval_with_verifier(tmp_path, {"model": TINY, "max_new_tokens": 4}, "real")
    assert all(r["verifier"] in ("A", "B", "C", "") for r in records)  # judged (a random model: mostly unparsed)
    assert all(r["correct_verified"] == (r["correct"] or r["verifier"] == "A") for r in records)
    assert summary["verifier"]["judged"] == 4 and sum(summary["verifier"]["verdicts"].values()) == 4
    calls = []
    real = HFLM.generate_until
    monkeypatch.setattr(HFLM, "generate_until", lambda lm, reqs, d=False: calls.append(len(reqs)) or real(lm, reqs, d))
    again, _ = _eval_with_verifier(tmp_path, {"model": TINY, "max_new_tokens": 4}, "real")
    assert calls == [] and again["verifier"] == summary["verifier"]  # generations and verdicts both cached
