"""zerotir's code sandbox: an isolated, fast, asynchronous Python execution service (SandboxFusion-compatible).

What it protects against (when the server runs as root on Linux; ``GET /health`` lists any layer that is off):

- runaway snippets: a wall-time kill of the whole process tree, CPU-time, address-space, file-size, open-file and
  process-count limits, and output capped in bytes while it is drained (a print loop cannot fill memory or hang);
- escapes into the host's processes: each snippet runs as a dedicated unprivileged uid, in its own session and PID
  namespace (it sees no other process to signal; when it ends, everything it started ends, daemons included), with
  ``no_new_privs`` (no setuid binary can give privileges back);
- the network: each worker has its own network namespace with only a loopback interface, which is down;
- the file system: each snippet runs in a **minimal root** (:mod:`sandbox.rootfs`) that holds the Python runtime
  read-only (the installations behind ``sys.prefix``/``sys.base_prefix``, the folders of the loaded modules and of
  the shared libraries the worker maps), a generated ``/etc``, four devices (null, zero, random, urandom), a ``/proc``
  of its own PID namespace, the folders the operator exposes on purpose (``--extra-ro``), and one writable folder:
  its private size-capped tmpfs temp dir (cwd, ``HOME``, ``TMPDIR``), emptied after each call. No project checkout,
  data, checkpoints, host ``/tmp``, ``/home``, ``/root`` or ``/sys``; ``/proc`` lists its own processes only;
- the server's secrets: workers are exec'd with a scrubbed environment, so none is in their memory or environment.

What a snippet CAN still see: everything inside the exposed folders (the whole virtualenv and Python installation,
the system library folders), and the host paths of those folders (in ``/proc/self/mountinfo``). ``GET /health``
lists them (``exposed_paths``).

What it does NOT protect against:

- kernel exploits: this is namespaces + rlimits + an unprivileged uid, not a VM or gVisor; run it in a container or
  VM of its own for untrusted users (the model's snippets are buggy far more often than hostile);
- the host's files where the platform cannot build the minimal root (not root, no mount or PID namespace):
  ``/health`` then says ``filesystem_view: host`` with the reason, and a snippet reads every world-readable file;
- CPU starvation of other work on the host by up to ``workers`` busy snippets (size the pool to the cores you give it);
- anything at all when run without root: then only the rlimits, the time kill and the static check apply.

The static check (:mod:`sandbox.policy`) is a courtesy to the model, not a security boundary.

Client API (importing it does not import the web server stack)::

    from sandbox import SandboxClient, format_for_model, local_sandbox
    with local_sandbox(workers=2) as urls:
        client = SandboxClient(urls)
        result = asyncio.run(client.run("print(1 + 1)"))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.client import SandboxClient, SandboxUnavailable
    from sandbox.local import local_sandbox
    from sandbox.result import ExecResult, ExecStatus, format_for_model
    from sandbox.session import CodeSession

# Resolved on first use, so a worker process (``python -m sandbox.worker``) does not import httpx for nothing.
_EXPORTS = {"SandboxClient": "client", "SandboxUnavailable": "client", "local_sandbox": "local",
            "ExecResult": "result", "ExecStatus": "result", "format_for_model": "result", "CodeSession": "session"}

__all__ = ["CodeSession", "ExecResult", "ExecStatus", "SandboxClient", "SandboxUnavailable", "format_for_model",
           "local_sandbox"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"sandbox.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
