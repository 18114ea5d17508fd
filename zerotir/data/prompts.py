"""Prompt templates, chosen by name in config.

Built in:
    ``orz_tool``: the paper's prompt for base models, an Open-Reasoner-Zero-style User/Assistant conversation whose user
        turn says Python may be used, will be executed and its result shown, and asks for the answer in ``\\boxed{}``;
        the assistant turn starts with ``<think>``.
    ``plain``: the problem and a request for a boxed answer, nothing else (no tool mention).
    ``chat``: the tokenizer's own chat template, with a system prompt about tool use (instruct models); under
        ``model.tool.format: chat`` with the tools' schemas instead (``render_prompts``). Both through
        ``zerotir.tools.chat``, the one place a chat template is applied.

``orz_tool`` and ``chat`` describe the call format in use: code fences by default, hermes's ``<tool_call>`` JSON and
the tools under ``model.tool.format: hermes`` (``render_prompts``).

More can be added with ``register_template(name, fn)`` (e.g. the toy world's ``toy``), or named in config as
``"package.module:function"``, imported on first use.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TemplateFn = Callable[[str, Any], str]  # (problem, tokenizer or None) -> prompt text

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptTemplate:
    """A named template.

    Args:
        name: the config name.
        render: ``(problem, tokenizer) -> prompt text``.
        add_special_tokens: whether tokenizing the text should add the tokenizer's special tokens (BOS). False for
            chat templates, whose text already holds them.
    """

    name: str
    render: TemplateFn
    add_special_tokens: bool = True


_REGISTRY: dict[str, PromptTemplate] = {}

_ORZ_FENCES = ("While reasoning, the Assistant may write Python code in a block that starts with ```python and ends "
               "with ```; the code is executed right away and its printed result is shown to the Assistant in a "
               "```output block, after which the Assistant continues.")
_ORZ_FENCES_HINT = "You may use Python code to compute or check intermediate results."

ORZ_TOOL_TEMPLATE = (
    "A conversation between User and Assistant. The User gives a math problem and the Assistant solves it. "
    "The Assistant first reasons step by step inside <think> </think> tags, then gives the answer inside "
    f"<answer> </answer> tags. {_ORZ_FENCES}\n"
    f"User: Solve the problem below. {_ORZ_FENCES_HINT} "
    "Put the final answer inside <answer> </answer> tags and write it as \\boxed{{...}}.\n"
    "Problem:\n{problem}\n"
    "Assistant: <think>"
)
# The same prompt for a format that calls tools by name: the fences' sentences give way to ``{tool_use}``, the
# format's own description of its calls and the tools (``zerotir.tools.formats.Hermes.describe``).
_ORZ_CALLS_TEMPLATE = ORZ_TOOL_TEMPLATE.replace(f" {_ORZ_FENCES}", "").replace(f"{_ORZ_FENCES_HINT} ", "{tool_use}\n")

PLAIN_TEMPLATE = (
    "Problem:\n{problem}\n\nSolve the problem step by step and put the final answer in \\boxed{{}}.\n\nSolution:\n"
)

_CHAT_ROLE = "You are a careful mathematician."
_CHAT_ANSWER = "Reason step by step and put your final answer within \\boxed{}."
CHAT_SYSTEM_PROMPT = (
    f"{_CHAT_ROLE} You may write Python code in a block that starts with ```python and ends "
    "with ```; it is executed right away and its printed output is returned to you in a ```output block. "
    f"{_CHAT_ANSWER}"
)


def _orz_tool(problem: str, tokenizer: Any = None) -> str:
    return ORZ_TOOL_TEMPLATE.format(problem=problem)


def _plain(problem: str, tokenizer: Any = None) -> str:
    return PLAIN_TEMPLATE.format(problem=problem)


def _chat(problem: str, tokenizer: Any = None) -> str:
    from zerotir.tools.chat import chat_prompt, check_chat_template

    check_chat_template(tokenizer, "data.template: chat", "for a base model use template 'orz_tool' or 'plain'")
    return chat_prompt(tokenizer, CHAT_SYSTEM_PROMPT, problem)


def render_prompts(name: str, problems: list[str], tokenizer: Any, tools: list[dict[str, Any]] | None = None,
                   tool_format: str = "fences") -> list[str]:
    """The prompt texts of ``problems`` under template ``name``, describing the call format ``tool_format``
    (``model.tool.format``) and its ``tools`` (``model.tool.tools`` entries; None under ``fences``):

    * ``fences``: the template's own text (``orz_tool`` and ``chat`` speak of code fences, as the paper's);
    * ``hermes``: ``orz_tool`` and ``chat`` with the fences' sentences replaced by hermes's description of its
      ``<tool_call>`` JSON calls and the tools' schemas (``Hermes.describe``); ``plain`` mentions no tool under any
      format; a template of your own renders its own text;
    * ``chat``: the model's chat template with the tools' schemas (``tools=``: the template says how to call them).
    """
    if tools is None:
        template = get_template(name)
        return [template.render(problem, tokenizer) for problem in problems]
    from zerotir.tools.chat import CHAT_TOOLS_SYSTEM_PROMPT, chat_prompt, check_chat_format
    from zerotir.tools.formats import Hermes
    from zerotir.tools.registry import tool_schemas

    schemas = tool_schemas(tools)  # built once per source (an MCP server is started once per process)
    if tool_format == "chat":
        check_chat_format(tokenizer)  # at start: the data is set up before the first rollout
        return [chat_prompt(tokenizer, CHAT_TOOLS_SYSTEM_PROMPT, problem, schemas) for problem in problems]
    tool_use = Hermes().describe(schemas)
    return [_with_calls(name, problem, tokenizer, tool_use) for problem in problems]


def _with_calls(name: str, problem: str, tokenizer: Any, tool_use: str) -> str:
    """``problem`` under template ``name`` for a format that calls tools by name, described by ``tool_use``."""
    if name == "orz_tool":
        return _ORZ_CALLS_TEMPLATE.format(problem=problem, tool_use=tool_use)
    if name == "chat":
        from zerotir.tools.chat import chat_prompt, check_chat_template

        check_chat_template(tokenizer, "data.template: chat", "for a base model use template 'orz_tool' or 'plain'")
        return chat_prompt(tokenizer, f"{_CHAT_ROLE} {tool_use}\n{_CHAT_ANSWER}", problem)
    return get_template(name).render(problem, tokenizer)


def check_template(name: str, tools: list[dict[str, Any]] | None = None, tool_format: str = "fences") -> None:
    """Raise ``ValueError`` for an unknown template name, for ``tools`` that do not go with ``tool_format`` (given
    exactly when the format calls tools by name), or for ``tool_format: chat`` with a template other than ``chat``."""
    get_template(name)
    if (tools is not None) != (tool_format != "fences"):
        raise ValueError(f"data.tools lists the tools the prompt describes under model.tool.format hermes or chat, "
                         f"and model.tool.format is {tool_format!r} (data.tool_format) with data.tools "
                         f"{'set' if tools is not None else 'unset'}: the CLI links both from model.tool; set "
                         "data.tools only with format hermes or chat")
    if tool_format == "chat" and name != "chat":
        raise ValueError(f"model.tool.format: chat builds the prompts with the model's chat template and the "
                         f"tools' schemas, and data.template is {name!r}: set data.template: chat")


def register_template(name: str, fn: TemplateFn, *, add_special_tokens: bool = True, overwrite: bool = False) -> None:
    """Make template ``fn`` available under ``name``.

    Args:
        name: the config name.
        fn: ``(problem, tokenizer_or_None) -> prompt text``.
        add_special_tokens: see ``PromptTemplate``.
        overwrite: replace an existing template of that name (otherwise that is an error).
    """
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"prompt template {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = PromptTemplate(name, fn, add_special_tokens)


def template_names() -> list[str]:
    """Names of the registered templates, sorted."""
    return sorted(_REGISTRY)


def get_template(name: str) -> PromptTemplate:
    """The template registered as ``name``, or the function at ``"package.module:function"`` (registered on first use).

    Raises:
        ValueError: unknown name; the message lists the valid ones.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"prompt template {name!r}: cannot import {attr!r} from {module_name!r} ({exc})") from exc
        if not callable(fn):
            raise ValueError(f"prompt template {name!r} is not callable")
        register_template(name, fn)
        return _REGISTRY[name]
    raise ValueError(f"unknown prompt template {name!r}; valid names: {', '.join(template_names())} "
                     "(or 'package.module:function')")


