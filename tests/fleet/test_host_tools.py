"""An engine host's tools have a life of their own: built and started once per host, whatever the number of steps
and prompt groups it rolls out, and closed with it; a host whose tools do not include python needs no sandbox URL,
and the fleet's trainer starts no sandbox for it. One thread host over the tiny model of ``tiny_dir``, streaming."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.fleet.gated_engine import STREAM
from tests.fleet.test_engine_host import sender_model

import sandbox
from zerotir.config import HostsConfig, HFRollout, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.fleet import engine_host
from zerotir.fleet.engine_host import HostSettings
from zerotir.fleet.source import FleetSource
from zerotir.fleet.thread_host import ThreadTransport
from zerotir.models import load_tokenizer
from zerotir.rollout import agent_loop
from zerotir.tools import Toolbox
from zerotir.tools.sandbox_service import SandboxService

CALCULATOR = ToolConfig(format="hermes", tools=[{"class_path": "calculator"}])


class Counted(Toolbox):
    """The toolbox, recording every build, start and close in ``LIFE``."""

    LIFE: list[str] = []

    @classmethod
    def build(cls, *args, **kwargs) -> Toolbox:
        cls.LIFE.append("build")
        return super().build(*args, **kwargs)

    def start(self) -> None:
        self.LIFE.append("start")
        super().start()

    def close(self) -> None:
        self.LIFE.append("close")
        super().close()


class NoBuild:
    """Stands for ``Toolbox`` in the tool loop: a rollout that builds its own toolbox fails the test."""

    @staticmethod
    def build(*args, **kwargs):
        raise AssertionError("a rollout built a toolbox of its own: the host's, built once, must be used")


def refuse(*args, **kwargs):
    raise AssertionError("a sandbox was started or reached for tools without python")


@pytest.mark.timeout(120)
def test_a_host_builds_and_starts_its_tools_once_for_two_steps_of_streamed_groups(tiny_dir: Path, monkeypatch):
    monkeypatch.setattr(Counted, "LIFE", [])
    monkeypatch.setattr(engine_host, "Toolbox", Counted)
    monkeypatch.setattr(agent_loop, "Toolbox", NoBuild)
    monkeypatch.setattr(sandbox, "local_sandbox", refuse)
    monkeypatch.setattr(SandboxService, "start", refuse)
    source = FleetSource(HostsConfig(max_staleness=1, timeout_s=60.0, max_in_flight=1),
                         HFRollout(), SandboxConfig(), CALCULATOR,
                         SamplingConfig(n=1, max_response_tokens=4), None, str(tiny_dir), 0, ThreadTransport())
    try:
        source.start(sender_model(tiny_dir, seed=1), load_tokenizer(tiny_dir), "cpu", STREAM)
        host = source.hosts[0].host
        assert Counted.LIFE == ["build", "start"] and host.toolbox.names == ["calculator"]
        actor = source._actor
        first = source.batch(1)  # two prompt groups, each a tool loop of its own on the host's stream
        with torch.no_grad():
            actor.lm_head.weight.add_(1.0)
        source.after_update(actor, 1)
        second = source.batch(2)
        assert len(first.taken) == len(second.taken) == 2  # four groups in all, over two steps
        assert host.stream.tools is host.toolbox and Counted.LIFE == ["build", "start"]
        assert first.sandbox == second.sandbox == []  # no python: no sandbox started, reached or named
    finally:
        source.close()
    assert Counted.LIFE == ["build", "start", "close"]


def test_a_host_needs_sandbox_urls_only_for_the_python_tool(tiny_dir: Path) -> None:
    HostSettings(str(tiny_dir), HFRollout(), CALCULATOR).check()  # no sandbox to reach
    with pytest.raises(ValueError, match=r"HostSettings.sandbox_urls is empty but model.tool.tools include python"):
        HostSettings(str(tiny_dir), HFRollout(), ToolConfig()).check()
    python = FleetSource(HostsConfig(max_staleness=0), HFRollout(), SandboxConfig(),
                         ToolConfig(), SamplingConfig(), None, str(tiny_dir), 0, ThreadTransport())
    assert python.needs_sandbox and python.sandbox_names == ["<embedded local sandbox>"]
