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
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter

from stapo.models import resolve_model
from stapo.tasks.registry import _tokenizer

__all__ = ["CV_PROMPT", "VERIFIER_DEFAULTS", "VERIFIER_KEYS", "check_verifier_config", "parse_verdict",
           "verifier_prompt", "apply_verifier"]

log = logging.getLogger("stapo.verifier")

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

VERIFIER_DEFAULTS = {
    "model": "opencompass/CompassVerifier-3B",
    "max_new_tokens": 16,  # the reply is one letter (the card's example allows 2048 for its CoT prompt)
    "backend_args": {},  # merged over eval.<backend> for the verifier's engine (e.g. gpu_memory_utilization)
}
VERIFIER_KEYS = set(VERIFIER_DEFAULTS)
VERDICTS = ("A", "B", "C")
_WORDS = {"CORRECT": "A", "INCORRECT": "B", "INVALID": "C"}


def check_verifier_config(section) -> None:
    """``eval.verifier``: None (no verifier stage) or a mapping of ``VERIFIER_KEYS`` with a model spec."""
    if section is None:
        return
    if not isinstance(section, dict):
        raise ValueError(f"eval.verifier: expected a mapping like {{model: {VERIFIER_DEFAULTS['model']}}}, "
                         f"got {type(section).__name__}")
    unknown = set(section) - VERIFIER_KEYS
    if unknown:
        raise ValueError(f"eval.verifier: unknown key(s) {sorted(unknown)}; expected some of {sorted(VERIFIER_KEYS)}")
    model = section.get("model", VERIFIER_DEFAULTS["model"])
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"eval.verifier.model: expected a model id, path or bundled: spec, got {model!r}")
    tokens = section.get("max_new_tokens", VERIFIER_DEFAULTS["max_new_tokens"])
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"eval.verifier.max_new_tokens: expected an integer >= 1, got {tokens!r}")
    if not isinstance(section.get("backend_args", {}), dict):
        raise ValueError("eval.verifier.backend_args: expected a mapping (merged over eval.<backend>)")


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

    # stapo.evaluate imports this module (eval.verifier): importing it back at the top would be a cycle
    from stapo.evaluate import CHUNK_REQUESTS, SEEDING, ResumableLM, build_lm, generation_identity, with_stop_tokens

    # room for the whole candidate response (<= the policy's max_new_tokens) plus question and instructions
    vm = dataclasses.replace(cfg, max_new_tokens=cfg.max_new_tokens + 1024 + int(vcfg["max_new_tokens"]),
                             backend_args={**cfg.backend_args, **vcfg["backend_args"]})
    vm = with_stop_tokens(vm, tokenizer)
    kwargs = {"until": list(vm.stop), "do_sample": False, "temperature": 0.0,
              "max_gen_toks": int(vcfg["max_new_tokens"])}
    if vm.stop_ids:
        kwargs["eos_token_id" if cfg.backend == "hf" else "stop_token_ids"] = list(vm.stop_ids)
    requests = [Instance(request_type="generate_until", doc={}, arguments=(p, dict(kwargs)), idx=0,
                         metadata=("stapo_verifier", i, 1)) for i, p in enumerate(prompts)]
    identity = {"verifier": generation_identity(vm, model_path)}
    lm = ResumableLM(build_lm(vm, model_path), None, identity, CHUNK_REQUESTS[cfg.backend], SEEDING[cfg.backend],
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
        prompts = [verifier_prompt(question[r["problem_id"]], r["gold"], r["completion"], tokenizer) for r in todo]
        verdicts = [parse_verdict(reply) for reply in _judge(prompts, model_path, cfg, vcfg, store, tokenizer)]
    judged = {id(r): v for r, v in zip(todo, verdicts, strict=True)}
    for r in records:
        verdict = judged.get(id(r))
        r["verifier"] = None if id(r) not in judged else (verdict or "")
        r["correct_verified"] = bool(r["correct"] or verdict == "A")
    counts = Counter(v or "unparsed" for v in verdicts)
    log.info("verifier %s: %d judged, verdicts %s", vcfg["model"], len(todo), dict(counts))
    return {"model": vcfg["model"], "judged": len(todo), "flipped": counts.get("A", 0),
            "verdicts": {k: counts.get(k, 0) for k in (*VERDICTS, "unparsed")}}
