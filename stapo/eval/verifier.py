"""LLM-verifier correction of the rule grader (the paper's protocol, after JustRL): CompassVerifier re-judges the
completions that the rule-based grader marked wrong.

Recipe: ``eval.verifier: {model: opencompass/CompassVerifier-3B}`` (any model id / path / ``bundled:`` spec; keys in
``VERIFIER_KEYS``). The verifier runs through the same lm-eval backend as generation (``vllm`` on GPU, ``hf`` on
CPU), greedy, with the generation cache (its keys hold the verifier's fingerprint, so verdicts resume too).

Prompt and verdicts follow CompassVerifier's model card / repository (open-compass/CompassVerifier, README and
``src/prompts.py`` ``CV_PROMPT``, commit c5d6700): the prompt below as the user turn of the verifier's chat
template, the question, the gold answer and the candidate's whole response filled in; the reply is one letter,
A = CORRECT, B = INCORRECT, C = INVALID (truncated, repetitive, refusal), and the card says to treat B and C as
incorrect. A sample is correct after correction iff the rule grader or the verifier (A) says so: the verifier only
adds answers the rules missed (equivalent forms, units, text answers), as in the paper's "rule-based grading
corrected by CompassVerifier".

``eval.protocol`` (stapo.study.evaluation) picks the verifier's inputs and verdict parsing:
``justrl`` (the paper's, as JustRL's ``evals/grade.py``, thunlp/JustRL @ cf444e9): the question is EMPTY (grade.py
fills ``{question}`` from a ``question`` field its generation jsonl never has, so ``""``), and a sample counts only
when the stripped reply is exactly ``A`` (``model_score = "A" == judgement``; anything else, ``A: CORRECT``
included, is incorrect); ``harness``: the problem is given and :func:`parse_verdict` reads the reply leniently.
Both use the same CV_PROMPT (JustRL's copy is byte-identical) and the verifier's chat template with the generation
prompt, greedy.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter

from stapo.eval.generation import CHUNK_REQUESTS, ResumableLM, build_lm, generation_identity, with_stop_tokens
from stapo.models import resolve_model
from stapo.study.evaluation import VERIFIER_DEFAULTS, VERIFIER_KEYS, check_verifier_config
from stapo.tasks.problems import EvalProtocol
from stapo.tasks.registry import _tokenizer

__all__ = ["CV_PROMPT", "VERIFIER_DEFAULTS", "VERIFIER_KEYS", "check_verifier_config", "parse_verdict",
           "verdict_for", "verifier_question", "verifier_prompt", "apply_verifier"]

log = logging.getLogger("stapo.eval.verifier")

# CompassVerifier's non-CoT prompt (the format the model was trained on), kept byte for byte: the trailing spaces
# after "standard answers, that is, whether the candidates answered correctly." and "A: CORRECT" are part of it.
CV_PROMPT = (
    "\nPlease as a grading expert, judge whether the final answers given by the candidates below are consistent "
    "with the standard answers, that is, whether the candidates answered correctly. \n"
    "Here are some evaluation criteria:\n"
    "1. Please refer to the given standard answer. You don't need to re-generate the answer to the question because "
    "the standard answer has been given. You only need to judge whether the candidate's answer is consistent with "
    "the standard answer according to the form of the question. THE STANDARD ANSWER IS ALWAYS CORRECT AND THE "
    "QUESTION IS PERFECTLY VALID. NEVER QUESTION THEM.\n"
    "2. ONLY compare the FINAL ANSWER - COMPLETELY IGNORE any potential errors in the REASONING PROCESSES.\n"
    "3. Some answers may be expressed in different ways, such as some answers may be a mathematical expression, "
    "some answers may be a textual description, as long as the meaning expressed is the same. Before making a "
    "judgment, please understand the question and the standard answer first, and then judge whether the "
    "candidate's answer is correct.\n"
    "4. Some answers may consist of multiple items, such as multiple-choice questions, multiple-select questions, "
    "fill-in-the-blank questions, etc. Regardless of the question type, the final answer will be considered correct "
    "as long as it matches the standard answer, regardless of whether the reasoning process is correct. For "
    "multiple-select questions and multi-blank fill-in-the-blank questions, all corresponding options or blanks "
    "must be answered correctly and match the standard answer exactly to be deemed correct.\n"
    "5. If the prediction is given with \\boxed{{}}, please ignore the \\boxed{{}} and only judge whether the "
    "candidate's answer is consistent with the standard answer.\n"
    "6. If the candidate's answer is invalid (e.g., incomplete (cut off mid-response), lots of unnormal repetitive "
    "content, or irrelevant to the question, saying it can't answer the question because some irresistible "
    "factors, like ethical issues, no enough information, etc.), select option C (INVALID).Please judge whether "
    "the following answers are consistent with the standard answer based on the above criteria. Grade the "
    "predicted answer of this new question as one of:\n"
    "A: CORRECT \n"
    "B: INCORRECT\n"
    "C: INVALID\n"
    "Just return the letters \"A\", \"B\", or \"C\", with no text around it.\n"
    "Here is your task. Simply reply with either CORRECT, INCORRECT, or INVALID. Don't apologize or correct "
    "yourself if there was a mistake; we are just trying to grade the answer.\n"
    "<Original Question Begin>:\n{question}\n<Original Question End>\n"
    "<Standard Answer Begin>:\n{gold_answer}\n<Standard Answer End>\n"
    "<Candidate's Answer Begin>: \n{llm_response}\n<Candidate's Answer End>\n"
    "Judging the correctness of the candidate's answer:\n"
)

VERDICTS = ("A", "B", "C")
_WORDS = {"CORRECT": "A", "INCORRECT": "B", "INVALID": "C"}


def parse_verdict(reply: str) -> str | None:
    """"A" / "B" / "C" from a CompassVerifier reply, None when it says none of them.

    Accepted, in order: a ``\\boxed{A}`` (its CoT format; the last one), a reply that is just the letter (with
    punctuation or "A: CORRECT"), the verdict words CORRECT / INCORRECT / INVALID, then the last stand-alone
    capital A/B/C after "Final Judgment:" if present.
    """
    text = (reply or "").strip()
    boxed = re.findall(r"boxed\{\s*([ABC])\s*\}", text)
    if boxed:
        return boxed[-1]
    lead = re.match(r"^[\s(\[*\"']*([ABC])(?![A-Za-z])", text)
    if lead:
        return lead.group(1)
    words = re.findall(r"\b(INCORRECT|CORRECT|INVALID)\b", text.upper())
    if words:
        return _WORDS[words[0]]
    tail = text.split("Final Judgment:")[-1]
    letters = re.findall(r"(?<![A-Za-z])([ABC])(?![A-Za-z])", tail)
    return letters[-1] if letters else None


def verdict_for(reply: str, protocol: EvalProtocol) -> str | None:
    """The verdict of a reply under ``eval.protocol``: ``justrl`` = "A" iff the stripped reply is exactly "A",
    else the stripped reply's letter if it is exactly "B"/"C", else None; ``harness`` = :func:`parse_verdict`."""
    if protocol.exact_verdict:
        text = (reply or "").strip()
        return text if text in VERDICTS else None
    return parse_verdict(reply)


