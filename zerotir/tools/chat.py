"""The model's own chat template: the one place zerotir applies one (``tokenizer.apply_chat_template``).

Two things are rendered with it, both as text that is then tokenized (the sampled ids are never re-tokenized):

* the prompt (``chat_prompt``): a system and a user turn, with the tools' function-calling schemas when given
  (``tools=``: the template writes their description and how to call them), ending in the generation prompt. The
  data module's ``chat`` template renders every prompt through it (``zerotir.data.prompts``), with the tools of
  ``model.tool.tools`` under ``model.tool.format: chat``.
* the tool turn (``tool_turn``): what follows a call the model closed, as the template writes a ``tool`` message
  after an assistant one: the end of the assistant turn, the tool turn holding the observation, and the next
  assistant turn's generation prompt (Qwen2.5 / Qwen3: ``<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...
  \\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``). It is the template's text after the assistant's
  content in a conversation that ends with the tool message, so it is whatever that template writes there.

Both pass ``model.tool.chat_template_kwargs`` to the template (e.g. ``{enable_thinking: false}``, Qwen3's
non-thinking mode); a key the template never reads is refused (``check_template_kwargs``), as it would change
nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHAT_TOOLS_SYSTEM_PROMPT", "RESERVED_KWARGS", "check_chat_format", "check_chat_template",
           "check_template_kwargs", "chat_prompt", "tool_turn"]

CHAT_TOOLS_SYSTEM_PROMPT = (
    "You are a careful mathematician. Reason step by step, call a tool whenever it helps you compute or check a "
    "result, and put your final answer within \\boxed{}."
)

# The arguments of ``apply_chat_template`` that zerotir sets itself: not settable through chat_template_kwargs.
RESERVED_KWARGS = ("conversation", "tools", "documents", "chat_template", "add_generation_prompt",
                   "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
                   "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")
_MARK = "@@zerotir:assistant-content@@"  # the assistant's content in the conversation that renders a tool turn


def check_chat_template(tokenizer: Any, setting: str, fix: str) -> None:
    """Raise ``ValueError`` naming ``setting`` and ``fix`` when ``tokenizer`` has no chat template."""
    if tokenizer is None or not tokenizer.chat_template:
        name = (tokenizer.name_or_path if tokenizer is not None else "") or "the tokenizer"
        raise ValueError(f"{setting}: {name} has no chat template (tokenizer.chat_template), so the prompt cannot be "
                         f"built in the model's own chat format; {fix}")


def check_chat_format(tokenizer: Any) -> None:
    """Raise ``ValueError`` naming ``model.tool.format`` and the fix when ``tokenizer`` cannot serve the ``chat``
    format: no chat template, or one that does not ask for ``<tool_call>`` JSON calls (the only ones it parses)."""
    check_chat_template(tokenizer, "model.tool.format: chat", "use an instruct or thinking model whose tokenizer has "
                        "one (e.g. Qwen2.5-Instruct), or format: fences / hermes with a base model")
    if "<tool_call>" not in tokenizer.chat_template:
        raise ValueError(f"model.tool.format: chat parses <tool_call> JSON calls, and the chat template of "
                         f"{tokenizer.name_or_path or 'the tokenizer'} does not use them; use a model whose template "
                         "does (Qwen2.5 / Qwen3), or format: hermes with a prompt that asks for them")


def check_template_kwargs(tokenizer: Any, kwargs: dict[str, Any] | None) -> None:
    """Raise ``ValueError`` naming ``model.tool.chat_template_kwargs`` and the fix for a key zerotir sets itself
    (``RESERVED_KWARGS``) or one that ``tokenizer``'s chat template never reads (its name is not in the template's
    text, so the value could change nothing)."""
    for key in kwargs or {}:
        if key in RESERVED_KWARGS:
            raise ValueError(f"model.tool.chat_template_kwargs.{key}: zerotir sets {key} itself where it applies the "
                             "chat template; remove the key")
        source = tokenizer.chat_template if tokenizer is not None else None
        text = "\n".join(source.values()) if isinstance(source, dict) else source or ""
        if key not in text:
            name = (tokenizer.name_or_path if tokenizer is not None else "") or "the tokenizer"
            raise ValueError(f"model.tool.chat_template_kwargs.{key}: the chat template of {name} never reads "
                             f"{key!r}, so it would change nothing; remove the key or use a model whose template "
                             "reads it (e.g. enable_thinking: Qwen3)")


def chat_prompt(tokenizer: Any, system: str, problem: str, tools: list[dict[str, Any]] | None = None,
                chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text of ``problem``: a ``system`` turn and a user turn in the tokenizer's chat template, with
    ``tools`` (function-calling schemas, ``zerotir.tools.Tool.schema``) when given, the generation prompt and
    ``chat_template_kwargs`` (``model.tool.chat_template_kwargs``)."""
    check_template_kwargs(tokenizer, chat_template_kwargs)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": problem}]
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True,
                                         **(chat_template_kwargs or {}))


def tool_turn(tokenizer: Any, observation: str, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The text the template writes after an assistant turn's content when a tool message with ``observation``
    follows it, up to and including the next generation prompt (the module doc), the template given
    ``chat_template_kwargs``.

    Raises:
        ValueError: the template does not write the assistant's content as given (then no tool turn can be cut
            from it).
    """
    messages = [{"role": "user", "content": ""}, {"role": "assistant", "content": _MARK},
                {"role": "tool", "content": observation}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **(chat_template_kwargs or {}))
    at = text.find(_MARK)
    if at < 0:
        raise ValueError("model.tool.format: chat: the tokenizer's chat template does not write an assistant turn's "
                         "content as given, so the tool turn after a call cannot be taken from it; use format: "
                         "hermes (the observation in <tool_response> inside the assistant's turn)")
    return text[at + len(_MARK):]
