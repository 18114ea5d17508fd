"""Call formats (``model.tool.format``): how the model writes a tool call, how the observation is written back, and
how a prompt asks for them. A format is a ``CallFormat`` plug-in, named in config like a tool (``class_path``).

A format owns its markers, which every reader of a call takes from it: the tool loop stops a segment on
``call_start`` (a call opens), then on ``call_end`` (it closes), so those two are its stop strings; the text between
them is the call (``parse``), and the observation goes back as ``render(text)``, tokens the model did not sample
(action 0). ``output_start`` / ``output_end`` are the markers of that rendered block, which the trajectory filters
count (``zerotir.filters.blocks``). It owns its part of the prompt too (``prompt``, ``describe``): the data module
asks it, so the prompt asks for the markers the loop and the filters read.

Built in (``BUILT_IN``; the short names of ``model.tool.format``):

* ``fences``, the paper's and the default: a ```` ```python ```` block is a call of the ``python`` tool with the
  block as its code, and the observation comes back in ``model.tool.output_template`` (a ```` ```output ```` block).
  Its markers are ``model.tool.code_start`` / ``code_end``: byte for byte the loop before the tool plug-ins. Its
  prompt is the template's own text (``orz_tool`` and ``chat`` speak of code fences, as the paper's prompt).
* ``hermes``, the JSON calls of Qwen2.5 / Qwen3 and the Hermes models: ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`` in, ``<tool_response>...</tool_response>`` out. Malformed JSON, a missing name or arguments
  that are not an object give an error observation the model reads (status ``invalid``), as an unknown tool name or
  arguments off the tool's schema do (``zerotir.tools.registry``).
* ``chat``, an instruct / thinking model's own chat template (``zerotir.tools.chat``): the calls are hermes's
  ``<tool_call>`` JSON (the Qwen2.5 / Qwen3 templates ask for it; a template that does not is refused), and the
  observation comes back as the template's tool turn: the assistant turn ends, a tool turn holds the observation,
  and a new assistant turn opens. The prompt is the template with the tools' schemas (the data's ``chat`` template).

A format of your own is a subclass in any importable module, named by its dotted path (docs/extending.md).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from zerotir.tools.base import close_match_hint, import_subclass

__all__ = ["BUILT_IN", "Call", "CallFormat", "Chat", "Fences", "FormatWatch", "Hermes", "build_format", "call_format",
           "format_class", "format_label", "markers"]

_ENTRY_KEYS = {"class_path", "init_args"}
FENCE_FIELDS = ("code_start", "code_end", "output_template")  # the fences' markers in the model.tool group


@dataclass(frozen=True)
class Call:
    """A parsed call: the tool's name and arguments, or ``error`` (then name and arguments are empty) saying why the
    text is not a call."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