def verifier_question(problem: str, protocol: EvalProtocol) -> str:
    """What fills CV_PROMPT's ``{question}``: nothing under ``justrl`` (as JustRL's grade.py), else the problem."""
    return problem if protocol.verifier_sees_problem else ""


def verifier_prompt(question: str, gold: str, response: str, tokenizer=None) -> str:
    """CompassVerifier's prompt for one sample, as the user turn of the verifier's chat template."""
    content = CV_PROMPT.format(question=question, gold_answer=gold, llm_response=response)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return content
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


def _judge(prompts: list[str], model_path: str, cfg, vcfg: dict, store, tokenizer) -> list[str]:
    """The verifier's replies, greedy, through the eval backend (lm-eval) and the resumable cache."""
    from lm_eval.api.instance import Instance


    # room for the whole candidate response (<= the policy's max_new_tokens) plus question and instructions
    vm = dataclasses.replace(cfg, max_new_tokens=cfg.max_new_tokens + 1024 + int(vcfg["max_new_tokens"]),
                             backend_args={**cfg.backend_args, **vcfg["backend_args"]})
    vm = with_stop_tokens(vm, tokenizer)
    kwargs = {"until": list(vm.stop), "do_sample": False, "temperature": 0.0,
              "max_gen_toks": int(vcfg["max_new_tokens"])}
    if vm.stop_ids:
        kwargs[cfg.backend.stop_ids_kwarg] = list(vm.stop_ids)
    requests = [Instance(request_type="generate_until", doc={}, arguments=(p, dict(kwargs)), idx=0,
                         metadata=("stapo_verifier", i, 1)) for i, p in enumerate(prompts)]
    identity = {"verifier": generation_identity(vm, model_path)}
    lm = ResumableLM(build_lm(vm, model_path), None, identity, CHUNK_REQUESTS[cfg.backend], cfg.backend.seeding,
                     store=store)
    return lm.generate_until(requests)


def _release_policy_engine() -> None:
    """Free what the policy's engine left (its objects are unreferenced once generation returns) before the
    verifier's engine claims the accelerator's memory."""
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def apply_verifier(records: list[dict], problems: list[dict], cfg, store) -> dict:
    """Re-judge the records the rule grader marked wrong; adds ``verifier`` (A/B/C, "" unparsed, None not judged)
    and ``correct_verified`` to every record. Returns the summary's ``verifier`` block."""

    vcfg = {**VERIFIER_DEFAULTS, **cfg.verifier}
    todo = [r for r in records if not r["correct"]]
    verdicts: list[str | None] = []
    if todo:
        _release_policy_engine()
        model_path = resolve_model(vcfg["model"])
        tokenizer = _tokenizer(model_path)
        question = {p["problem_id"]: p["problem"] for p in problems}
        prompts = [verifier_prompt(verifier_question(question[r["problem_id"]], cfg.protocol), r["gold"],
                                   r["completion"], tokenizer) for r in todo]
        replies = _judge(prompts, model_path, cfg, vcfg, store, tokenizer)
        verdicts = [verdict_for(reply, cfg.protocol) for reply in replies]
    judged = {id(r): v for r, v in zip(todo, verdicts, strict=True)}
    for r in records:
        verdict = judged.get(id(r))
        r["verifier"] = None if id(r) not in judged else (verdict or "")
        r["correct_verified"] = bool(r["correct"] or verdict == "A")
    counts = Counter(v or "unparsed" for v in verdicts)
    log.info("verifier %s: %d judged, verdicts %s", vcfg["model"], len(todo), dict(counts))
    return {"model": vcfg["model"], "protocol": cfg.protocol, "judged": len(todo), "flipped": counts.get("A", 0),
            "verdicts": {k: counts.get(k, 0) for k in (*VERDICTS, "unparsed")}}
