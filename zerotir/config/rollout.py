"""What the rollouts do: the code interpreter (``model.tool``), sampling (``model.sampling`` / ``model.eval.sampling``,
with the evaluation's report folder: ``model.eval``) and where code runs (``model.tool.sandbox``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zerotir.config.checks import check_min, check_sampling

_TOOL_ENTRY_KEYS = {"class_path", "init_args"}


@dataclass(frozen=True)
class SandboxConfig:
    """Where code runs (``model.tool.sandbox``, the python tool's executor): configured servers, or an embedded local
    server started for the run."""

    urls: list[str] | None = None
    """Sandbox servers (``python -m sandbox serve``); None starts an embedded local server for the run."""
    workers: int | None = None
    """Worker processes of the embedded server (None: one per core). Embedded server only."""
    server_options: dict[str, Any] = field(default_factory=dict)
    """Further options of the embedded server: ``queue_size``, ``startup_timeout``, ``log_level``, ``head_timeout``
    or any field of ``sandbox.config.ExecConfig`` (``memory_limit_mb``, ``allow_imports``, ``extra_ro`` folders
    exposed read-only, ...). Embedded server only."""
    max_concurrency: int = 64
    """Requests in flight from the trainer to the sandbox."""
    request_timeout: float = 60.0
    """Seconds one HTTP request may take."""
    retries: int = 3
    """Retries of a request that failed to reach a server (another server is tried first)."""
    max_per_server: int | None = None
    """Most requests of one client (the trainer's, each engine's) in flight on one sandbox server; a request finding
    every server at the bound waits for a slot. With several servers each request goes to the one with the fewest
    in flight. None: only max_concurrency bounds them."""
    max_error_rate: float = 0.5
    """Highest tolerated share of tool calls that failed in the sandbox or in their tool (not the model's errors)."""
    error_patience: int = 3
    """Consecutive RL steps above that rate that stop the run."""

    def __post_init__(self) -> None:
        if self.urls is not None and not self.urls:
            raise ValueError("model.tool.sandbox.urls=[]: give at least one URL, or null for an embedded local sandbox")
        if self.urls is not None and (self.workers is not None or self.server_options):
            given = {"workers": self.workers} if self.workers is not None else {}
            given.update({"server_options": self.server_options} if self.server_options else {})
            unset = " ".join("--model.tool.sandbox.workers null" if k == "workers"
                             else "--model.tool.sandbox.server_options {}" for k in given)
            raise ValueError(f"model.tool.sandbox.urls={self.urls} with model.tool.sandbox."
                             f"{', '.join(f'{k}={v}' for k, v in given.items())}: those configure the embedded server, "
                             f"which is not started when urls is set (the toy configs set workers: 2). Unset them "
                             f"(on the command line: {unset}), or set urls to null")
        check_min("tool.sandbox", self, ("workers", "max_concurrency", "error_patience"), 1)
        check_min("tool.sandbox", self, ("retries",), 0)
        check_min("tool.sandbox", self, ("max_per_server",), 1, " (or null: no bound per server)")
        if self.request_timeout <= 0:
            raise ValueError(f"model.tool.sandbox.request_timeout={self.request_timeout}: must be > 0 seconds")
        if not 0 <= self.max_error_rate <= 1:
            raise ValueError(f"model.tool.sandbox.max_error_rate={self.max_error_rate}: must be in [0, 1]")

    @property
    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of ``sandbox.SandboxClient``."""
        return {"max_concurrency": self.max_concurrency, "request_timeout": self.request_timeout,
                "retries": self.retries, "max_per_server": self.max_per_server}

    @property
    def local_options(self) -> dict[str, Any]:
        """Keyword arguments of ``sandbox.local_sandbox`` for the embedded server."""
        return dict(self.server_options, **({} if self.workers is None else {"workers": self.workers}))


@dataclass(frozen=True)
class ToolConfig:
    """How the model calls its tools during a rollout (``model.tool``): the code interpreter by default."""

    max_tool_calls: int = 4
    """Tool calls (code blocks with fences) per response (the paper allows 20); after that the call stops are removed
    and the model must finish in text. 0 = no tool at all (the paper's ZeroRL baseline: no sandbox is started)."""
    max_output_chars: int = 512
    """The injected output is cut to this many characters (head + tail with a marker)."""
    max_output_tokens: int | None = 256
    """Then cut to this many tokens of the model's tokenizer (head + tail with a marker): a character cap does not
    bound tokens (Qwen2.5 spends one token per digit). The paper's public code replaces results longer than 256
    tokens by a short message; ToRL keeps head and tail. None = characters only."""
    run_timeout: float = 5.0
    """Wall-time limit of one execution in the sandbox, seconds."""
    code_start: str = "```python"
    """The stop string that opens a code block (first phase)."""
    code_end: str = "```"
    """The stop string that closes it (second phase)."""
    output_template: str = "\n```output\n{output}\n```\n"
    """The injected block; ``{output}`` is replaced by the formatted result."""
    format: str | dict[str, Any] = "fences"
    """How the model writes a call, the format's markers read by the tool loop and the filters and its part of the
    prompt (``zerotir.tools.formats``): a built-in name, "fences" (the paper's ```python block, its output in
    ``output_template``; calls the python tool only) or "hermes" (``<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>``, the observation in ``<tool_response>``; any of ``tools`` by name) or "chat" (an instruct /
    thinking model's own chat template: the prompt with the tools' schemas, needs data.template: chat; hermes's
    calls; each observation as the template's tool turn); or a format of your own, ``{class_path: module.Class,
    init_args: {...}}`` (a ``CallFormat`` subclass, docs/extending.md). code_start, code_end and output_template are
    the fences' markers: with another format they must keep their defaults."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the tokenizer's ``apply_chat_template`` wherever zerotir applies the chat template (the
    data's ``chat`` prompt, the ``chat`` format's tool turn), e.g. ``{enable_thinking: false}``: Qwen3's non-thinking
    mode. A key the template never reads is refused; needs data.template: chat."""
    tools: list[dict[str, Any]] = field(default_factory=lambda: [{"class_path": "python"}])
    """The tools the model may call: ``class_path`` entries with their ``init_args`` (``zerotir.tools.registry``):
    a built-in name (python, calculator, search) or the dotted path of a ``zerotir.tools.Tool`` subclass. They live
    in this group rather than as a parameter of the module of their own (docs/tools.md)."""

    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Where the python tool's code runs (URLs, or the embedded server's options) and how many sandbox failures stop
    a run (``model.tool.sandbox``; it was ``model.sandbox``)."""

    def __post_init__(self) -> None:
        if self.sandbox.urls is not None and not self.enabled:
            raise ValueError("model.tool.sandbox.urls is set but model.tool.max_tool_calls=0 runs no code: drop the "
                             "urls or allow tool calls")
        check_min("tool", self, ("max_tool_calls",), 0, " (0 = no tool)")
        check_min("tool", self, ("max_output_chars",), 80, " (room for a message and the truncation marker)")
        check_min("tool", self, ("max_output_tokens",), 32, " or null (room for a message and the marker)")
        if not self.code_start or not self.code_end:
            raise ValueError("model.tool.code_start and code_end must be non-empty stop strings")
        if "{output}" not in self.output_template:
            raise ValueError(f"model.tool.output_template must contain '{{output}}', got {self.output_template!r}")
        if self.run_timeout <= 0:
            raise ValueError(f"model.tool.run_timeout={self.run_timeout}: must be > 0 seconds")
        self._check_format_and_tools()
        self._check_sandbox_used()

    def _check_sandbox_used(self) -> None:
        """Sandbox servers named with no python tool among the tools would never be called: refused, not unused."""
        from zerotir.tools.python import sandbox_needed  # the tools import no config

        if self.sandbox.urls is not None and not sandbox_needed(self):
            raise ValueError(f"model.tool.sandbox.urls={self.sandbox.urls} but the tools of model.tool include no "
                             "python tool: nothing would run code on those servers; drop model.tool.sandbox.urls or "
                             "add the python tool to model.tool.tools")

    def _check_format_and_tools(self) -> None:
        from zerotir.tools.formats import build_format, format_class, format_label  # the tools import no config
        from zerotir.tools.registry import resolve

        fmt = format_class(self.format)  # an unknown name, or a path naming no format, is refused here
        fences = ToolConfig.__dataclass_fields__
        changed = [k for k in ("code_start", "code_end", "output_template")
                   if k not in fmt.tool_fields and getattr(self, k) != fences[k].default]
        if changed:
            raise ValueError(f"model.tool.{', '.join(changed)} set with model.tool.format="
                             f"{format_label(self.format)!r}: those are the fences' markers, which this format does "
                             "not use; unset them or use format: fences")
        if not isinstance(self.chat_template_kwargs, dict):
            raise ValueError(f"model.tool.chat_template_kwargs={self.chat_template_kwargs!r}: write a mapping, e.g. "
                             "{enable_thinking: false}")
        if self.enabled and not self.tools:
            raise ValueError("model.tool.tools is empty: list at least one tool (e.g. [{class_path: python}]), or set "
                             "model.tool.max_tool_calls=0 for no tool")
        for entry in self.tools:
            if (not isinstance(entry, dict) or not isinstance(entry.get("class_path"), str)
                    or set(entry) - _TOOL_ENTRY_KEYS):
                raise ValueError(f"model.tool.tools entry {entry!r}: write {{class_path: <name or module.Class>, "
                                 "init_args: {...}}} (only those two keys)")
            resolve(entry["class_path"])  # a path that does not import, or names no Tool, is refused here
        built = build_format(self.format, self)  # its init_args checked now, not at the rollout
        if self.enabled:  # a format that cannot call these tools (fences: python only) is refused now too
            built.check_tools([resolve(entry["class_path"]).name for entry in self.tools])

    @property
    def enabled(self) -> bool:
        """Whether the model may run code at all (else no sandbox is needed)."""
        return self.max_tool_calls > 0


@dataclass(frozen=True)
class SamplingConfig:
    """How rollouts are sampled (``model.sampling`` for training, ``model.eval.sampling`` for validation / test)."""

    n: int = 8
    """Samples per prompt (evaluation: avg@k and pass@k with k = n)."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    max_response_tokens: int = 1024
    """Response budget per trajectory, sampled + injected tool output; reaching it truncates (reward 0)."""

    def __post_init__(self) -> None:
        check_sampling("model.[eval.]sampling", self.n, self.temperature, self.top_p,
                       ("max_response_tokens", self.max_response_tokens))


EVAL_SAMPLING = SamplingConfig(n=1, temperature=0.0)


@dataclass(frozen=True)
class EvalConfig:
    """Validation and test (``model.eval``): the same rollout path as training with a sampling of their own, reports
    written by ``zerotir.eval.report``."""

    sampling: SamplingConfig = EVAL_SAMPLING
    """Sampling of validation / test rollouts (avg@k and pass@k with k = its n); greedy, one sample by default."""
    report_dir: str | None = None
    """Where evaluation reports go; null: <trainer.default_root_dir>/eval."""