def render_prompt(name: str, problem: str, tokenizer: Any = None) -> str:
    """The prompt text of ``problem`` under template ``name``.

    Args:
        name: a registered template name (see ``template_names()``) or ``"package.module:function"``.
        problem: the problem statement.
        tokenizer: a transformers tokenizer; required by ``chat``, ignored by the text templates.
    """
    return get_template(name).render(problem, tokenizer)


def tokenize_prompts(name: str, prompt_texts: list[str], tokenizer: Any) -> list[list[int]]:
    """Token ids of rendered prompts, adding special tokens (BOS) only where the template's text lacks them."""
    if not prompt_texts:
        return []
    template = get_template(name)
    encoded = tokenizer(list(prompt_texts), add_special_tokens=template.add_special_tokens)["input_ids"]
    return [list(ids) for ids in encoded]


register_template("orz_tool", _orz_tool)
register_template("plain", _plain)
register_template("chat", _chat, add_special_tokens=False)


def build_prompts(rows: list[dict[str, str]], source: str, template: str, tokenizer: Any,
                  max_prompt_tokens: int | None, tools: list[dict[str, Any]] | None = None,
                  tool_format: str = "fences") -> tuple[list[dict], int]:
    """Render (``tools``, ``tool_format``: ``render_prompts``) and tokenize ``rows``; returns the kept rows (with
    ``prompt_text``, ``prompt_ids``, ``source``) and the number dropped for exceeding ``max_prompt_tokens``."""
    texts = render_prompts(template, [row["problem"] for row in rows], tokenizer, tools, tool_format)
    ids = tokenize_prompts(template, texts, tokenizer)
    kept = [{**row, "prompt_text": text, "prompt_ids": tok_ids, "source": source}
            for row, text, tok_ids in zip(rows, texts, ids)
            if max_prompt_tokens is None or len(tok_ids) <= max_prompt_tokens]
    dropped = len(rows) - len(kept)
    if dropped:
        logger.warning("data: dropped %d of %d prompts of %r longer than max_prompt_tokens=%s",
                       dropped, len(rows), source, max_prompt_tokens)
    if not kept:
        raise ValueError(f"data source {source!r}: every prompt is longer than max_prompt_tokens={max_prompt_tokens}")
    return kept, dropped
