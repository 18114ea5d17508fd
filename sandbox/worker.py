"""``python -m sandbox.worker``: one pre-forked worker process of the sandbox pool.

The server starts each worker with ``exec`` and a scrubbed environment, so no secret of the server's environment is
anywhere in the worker's memory (a snippet that reads its own memory finds nothing). The worker imports the heavy
modules once, warms them up, enters its isolation layers, forks its zygote (:mod:`sandbox.zygote`, which forks
every snippet child and never holds a job), and then serves jobs one at a time over its stdin/stdout:
one JSON line in (a job), one JSON line out (the result). The first line in is the worker's :class:`WorkerSpec`;
the first line out is a handshake that lists which
protections are on and, for those that are off, why.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import sys
import traceback
from typing import Any, BinaryIO

from sandbox.budget import snippet_cgroups
from sandbox.cgroup import budget_layer
from sandbox.child import prepare_worker_process
from sandbox.config import WorkerSpec
from sandbox.executor import Executor, Job
from sandbox.isolation import (MNT_DETACH, PR_SET_PDEATHSIG, PidNamespaces, enter_namespaces, host_layers,
                               interpreter_paths, prctl, probe_readable, umount)
from sandbox.rootfs import FilesystemView, FreshProc, RootPlan, enter_minimal_root, host_view
from sandbox.rundir import RunDir
from sandbox.seccomp import Filter, build_filter, probe_child_layers
from sandbox.zygote import ZygoteGone

#: Run once at start-up so the lazy imports and caches behind common calls are already in the forked children.
WARMUP = """
import numpy, sympy
x = sympy.Symbol("x")
sympy.solve(x**2 - 2, x); sympy.simplify(sympy.sin(x)**2 + sympy.cos(x)**2); sympy.integrate(x**3, x)
sympy.factorint(360); sympy.Rational(1, 3) + 1; sympy.Matrix([[1, 2], [3, 4]]).det(); sympy.nsimplify(0.5)
sympy.factor(x**2 - 1); sympy.expand((x + 1)**3); sympy.isprime(97); sympy.binomial(10, 3); sympy.N(sympy.pi, 30)
sympy.limit(sympy.sin(x) / x, x, 0); sympy.summation(x, (x, 1, 10)); sympy.diff(sympy.exp(x), x); sympy.gcd(12, 18)
numpy.linalg.solve(numpy.eye(2), numpy.ones(2)); numpy.linspace(0, 1, 5).sum(); numpy.random.default_rng(0)
"""


def main(argv: list[str] | None = None) -> int:
    """Run the worker; returns the process exit code."""
    argv = sys.argv if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m sandbox.worker (started by the sandbox server, which sends its spec on stdin)",
              file=sys.stderr)
        return 2
    proto_in, proto_out = _take_protocol_fds()
    spec = WorkerSpec.from_json(proto_in.readline().decode())
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the server's death takes the worker (and, in turn, its child) down
    if os.getppid() != spec.server_pid:
        print(f"sandbox worker: parent is {os.getppid()}, not the server {spec.server_pid}; exiting", file=sys.stderr)
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on the server's terminal: the server stops us itself
    try:
        executor, handshake = _start(spec, (proto_in.fileno(), proto_out.fileno()))
    except Exception as e:  # reported to the server, which fails its start-up with this message
        _send(proto_out, {"ready": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return 1
    _send(proto_out, handshake)
    for line in proto_in:
        _send(proto_out, _serve_one(executor, line))
    return 0


def _take_protocol_fds() -> tuple[BinaryIO, BinaryIO]:
    """Move the protocol pipes off fds 0 and 1, so nothing printed by accident can corrupt the protocol."""
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return proto_in, proto_out


def _start(spec: WorkerSpec, protocol_fds: tuple[int, int]) -> tuple[Executor, dict[str, Any]]:
    config = spec.exec_config
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as e:
        raise RuntimeError(f"the sandbox needs pidfd_open (Linux >= 5.3, Python >= 3.9): {e}") from e
    missing = _preload(config.preload)
    if "numpy" in sys.modules and "sympy" in sys.modules:
        exec(compile(WARMUP, "<warmup>", "exec"), {})  # fixed trusted code
    layers: dict[str, str | None] = {"rlimits": None, "no_new_privs": None}
    uid = spec.uid_base + spec.index if (spec.uid_base is not None and os.geteuid() == 0) else None
    pidns = PidNamespaces(enabled=config.isolate)
    layers["pid_namespace"] = pidns.error
    cgroups = (snippet_cgroups(spec.cgroup_subtree, spec.index, config.cgroup_cpu_cores)  # before the pivot hides it
               if spec.cgroup_subtree is not None else None)
    layers["cgroup_budget"] = budget_layer(cgroups, spec.cgroup_off, config.max_processes)
    view = _isolate(spec, uid, pidns, layers)
    if uid is None:
        layers["uid_drop"] = ("disabled by --isolate false" if not config.isolate
                              else "the server does not run as root, so snippets keep its uid")
    else:
        layers["uid_drop"] = None
        layers["interpreter_readable"] = probe_readable(uid, interpreter_paths())
        if layers["interpreter_readable"] is not None:
            sys.meta_path.append(_UnreadableModuleFinder())
        unreadable = probe_readable(uid, config.extra_ro) if config.extra_ro else None
        if unreadable is not None:
            raise RuntimeError(f"--extra-ro: {unreadable}; make it readable by others (chmod -R o+rX) or drop it")
    fresh_proc = FreshProc(view.proc_options) if view.proc_options is not None else None
    no_mount = "disabled by --isolate false" if not config.isolate else layers.get("mount_namespace")
    run_dir = RunDir(view.run_dir, uid, config.tmpfs_size_mb, no_mount)
    layers["fresh_run_dir_tmpfs"] = run_dir.layer
    executor = Executor(config, run_dir, uid, pidns, fresh_proc, cgroups)
    layers.update(_child_layers(executor, config.isolate))
    prepare_worker_process(view.run_dir)
    gc.collect()
    gc.freeze()  # keeps the collector from touching (and so copying) the zygote's objects in every child
    executor.start_zygote(protocol_fds)  # forked now, before any job: the children it forks hold no job's data
    return executor, {"ready": True, "pid": os.getpid(), "uid": uid, "layers": layers,
                      "filesystem": view.to_dict(), "missing_preload": missing}


def _isolate(spec: WorkerSpec, uid: int | None, pidns: PidNamespaces, layers: dict[str, str | None]) -> FilesystemView:
    """Enter the namespaces and the minimal root (or the host view, with the reason); fills in ``layers``."""
    config = spec.exec_config
    host_run_dir = os.path.join(spec.work_dir, "run")
    fs_layers = ("minimal_root", "readonly_root", "private_tmpfs", "interpreter_exposed")
    if not config.isolate:
        off = "disabled by --isolate false"
        layers.update(dict.fromkeys(("network_namespace", "mount_namespace", *fs_layers), off))
        return host_view(off, host_run_dir)
    layers.update(enter_namespaces())
    if layers["mount_namespace"] is not None:
        layers.update(dict.fromkeys(fs_layers, layers["mount_namespace"]))
        return host_view(layers["mount_namespace"], host_run_dir)
    if uid is None:
        why = "the server does not run as root"
    elif not pidns.enabled:
        why = f"no PID namespace to give each snippet its own /proc: {pidns.error}"
    else:
        try:
            view = enter_minimal_root(RootPlan(uid, config.extra_ro, config.tmpfs_size_mb), spec.work_dir)
            layers.update(dict.fromkeys(fs_layers, None))
            return view
        except OSError as e:
            why = f"could not build the minimal root: {e}"
            with contextlib.suppress(OSError):
                umount(spec.work_dir, MNT_DETACH)  # the host view starts from the plain tree
    layers["minimal_root"] = why
    layers.update(host_layers(spec.work_dir, config.tmpfs_size_mb))
    return host_view(why, host_run_dir)


def _child_layers(executor: Executor, isolate: bool) -> dict[str, str | None]:
    """Probe each child's IPC namespace and seccomp filter once; a child enters only the ones that work."""
    if not isolate:
        return dict.fromkeys(("ipc_namespace", "seccomp"), "disabled by --isolate false")
    try:
        seccomp: Filter | None = Filter(build_filter())
    except OSError as e:
        seccomp, why = None, str(e)
    ipc, filt = probe_child_layers(seccomp)
    executor.plan.ipc_namespace = ipc is None
    executor.plan.seccomp = seccomp if filt is None else None
    return {"ipc_namespace": ipc, "seccomp": why if seccomp is None else filt}


