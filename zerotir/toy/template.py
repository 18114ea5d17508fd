"""The toy world's text formats, defined once: the prompt RL shows the model, the code fence the model writes and the
output block the tool loop injects. The pretraining corpus is written with exactly these strings, so that what the base
model saw in pretraining is what it sees during RL.
"""

from __future__ import annotations

from sandbox.result import ExecResult, ExecStatus, format_for_model
from zerotir.config import ToolConfig

TEMPLATE_NAME = "toy"

# Short on purpose: with a byte tokenizer every character costs pretraining compute, and a short prompt makes every
# plain question/answer document mostly the copy the model has to learn (the answer restates the question). It says
# what ZeroTIR prompts say, tersely: Python may be used. The question sits right before the answer, so copying its
# operands (into the restated answer, or into print(...)) is a short-range copy, which a tiny model learns sooner.
TOY_TEMPLATE = "Python ok.\nQ: {problem} = ?\nA: "

# The model opens a tool call with this fence and closes it with the next; the tool loop stops on "```python", then on
# "```", and runs the text in between ("\nprint(...)\n"): see zerotir.rollout.tool_block.
CODE_OPEN = "```python\n"
CODE_CLOSE = "\n```"


def toy_prompt(problem: str, tokenizer: object | None = None) -> str:
    """The toy prompt for one arithmetic expression, e.g. ``toy_prompt("482 * 917")``.

    Args:
        problem: the question text (an expression such as ``"482 * 917"``); must be non-empty.
        tokenizer: unused (the toy prompt is plain text); accepted so the function fits the prompt-template registry.
    """
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(f"problem {problem!r}: the toy prompt needs a non-empty question text")
    return TOY_TEMPLATE.format(problem=problem.strip())


def code_block(code: str) -> str:
    """The text the model writes for one tool call: the opening fence, the code, the closing fence."""
    return f"{CODE_OPEN}{code}{CODE_CLOSE}"


def output_block(stdout: str) -> str:
    """The block the tool loop injects after a code block whose run printed ``stdout`` and succeeded.

    Built with the loop's own pieces (``ToolConfig.output_template`` around ``sandbox.format_for_model``), so the
    corpus shows the model byte for byte what RL will inject, e.g. ``"\\n```output\\n7\\n```\\n"`` for ``print(7)``.
    """
    result = ExecResult(ExecStatus.OK, stdout, "", 0.0)
    return ToolConfig().output_template.format(output=format_for_model(result))


def restated_answer(problem: str, answer: str) -> str:
    """The plain answer style of the corpus: restate the question, then the boxed value ("A * B = \\boxed{P}").

    Restating teaches the model to copy operands from the question, which is what writing ``print(A * B)`` needs.
    """
    return f"{problem} = \\boxed{{{answer}}}"


def register() -> None:
    """Register :func:`toy_prompt` as prompt template ``"toy"`` (idempotent). No special tokens are added when the
    prompt is tokenized: the base model was pretrained on documents without BOS, so RL prompts start the same way."""
    from zerotir.data.prompts import register_template, template_names

    if TEMPLATE_NAME not in template_names():
        register_template(TEMPLATE_NAME, toy_prompt, add_special_tokens=False)


register()