class CallFormat:
    """A call format (the module doc): its markers, parser, renderer and part of the prompt.

    A subclass sets the four markers (``call_start`` and ``call_end`` are the tool loop's stop strings: non-empty)
    and implements ``parse``, ``render`` and ``describe``; its settings are its ``__init__`` arguments, given as the
    ``init_args`` of ``model.tool.format``.
    """

    call_start: str
    call_end: str
    output_start: str
    output_end: str
    calls_by_name: bool = True
    """Whether a call names its tool: the prompt then shows the tools of ``model.tool.tools`` (``data.tools``)."""
    tool_fields: tuple[str, ...] = ()
    """The fields of the ``model.tool`` group this format reads besides its ``init_args`` (``from_tool``)."""

    @classmethod
    def from_tool(cls, group: Any, /, **init_args: Any) -> CallFormat:
        """This format with its ``init_args`` for the ``model.tool`` group ``group`` (None: for a prompt only)."""
        return cls(**init_args)

    def bind(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        """The run's tokenizer and ``model.tool.chat_template_kwargs``, given before the first ``render``: a
        format that writes with the model's chat template takes them; the others need neither."""

    def parse(self, block: str) -> Call:
        """The call written in ``block`` (the text between ``call_start`` and ``call_end``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement parse")

    def render(self, text: str) -> str:
        """The text injected after a call: the observation's ``text`` in this format's output block."""
        raise NotImplementedError(f"{type(self).__name__} must implement render")

    def describe(self, schemas: list[dict[str, Any]] | None) -> str:
        """How to call the tools (``schemas``: ``Tool.schema`` each; None when ``calls_by_name`` is false), in the
        second person, for a prompt: it replaces the code fences' sentences of the built-in templates."""
        raise NotImplementedError(f"{type(self).__name__} must implement describe")

    def prompt(self, text: Any, problem: str, schemas: list[dict[str, Any]] | None) -> str:
        """The prompt of ``problem``, written with ``text`` (``zerotir.data.prompts.TemplateText``: the data's
        template). By default the template with ``describe(schemas)`` in place of the fences' sentences."""
        return text.with_instructions(problem, self.describe(schemas))

    def check_template(self, template: str) -> None:
        """Raise ``ValueError`` when this format cannot write its prompt with the data template ``template``."""

    def check_tools(self, names: list[str]) -> None:
        """Raise ``ValueError`` when this format cannot call the configured tools ``names``."""


class Fences(CallFormat):
    """The paper's code fences (module doc); the markers and the output template are ``model.tool``'s
    ``code_start``, ``code_end`` and ``output_template``.

    Args:
        code_start: the stop string that opens a code block.
        code_end: the stop string that closes it.
        output_template: the injected block; ``{output}`` is replaced by the observation.
    """

    calls_by_name = False
    tool_fields = FENCE_FIELDS

    def __init__(self, code_start: str = "```python", code_end: str = "```",
                 output_template: str = "\n```output\n{output}\n```\n") -> None:
        self.call_start, self.call_end, self._template = code_start, code_end, output_template
        head, _, tail = output_template.partition("{output}")
        self.output_start, self.output_end = head.strip(), tail.strip()

    @classmethod
    def from_tool(cls, group: Any, /, **init_args: Any) -> CallFormat:
        if init_args:
            raise ValueError(f"model.tool.format: fences takes no init_args (got {sorted(init_args)}): its markers "
                             "are model.tool.code_start, code_end and output_template; set those instead")
        return cls() if group is None else cls(*(getattr(group, name) for name in FENCE_FIELDS))

    def parse(self, block: str) -> Call:
        return Call("python", {"code": block})

    def render(self, text: str) -> str:
        return self._template.format(output=text)

    def describe(self, schemas: list[dict[str, Any]] | None) -> str:
        return (f"You may write Python code in a block that starts with {self.call_start} and ends with "
                f"{self.call_end}; it is executed right away and its printed output is returned to you in a "
                f"{self.output_start} block.")

    def prompt(self, text: Any, problem: str, schemas: list[dict[str, Any]] | None) -> str:
        return text.own(problem)  # the templates' own text is the paper's, about code fences

    def check_tools(self, names: list[str]) -> None:
        if names != ["python"]:
            raise ValueError(f"model.tool.format: fences calls the python tool only (a code block is its code), and "
                             f"model.tool.tools names {names}: set model.tool.tools to [python], or use format: "
                             "hermes (JSON calls by tool name) for several tools")


class Hermes(CallFormat):
    """``<tool_call>`` JSON in, ``<tool_response>`` out (module doc)."""

    call_start, call_end = "<tool_call>", "</tool_call>"
    output_start, output_end = "<tool_response>", "</tool_response>"

    def parse(self, block: str) -> Call:
        try:
            value = json.loads(block)
        except json.JSONDecodeError as error:
            return _error(f"the tool call is not valid JSON ({error.msg} at line {error.lineno} column "
                          f"{error.colno}); write {{\"name\": <tool>, \"arguments\": {{...}}}}")
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return _error('the tool call must be a JSON object with a string "name" and an object "arguments"')
        arguments = value.get("arguments", {})
        if not isinstance(arguments, dict):
            return _error(f'the "arguments" of {value["name"]!r} must be a JSON object, got '
                          f"{type(arguments).__name__}")
        return Call(value["name"], arguments)

    def render(self, text: str) -> str:
        return f"\n{self.output_start}\n{text}\n{self.output_end}\n"

    def describe(self, schemas: list[dict[str, Any]] | None) -> str:
        """The call's shape, where its result comes back, and each tool as its JSON schema on a line of its own."""
        tools = "\n".join(json.dumps(schema["function"]) for schema in schemas or [])
        return (f'You may call a tool to compute or check intermediate results: write {self.call_start}{{"name": '
                f'<tool name>, "arguments": <JSON object>}}{self.call_end}; the call runs right away and its result '
                f"is shown to you in a {self.output_start} block, after which you continue. The tools, as JSON "
                f"schemas:\n{tools}")


class Chat(Hermes):
    """Hermes's calls; the observation as the chat template's tool turn, the prompt as the template with the tools'
    schemas (module doc). ``bind`` takes the model's tokenizer, whose chat template writes both.

    Raises:
        ValueError: (``bind``) no tokenizer, a tokenizer without a chat template, or a template without
            ``<tool_call>`` calls; (``check_template``) a data template other than ``chat``.
    """

    tokenizer: Any = None
    chat_template_kwargs: dict[str, Any] = {}

    def bind(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        from zerotir.tools.chat import check_chat_format, check_template_kwargs

        check_chat_format(tokenizer)
        check_template_kwargs(tokenizer, chat_template_kwargs)
        self.tokenizer, self.chat_template_kwargs = tokenizer, dict(chat_template_kwargs or {})

    def render(self, text: str) -> str:
        from zerotir.tools.chat import tool_turn

        if self.tokenizer is None:
            raise ValueError("model.tool.format: chat renders a tool turn with the model's chat template, and no "
                             "tokenizer was bound (CallFormat.bind); build it with call_format(tool, tokenizer)")
        return tool_turn(self.tokenizer, text, self.chat_template_kwargs)

    def prompt(self, text: Any, problem: str, schemas: list[dict[str, Any]] | None) -> str:
        from zerotir.tools.chat import CHAT_TOOLS_SYSTEM_PROMPT

        return text.chat(problem, CHAT_TOOLS_SYSTEM_PROMPT, schemas)

    def check_template(self, template: str) -> None:
        if template != "chat":
            raise ValueError(f"model.tool.format: chat builds the prompts with the model's chat template and the "
                             f"tools' schemas, and data.template is {template!r}: set data.template: chat")


def _error(message: str) -> Call:
    return Call("", {}, message)


BUILT_IN: dict[str, type[CallFormat]] = {"fences": Fences, "hermes": Hermes, "chat": Chat}


def _entry(spec: Any) -> tuple[str, dict[str, Any]]:
    """``(class_path, init_args)`` of a ``model.tool.format`` value: a name or dotted path, or an entry."""
    if isinstance(spec, str):
        return spec, {}
    if (not isinstance(spec, dict) or not isinstance(spec.get("class_path"), str)
            or set(spec) - _ENTRY_KEYS or not isinstance(spec.get("init_args") or {}, dict)):
        raise ValueError(f"model.tool.format={spec!r}: write a built-in name ({', '.join(BUILT_IN)}), the dotted "
                         "path of a CallFormat subclass, or {class_path: <name or module.Class>, init_args: {...}}")
    return spec["class_path"], dict(spec.get("init_args") or {})


def format_class(spec: Any) -> type[CallFormat]:
    """The ``CallFormat`` subclass ``model.tool.format`` names (a built-in name or a dotted path, alone or as the
    ``class_path`` of an entry).

    Raises:
        ValueError: a malformed entry, an unknown name (with the closest built-in one), a path that does not import
            or names no ``CallFormat`` subclass.
    """
    class_path, _ = _entry(spec)
    if class_path in BUILT_IN:
        return BUILT_IN[class_path]
    where = f"model.tool.format={class_path!r}"
    if "." not in class_path:
        raise ValueError(f"{where}: not a built-in format ({', '.join(BUILT_IN)}) nor the dotted path module.Class "
                         f"of a zerotir.tools.formats.CallFormat subclass{close_match_hint(class_path, BUILT_IN)}")
    return import_subclass(class_path, CallFormat, "zerotir.tools.formats.CallFormat", where)


def build_format(spec: Any, tool: Any = None) -> CallFormat:
    """The format ``spec`` names (``model.tool.format``), built with its ``init_args`` for the ``model.tool``
    group ``tool`` (None: for a prompt only), not yet bound to a tokenizer."""
    cls, (_, init_args) = format_class(spec), _entry(spec)
    try:
        fmt = cls.from_tool(tool, **init_args)
    except TypeError as error:
        raise ValueError(f"model.tool.format {format_label(spec)!r} init_args {init_args}: {error}; the settings are "
                         f"the arguments of {cls.__module__}.{cls.__qualname__}") from error
    found = {name: getattr(fmt, name, None) for name in ("call_start", "call_end", "output_start", "output_end")}
    bad = [name for name, value in found.items()
           if not isinstance(value, str) or (not value and name in ("call_start", "call_end"))]
    if bad:
        raise ValueError(f"model.tool.format {format_label(spec)!r}: {cls.__module__}.{cls.__qualname__} sets no "
                         f"string {', '.join(bad)} (call_start and call_end, the loop's stop strings, non-empty): "
                         "set them as class attributes or in __init__")
    return fmt


def format_label(spec: Any) -> str:
    """``model.tool.format`` as messages name it: the built-in name or the class path."""
    return _entry(spec)[0]


def call_format(tool: Any, tokenizer: Any = None) -> CallFormat:
    """The run's format: ``model.tool.format`` for the group ``tool`` (a ``zerotir.config.ToolConfig``), bound to
    ``tokenizer`` and ``tool.chat_template_kwargs`` (``chat`` requires a tokenizer with a chat template)."""
    fmt = build_format(tool.format, tool)
    fmt.bind(tokenizer, tool.chat_template_kwargs)
    return fmt


def markers(tool: Any) -> tuple[str, str, str, str]:
    """``call_start``, ``call_end``, ``output_start`` and ``output_end`` of ``model.tool.format`` (no tokenizer
    needed)."""
    fmt = build_format(tool.format, tool)
    return fmt.call_start, fmt.call_end, fmt.output_start, fmt.output_end


class FormatWatch:
    """Warns, once per run, after an RL step in which no response called a tool in ``model.tool.format`` but some
    wrote the call marker of a built-in format with another one (a base that writes ```` ```python ```` blocks run
    under hermes, or ``<tool_call>`` under fences): nothing fails then, the calls are plain text, tool use is 0 and
    so, mostly, is the reward.

    Args:
        tool: the ``model.tool`` group.
    """

    def __init__(self, tool: Any) -> None:
        self.tool, self.label = tool, format_label(tool.format)
        own = build_format(tool.format, tool).call_start
        self.others: dict[str, str] = {}  # call marker -> the first built-in format that writes it
        for name in BUILT_IN:
            marker = build_format(name, tool).call_start
            if marker != own:
                self.others.setdefault(marker, name)
        self.warned = False

    def update(self, step: int, texts: list[str], num_calls: Any) -> str | None:
        """Check one step's responses (``num_calls``: their calls in the configured format); the warning logged."""
        if self.warned or self.tool.max_tool_calls == 0 or not texts or bool((num_calls > 0).any()):
            return None
        for marker, other in self.others.items():
            seen = sum(marker in text for text in texts)
            if seen:
                break
        else:
            return None
        self.warned = True
        message = (f"RL step {step}: no response called a tool in model.tool.format={self.label}, but {seen} of "
                   f"{len(texts)} wrote {marker!r}, a call of the {other} format: the model writes its calls in "
                   f"another format than the configured one, so none runs and tool use stays 0. Set "
                   f"--model.tool.format {other} (a base that writes them), or start from a base of this format")
        logging.getLogger(__name__).warning(message)
        return message
