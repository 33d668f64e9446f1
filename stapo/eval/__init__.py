"""``stapo eval``: one model on one benchmark at one sampling setting (evaluate.py), generated through lm-eval
(generation.py), graded by the rule stages of stapo.tasks, optionally corrected by an LLM verifier (verifier.py),
scored into per-sample records and a summary (scoring.py)."""
