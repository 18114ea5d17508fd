"""Prompt templates, chosen by name in config.

Built in:
    ``orz_tool``: the paper's prompt for base models, an Open-Reasoner-Zero-style User/Assistant conversation whose user
        turn says Python may be used, will be executed and its result shown, and asks for the answer in ``\\boxed{}``;
        the assistant turn starts with ``<think>``.
    ``plain``: the problem and a request for a boxed answer, nothing else (no tool mention).
    ``chat``: the tokenizer's own chat template, with a system prompt about tool use (instruct models); under
        ``model.tool.format: chat`` with the tools' schemas instead (``render_prompts``). Both through
        ``zerotir.tools.chat``, the one place a chat template is applied, with ``model.tool.chat_template_kwargs``.

The call format (``model.tool.format``, ``zerotir.tools.formats``) writes its part of the prompt: ``orz_tool`` and
``chat`` speak of code fences by default, and a format that calls tools by name (hermes, or one of your own) puts
its own description of its calls and the tools in place of those sentences (``TemplateText``, ``render_prompts``).

More can be added with ``register_template(name, fn)`` (e.g. the toy world's ``toy``), or named in config as
``"package.module:function"``, imported on first use.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zerotir.tools.formats import CallFormat, Fences, build_format

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
    chat_template: bool = False
    """Whether ``render`` applies the tokenizer's chat template: then it is called with a third argument,
    ``model.tool.chat_template_kwargs``."""


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
# format's own description of its calls and the tools (``zerotir.tools.formats.CallFormat.describe``).
_ORZ_CALLS_TEMPLATE = ORZ_TOOL_TEMPLATE.replace(f" {_ORZ_FENCES}", "").replace(f"{_ORZ_FENCES_HINT} ", "{tool_use}\n")

PLAIN_TEMPLATE = (
    "Problem:\n{problem}\n\nSolve the problem step by step and put the final answer in \\boxed{{}}.\n\nSolution:\n"
)

_CHAT_ROLE = "You are a careful mathematician."
_CHAT_ANSWER = "Reason step by step and put your final answer within \\boxed{}."
CHAT_SYSTEM_PROMPT = f"{_CHAT_ROLE} {Fences().describe(None)} {_CHAT_ANSWER}"


def _orz_tool(problem: str, tokenizer: Any = None) -> str:
    return ORZ_TOOL_TEMPLATE.format(problem=problem)


def _plain(problem: str, tokenizer: Any = None) -> str:
    return PLAIN_TEMPLATE.format(problem=problem)


def _chat(problem: str, tokenizer: Any = None, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    return _chat_prompt(tokenizer, CHAT_SYSTEM_PROMPT, problem, None, chat_template_kwargs)


def _chat_prompt(tokenizer: Any, system: str, problem: str, schemas: list[dict[str, Any]] | None,
                 chat_template_kwargs: dict[str, Any] | None) -> str:
    from zerotir.tools.chat import chat_prompt, check_chat_template

    check_chat_template(tokenizer, "data.template: chat", "for a base model use template 'orz_tool' or 'plain'")
    return chat_prompt(tokenizer, system, problem, schemas, chat_template_kwargs)


@dataclass(frozen=True)
class TemplateText:
    """What a call format writes its prompt with (``CallFormat.prompt``): the data's template ``name``, the
    tokenizer and ``model.tool.chat_template_kwargs``."""

    name: str
    tokenizer: Any = None
    chat_template_kwargs: dict[str, Any] | None = None

    def own(self, problem: str) -> str:
        """The template's own text (``orz_tool`` and ``chat``: the paper's, about code fences)."""
        template = get_template(self.name)
        if template.chat_template:
            return template.render(problem, self.tokenizer, self.chat_template_kwargs)
        return template.render(problem, self.tokenizer)

    def with_instructions(self, problem: str, instructions: str) -> str:
        """``orz_tool`` and ``chat`` with the fences' sentences replaced by ``instructions`` (a format's own
        ``describe``); ``plain`` mentions no tool under any format; a template of your own renders its own text."""
        if self.name == "orz_tool":
            return _ORZ_CALLS_TEMPLATE.format(problem=problem, tool_use=instructions)
        if self.name == "chat":
            system = f"{_CHAT_ROLE} {instructions}\n{_CHAT_ANSWER}"
            return _chat_prompt(self.tokenizer, system, problem, None, self.chat_template_kwargs)
        return self.own(problem)

    def chat(self, problem: str, system: str, schemas: list[dict[str, Any]] | None) -> str:
        """The model's chat template with a ``system`` turn and the tools' ``schemas`` (``tools=``: the template
        says how to call them)."""
        return _chat_prompt(self.tokenizer, system, problem, schemas, self.chat_template_kwargs)


def render_prompts(name: str, problems: list[str], tokenizer: Any, tools: list[dict[str, Any]] | None = None,
                   tool_format: Any = "fences", chat_template_kwargs: dict[str, Any] | None = None) -> list[str]:
    """The prompt texts of ``problems`` under template ``name``, as the call format ``tool_format``
    (``model.tool.format``) writes them (``CallFormat.prompt``) with its ``tools`` (``model.tool.tools`` entries;
    None under a format whose calls name no tool, as fences'):

    * ``fences``: the template's own text (``orz_tool`` and ``chat`` speak of code fences, as the paper's);
    * ``hermes`` (a format's default): ``orz_tool`` and ``chat`` with the fences' sentences replaced by the format's
      description of its calls and the tools' schemas (``describe``); ``plain`` mentions no tool under any format;
      a template of your own renders its own text;
    * ``chat``: the model's chat template with the tools' schemas (``tools=``: the template says how to call them).
    """
    fmt = _format_of(name, tools, tool_format, tokenizer, chat_template_kwargs)
    from zerotir.tools.registry import tool_schemas

    schemas = tool_schemas(tools) if tools is not None else None  # once per source (an MCP server: started to list)
    text = TemplateText(name, tokenizer, chat_template_kwargs)
    return [fmt.prompt(text, problem, schemas) for problem in problems]


def _format_of(name: str, tools: list[dict[str, Any]] | None, tool_format: Any, tokenizer: Any,
               chat_template_kwargs: dict[str, Any] | None) -> CallFormat:
    """The format ``tool_format`` checked against the template and bound to ``tokenizer`` (a format that writes
    with the chat template checks it here, at start: the data is set up before the first rollout)."""
    check_template(name, tools, tool_format, chat_template_kwargs)
    fmt = build_format(tool_format)
    fmt.bind(tokenizer, chat_template_kwargs)
    return fmt


def check_template(name: str, tools: list[dict[str, Any]] | None = None, tool_format: Any = "fences",
                   chat_template_kwargs: dict[str, Any] | None = None) -> None:
    """Raise ``ValueError`` for an unknown template name, for ``tools`` that do not go with ``tool_format`` (given
    exactly when the format's calls name their tool), for a format that cannot write its prompt with this template
    (``chat`` with one other than ``chat``), or for ``chat_template_kwargs`` with a template that applies no chat
    template."""
    from zerotir.tools.formats import format_class, format_label

    template, fmt = get_template(name), format_class(tool_format)
    if (tools is not None) != fmt.calls_by_name:
        raise ValueError(f"data.tools lists the tools the prompt describes under a model.tool.format whose calls name "
                         f"their tool (hermes, chat), and model.tool.format is {format_label(tool_format)!r} "
                         f"(data.tool_format) with data.tools {'set' if tools is not None else 'unset'}: the CLI "
                         "links both from model.tool; set data.tools only with such a format")
    build_format(tool_format).check_template(name)
    if chat_template_kwargs and not template.chat_template:
        raise ValueError(f"model.tool.chat_template_kwargs={chat_template_kwargs} with data.template {name!r}, "
                         "which applies no chat template, so they would change nothing: use data.template: chat "
                         "(an instruct / thinking model) or unset them")


def register_template(name: str, fn: TemplateFn, *, add_special_tokens: bool = True, chat_template: bool = False,
                      overwrite: bool = False) -> None:
    """Make template ``fn`` available under ``name``.

    Args:
        name: the config name.
        fn: ``(problem, tokenizer_or_None) -> prompt text``.
        add_special_tokens: see ``PromptTemplate``.
        chat_template: see ``PromptTemplate`` (then ``fn`` takes ``chat_template_kwargs`` as a third argument).
        overwrite: replace an existing template of that name (otherwise that is an error).
    """
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"prompt template {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = PromptTemplate(name, fn, add_special_tokens, chat_template)


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


def render_prompt(name: str, problem: str, tokenizer: Any = None,
                  chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text of ``problem`` under template ``name``, its own text (no call format's).

    Args:
        name: a registered template name (see ``template_names()``) or ``"package.module:function"``.
        problem: the problem statement.
        tokenizer: a transformers tokenizer; required by ``chat``, ignored by the text templates.
        chat_template_kwargs: ``model.tool.chat_template_kwargs``, for a template that applies the chat template.
    """
    return TemplateText(name, tokenizer, chat_template_kwargs).own(problem)


def tokenize_prompts(name: str, prompt_texts: list[str], tokenizer: Any) -> list[list[int]]:
    """Token ids of rendered prompts, adding special tokens (BOS) only where the template's text lacks them."""
    if not prompt_texts:
        return []
    template = get_template(name)
    encoded = tokenizer(list(prompt_texts), add_special_tokens=template.add_special_tokens)["input_ids"]
    return [list(ids) for ids in encoded]


register_template("orz_tool", _orz_tool)
register_template("plain", _plain)
register_template("chat", _chat, add_special_tokens=False, chat_template=True)


def build_prompts(rows: list[dict[str, str]], source: str, template: str, tokenizer: Any,
                  max_prompt_tokens: int | None, tools: list[dict[str, Any]] | None = None,
                  tool_format: Any = "fences",
                  chat_template_kwargs: dict[str, Any] | None = None) -> tuple[list[dict], int]:
    """Render (``tools``, ``tool_format``, ``chat_template_kwargs``: ``render_prompts``) and tokenize ``rows``;
    returns the kept rows (with ``prompt_text``, ``prompt_ids``, ``source``) and the number dropped for exceeding
    ``max_prompt_tokens``."""
    texts = render_prompts(template, [row["problem"] for row in rows], tokenizer, tools, tool_format,
                           chat_template_kwargs)
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
