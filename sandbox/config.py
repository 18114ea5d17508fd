"""Execution settings shared by the server, its pool and its workers (plain data, JSON-serialisable).

The defaults suit model-written math snippets (see docs/sandbox.md, "Default limits"):

- ``run_timeout=5`` s: a sympy ``solve`` or a numpy computation takes milliseconds to a second; five seconds leaves
  room for a slow symbolic simplification and still frees a worker quickly when the model writes an infinite loop.
- ``memory_limit_mb=1024`` on top of the worker's own size: enough for arrays of ~10^8 floats, far below what would
  let a few concurrent snippets push the host into swap.
- ``max_output_bytes=32768`` per stream: the model only ever sees ~1 KB (``format_for_model``); the rest is kept so a
  human can debug, and capped so a print loop cannot fill the server's memory.
- ``max_processes=16``: math needs no processes; 16 leaves room for a small pool and stops a fork bomb early.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

#: Modules imported by every worker before it forks (so a snippet's ``import sympy`` costs nothing).
DEFAULT_PRELOAD: tuple[str, ...] = (
    "math", "cmath", "fractions", "decimal", "numbers", "itertools", "functools", "operator", "collections",
    "statistics", "re", "random", "string", "heapq", "bisect", "copy", "array", "enum", "typing", "dataclasses",
    "datetime", "time", "json", "io", "numpy", "sympy", "mpmath",
)

#: Top-level modules a snippet may import (the static check; ``"*"`` allows everything).
DEFAULT_ALLOWED_IMPORTS: tuple[str, ...] = (*DEFAULT_PRELOAD, "sys", "scipy", "pprint", "textwrap", "abc")

#: Calls refused by the static check: ways around the import check, and ``input`` (stdin is closed).
DEFAULT_REFUSED_CALLS: tuple[str, ...] = (
    "__import__", "eval", "exec", "compile", "input", "breakpoint", "importlib.import_module",
    "os.system", "os.popen", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.execv", "os.execve",
    "subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_output", "subprocess.check_call",
)

#: Run before every snippet (default on): the imports the paper's tool prompt relies on. The worker has already
#: imported these modules, so the preamble costs microseconds per call.
DEFAULT_PREAMBLE = (
    "import math, cmath, fractions, decimal, itertools, functools, collections, statistics, re, random\n"
    "from fractions import Fraction\n"
    "import numpy as np\n"
    "import sympy\n"
    "import sympy as sp\n"
)


@dataclass
class ExecConfig:
    """Limits and policy applied to every snippet; per-request values may lower or raise within the ``max_*`` bounds.

    Attributes:
        run_timeout: Default wall-time limit of a snippet in seconds (a request's ``run_timeout`` overrides it).
        max_run_timeout: The largest ``run_timeout`` a request may ask for; larger values are clamped (and said so).
        memory_limit_mb: Default memory budget in MB: address space *on top of* the worker's size at fork time, per
            process; with per-snippet cgroups also ``memory.max`` for the snippet and all it forks.
        max_memory_limit_mb: The largest ``memory_limit_MB`` a request may ask for.
        max_output_bytes: Bytes kept per stream (stdout, stderr); beyond it the middle is dropped with a marker.
        max_processes: RLIMIT_NPROC for the snippet's uid (only holds when the uid drop is on); ``pids.max`` of its
            cgroup.
        max_open_files: RLIMIT_NOFILE.
        max_file_size_mb: RLIMIT_FSIZE (largest file a snippet may write).
        tmpfs_size_mb: Size of each worker's private writable temp dir (a tmpfs when the mount layer is on); a
            request's ``files`` must fit in it.
        max_stdin_mb: Largest ``stdin`` a request may send (held in a sealed memfd while its snippet runs).
        max_fetch_mb: Most bytes of ``fetch_files`` one answer carries (before base64), all files together.
        preamble: Code run before each snippet in the same namespace, or None for no preamble.
        allow_imports: Top-level modules the static check lets a snippet import; ``["*"]`` allows all.
        refused_calls: Dotted call names the static check refuses (``"eval"``, ``"os.system"``).
        static_check: Run the static check at all (it is a courtesy to the model, not the security boundary).
        preload: Modules each worker imports before forking; missing ones are logged and skipped.
        uid_base: Snippets of worker ``i`` run as uid/gid ``uid_base + i`` (when the server runs as root); each
            server reserves its uids on the host (:mod:`sandbox.uids`), so two servers never share a process budget.
            None (the default) takes the first free block of 256 uids from 61000; a set value that another server
            holds is a start-up error.
        extra_ro: Host paths (folders or files) the minimal root exposes read-only, at the same path, on purpose
            (a data folder the snippets should read); each must exist. ``--extra-ro PATH`` adds one.
        isolate: Try the kernel layers (namespaces, minimal root, uid drop); False runs with rlimits only.
        require_isolation: Refuse to start when any isolation layer is unavailable (the cgroup budget aside: see
            ``require_cgroup``).
        cgroup_root: Where the cgroup v2 hierarchy is mounted; each snippet gets a cgroup of its own under the
            server's (``memory.max`` = its memory budget, ``pids.max`` = ``max_processes``, ``cpu.max``).
        cgroup_cpu_cores: ``cpu.max`` of each snippet's cgroup, in cores (all its processes together).
        require_cgroup: Refuse to start when per-snippet cgroups are unavailable, instead of using per-process
            rlimits.
    """

    run_timeout: float = 5.0
    max_run_timeout: float = 60.0
    memory_limit_mb: int = 1024
    max_memory_limit_mb: int = 8192
    max_output_bytes: int = 32768
    max_processes: int = 16
    max_open_files: int = 256
    max_file_size_mb: int = 16
    tmpfs_size_mb: int = 64
    max_stdin_mb: int = 4
    max_fetch_mb: int = 4
    preamble: str | None = DEFAULT_PREAMBLE
    allow_imports: list[str] = field(default_factory=lambda: list(DEFAULT_ALLOWED_IMPORTS))
    refused_calls: list[str] = field(default_factory=lambda: list(DEFAULT_REFUSED_CALLS))
    static_check: bool = True
    preload: list[str] = field(default_factory=lambda: list(DEFAULT_PRELOAD))
    uid_base: int | None = None
    extra_ro: list[str] = field(default_factory=list)
    isolate: bool = True
    require_isolation: bool = False
    cgroup_root: str = "/sys/fs/cgroup"
    cgroup_cpu_cores: float = 1.0
    require_cgroup: bool = False

    def __post_init__(self) -> None:
        positive = ("run_timeout", "max_run_timeout", "memory_limit_mb", "max_memory_limit_mb", "max_output_bytes",
                    "max_processes", "max_open_files", "max_file_size_mb", "tmpfs_size_mb", "cgroup_cpu_cores",
                    "max_stdin_mb", "max_fetch_mb")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"ExecConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.run_timeout > self.max_run_timeout:
            raise ValueError(f"ExecConfig.run_timeout ({self.run_timeout}) exceeds max_run_timeout "
                             f"({self.max_run_timeout}); raise --max_run_timeout or lower --run_timeout")
        if self.memory_limit_mb > self.max_memory_limit_mb:
            raise ValueError(f"ExecConfig.memory_limit_mb ({self.memory_limit_mb}) exceeds max_memory_limit_mb "
                             f"({self.max_memory_limit_mb}); raise --max_memory_limit_mb or lower --memory_limit_mb")
        if self.uid_base is not None and not 0 < self.uid_base < 2**31 - 1024:
            raise ValueError(f"ExecConfig.uid_base must be a positive unprivileged uid, got {self.uid_base}")
        if self.require_cgroup and not self.isolate:
            raise ValueError("ExecConfig.require_cgroup needs isolate: per-snippet cgroups are an isolation layer; "
                             "set --limits.isolate true or --limits.require_cgroup false")
        self.extra_ro = [os.path.abspath(p) for p in self.extra_ro]
        for path in self.extra_ro:
            if not os.path.exists(path):
                raise ValueError(f"ExecConfig.extra_ro: {path} does not exist; pass an existing folder or file "
                                 "(--extra-ro PATH)")
            if path == "/":
                raise ValueError("ExecConfig.extra_ro: '/' would expose the whole host; name the folders to expose")

    def to_json(self) -> str:
        """Serialise for a worker's command line."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ExecConfig:
        """Inverse of :meth:`to_json`."""
        return cls(**json.loads(text))


@dataclass
class WorkerSpec:
    """What one worker process needs to know about itself (sent on its command line)."""

    index: int
    exec_config: ExecConfig
    work_dir: str
    server_pid: int
    cgroup_subtree: dict[str, str] | None = None  # the server's budget spec (sandbox.budget), or None ...
    cgroup_off: str | None = None  # ... and why not
    uid_base: int | None = None  # the server's reserved snippet uids start here (None: no uid drop)

    def to_json(self) -> str:
        """Serialise for the worker's command line."""
        return json.dumps({**dataclasses.asdict(self), "exec_config": dataclasses.asdict(self.exec_config)})

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        """Inverse of :meth:`to_json`."""
        raw = json.loads(text)
        return cls(**{**raw, "exec_config": ExecConfig(**raw["exec_config"])})
