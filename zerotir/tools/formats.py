"""Call formats (``model.tool.format``): how the model writes a tool call and how the observation is written back.

A format is a parser + renderer pair with its own markers. The tool loop stops a segment on ``call_start`` (a call
opens), then on ``call_end`` (it closes); the text between them is the call (``parse``), and the observation goes
back as ``render(text)``, tokens the model did not sample (action 0). ``output_start`` / ``output_end`` are the
markers of that rendered block, which the trajectory filters count (``zerotir.filters.blocks``).

* ``fences``, the paper's and the default: a ```` ```python ```` block is a call of the ``python`` tool with the
  block as its code, and the observation comes back in ``model.tool.output_template`` (a ```` ```output ```` block).
  Its markers are ``model.tool.code_start`` / ``code_end``: byte for byte the loop before the tool plug-ins.
* ``hermes``, the JSON calls of Qwen2.5 / Qwen3 and the Hermes models: ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`` in, ``<tool_response>...</tool_response>`` out. Malformed JSON, a missing name or arguments
  that are not an object give an error observation the model reads (status ``invalid``), as an unknown tool name or
  arguments off the tool's schema do (``zerotir.tools.registry``).
* ``chat``, an instruct / thinking model's own chat template (``zerotir.tools.chat``): the calls are hermes's
  ``<tool_call>`` JSON (the Qwen2.5 / Qwen3 templates ask for it; a template that does not is refused), and the
  observation comes back as the template's tool turn: the assistant turn ends, a tool turn holds the observation,
  and a new assistant turn opens. The prompt is the template with the tools' schemas (the data's ``chat`` template).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["FORMATS", "Call", "CallFormat", "Chat", "Fences", "FormatWatch", "Hermes", "call_format", "markers"]


@dataclass(frozen=True)
class Call:
    """A parsed call: the tool's name and arguments, or ``error`` (then name and arguments are empty) saying why the
    text is not a call."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


class CallFormat:
    """A parser + renderer pair (see the module doc)."""

    call_start: str
    call_end: str
    output_start: str
    output_end: str

    def parse(self, block: str) -> Call:
        """The call written in ``block`` (the text between ``call_start`` and ``call_end``)."""
        raise NotImplementedError

    def render(self, text: str) -> str:
        """The text injected after a call: the observation's ``text`` in this format's output block."""
        raise NotImplementedError

    def check_tools(self, names: list[str]) -> None:
        """Raise ``ValueError`` when this format cannot call the configured tools ``names``."""


class Fences(CallFormat):
    """The paper's code fences (module doc); the markers and the output template come from ``model.tool``."""

    def __init__(self, tool: Any):
        self.call_start, self.call_end, self._template = tool.code_start, tool.code_end, tool.output_template
        head, _, tail = tool.output_template.partition("{output}")
        self.output_start, self.output_end = head.strip(), tail.strip()

    def parse(self, block: str) -> Call:
        return Call("python", {"code": block})

    def render(self, text: str) -> str:
        return self._template.format(output=text)

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

    def describe(self, schemas: list[dict[str, Any]]) -> str:
        """How to call the tools of ``schemas`` (``Tool.schema``) in this format, for a prompt
        (``zerotir.data.prompts``): the call's shape, where its result comes back, and each tool as its JSON schema
        on a line of its own."""
        tools = "\n".join(json.dumps(schema["function"]) for schema in schemas)
        return (f'You may call a tool to compute or check intermediate results: write {self.call_start}{{"name": '
                f'<tool name>, "arguments": <JSON object>}}{self.call_end}; the call runs right away and its result '
                f"is shown to you in a {self.output_start} block, after which you continue. The tools, as JSON "
                f"schemas:\n{tools}")


class Chat(Hermes):
    """Hermes's calls; the observation as the chat template's tool turn (module doc).

    Args:
        tokenizer: the model's tokenizer, whose chat template writes the tool turns.

    Raises:
        ValueError: no tokenizer, a tokenizer without a chat template, or a template without ``<tool_call>`` calls.
    """

    def __init__(self, tokenizer: Any):
        from zerotir.tools.chat import check_chat_format

        check_chat_format(tokenizer)
        self.tokenizer = tokenizer

    def render(self, text: str) -> str:
        from zerotir.tools.chat import tool_turn

        return tool_turn(self.tokenizer, text)


def _error(message: str) -> Call:
    return Call("", {}, message)


FORMATS = {"fences": Fences, "hermes": Hermes, "chat": Chat}


def call_format(tool: Any, tokenizer: Any = None) -> CallFormat:
    """The format of ``model.tool.format`` with the markers of that group (a ``zerotir.config.ToolConfig``);
    ``chat`` renders with ``tokenizer``'s chat template (required there)."""
    if tool.format == "chat":
        return Chat(tokenizer)
    return Fences(tool) if tool.format == "fences" else Hermes()


def markers(tool: Any) -> tuple[str, str, str, str]:
    """``call_start``, ``call_end``, ``output_start`` and ``output_end`` of ``model.tool.format`` (no tokenizer
    needed: chat's are hermes's)."""
    fmt = Fences(tool) if tool.format == "fences" else Hermes()
    return fmt.call_start, fmt.call_end, fmt.output_start, fmt.output_end


class FormatWatch:
    """Warns, once per run, after an RL step in which no response called a tool in ``model.tool.format`` but some
    wrote the other format's call marker (a base that writes ```` ```python ```` blocks run under hermes, or
    ``<tool_call>`` under fences): nothing fails then, the calls are plain text, tool use is 0 and so, mostly, is the
    reward.

    Args:
        tool: the ``model.tool`` group.
    """

    def __init__(self, tool: Any) -> None:
        self.tool = tool
        other = "hermes" if tool.format == "fences" else "fences"
        self.other, self.other_marker = other, (Hermes.call_start if other == "hermes" else tool.code_start)
        self.warned = False

    def update(self, step: int, texts: list[str], num_calls: Any) -> str | None:
        """Check one step's responses (``num_calls``: their calls in the configured format); the warning logged."""
        if self.warned or self.tool.max_tool_calls == 0 or not texts or bool((num_calls > 0).any()):
            return None
        seen = sum(self.other_marker in text for text in texts)
        if seen == 0:
            return None
        self.warned = True
        message = (f"RL step {step}: no response called a tool in model.tool.format={self.tool.format}, but {seen} of "
                   f"{len(texts)} wrote {self.other_marker!r}, a call of the {self.other} format: the model writes "
                   f"its calls in another format than the configured one, so none runs and tool use stays 0. Set "
                   f"--model.tool.format {self.other} (a base that writes them), or start from a base of this format")
        logging.getLogger(__name__).warning(message)
        return message
