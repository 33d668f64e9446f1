"""Prompts and datasets: the paper's prompt template, training sets, benchmark rows.

The prompt (paper, Training Details): the bare problem followed by the \\boxed{} instruction, as the user turn of
the tokenizer's chat template (plain text when the tokenizer has no template). Training and evaluation use the
same function, so the two can never drift apart.
"""

from __future__ import annotations

__all__ = ["PROMPT_SUFFIX", "build_prompt"]

PROMPT_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."


def build_prompt(problem: str, tokenizer=None) -> str:
    """The text the policy is conditioned on: chat-templated user turn when the tokenizer has a template."""
    content = f"{problem.strip()}\n\n{PROMPT_SUFFIX}"
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return content
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