def _preload(modules: list[str]) -> list[str]:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: one BLAS thread per worker
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
            print(f"sandbox worker: preload module {name!r} is not installed; snippets cannot use it",
                  file=sys.stderr)
    return missing


def _serve_one(executor: Executor, line: bytes) -> dict[str, Any]:
    try:
        job = Job.from_dict(json.loads(line))
    except (ValueError, KeyError, TypeError) as e:
        return {"id": -1, "reason": "sandbox_error", "error": f"malformed job message: {e}"}
    try:
        return executor.run(job)
    except ZygoteGone as e:  # the snippet never started: the server runs it on another worker and replaces us
        return {"id": job.id, "reason": "sandbox_error", "error": str(e), "started": False}
    except Exception as e:  # e.g. fork() failing under memory pressure: the server reports it
        print(f"sandbox worker: job {job.id} failed: {traceback.format_exc()}", file=sys.stderr)
        return {"id": job.id, "reason": "sandbox_error", "error": f"{type(e).__name__}: {e}"}


def _send(stream: BinaryIO, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


class _UnreadableModuleFinder:
    """Last meta-path finder when the snippet uid cannot read the interpreter: turn a confusing miss into advice."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        raise ModuleNotFoundError(
            f"No module named '{name}' (the sandbox can only import modules that are installed and either preloaded "
            f"by its workers or readable by the sandbox user; ask the operator to add it to --preload)", name=name)


if __name__ == "__main__":
    sys.exit(main())
