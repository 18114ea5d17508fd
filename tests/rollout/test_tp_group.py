"""The ranks of one tensor-parallel engine submit the same requests (2 gloo processes, one group of tp = 2).

Each rank has its own scripted engine (a shard stand-in that records every request) and its own sandbox,
and rank 1's sandbox answers differently (as a rank's own sandbox, or its timing, would make it decide differently):
left to itself, rank 1 would send other contexts to its shard. Through ``TensorParallelGroup`` both shards must get
the identical request stream and both ranks return the same trajectories; validation rows that differ per rank are
merged, rolled out once by the group, and each rank gets back its own problems.
"""

from __future__ import annotations

import pytest

from tests.gloo import gloo_group, run_ranks, save_rank
from tests.ports import free_port

WORLD = 2
SPAWN_TIMEOUT_S = 90.0
PROMPT = "Q: 2+3?\n"
OTHER = "Q: 1+1?\n"
STEP = "Let me compute.\n```python\nprint(2+3)\n```"
ANSWER = "\nThe answer is \\boxed{5}."


def _worker(rank: int, port: int, out_dir: str) -> None:
    from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox, ok
    from zerotir.rollout.agent_loop import ToolConfig, rollout_sync
    from zerotir.rollout.engine import SamplingParams
    from zerotir.rollout.tp_group import TensorParallelGroup, own_trajectories
    from zerotir.toy.tokenizer import build_byte_tokenizer

    with gloo_group(rank, WORLD, port, timeout_s=30):
        tok = build_byte_tokenizer()
        scripts = {PROMPT: [[STEP, ANSWER]], OTHER: [[STEP, ANSWER]]}
        engine = ScriptedEngine(tok, scripts, n=2)
        sandbox = ScriptedSandbox(default=ok("5\n" if rank == 0 else "this rank's own answer\n"))
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=512, seed=3)
        group = TensorParallelGroup(2)

        def run(prompts):
            ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
            return group.rollout(engine, lambda e: rollout_sync(e, tok, sandbox, ids, params, ToolConfig()))

        results = {"leader": group.leader, "is_leader": group.is_leader, "shared": group.shared}
        traj, _ = run([PROMPT])  # training: the group's ranks hold the same prompts (shard_prompts)
        results["train_texts"] = traj.response_texts
        results["train_calls"] = [(c.key, c.text, c.params.stop, c.params.seed) for c in engine.calls]
        results["train_released"] = sorted(set(engine.released))
        results["train_left_running"] = engine.num_running
        # Validation: every rank has its own rows; the group rolls out the merged batch, each keeps its share.
        engine.calls.clear()
        rows, own = group.share_rows([PROMPT] if rank == 0 else [OTHER, PROMPT])
        traj, _ = run(rows)
        mine = own_trajectories(traj, own, len(rows), params.n)
        results["eval_rows"], results["eval_own"] = rows, (own.start, own.stop)
        results["eval_calls"] = [c.text for c in engine.calls]
        results["eval_mine_prompts"] = [tok.decode(ids[:n]) for ids, n in zip(mine.input_ids, mine.prompt_lens)]
        results["eval_mine_groups"] = mine.group_ids.tolist()  # index the merged rows (the module's problem ids)
        results["sandbox_calls"] = len(sandbox.codes)
        # An error in the leader's tool loop stops the group's other ranks too (they would wait forever).
        try:
            group.rollout(engine, lambda e: (_ for _ in ()).throw(ValueError("boom in the tool loop")))
        except Exception as exc:  # noqa: BLE001 (compared below)
            results["error"] = (type(exc).__name__, str(exc))
        save_rank(results, out_dir, rank)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("tp")
    return run_ranks(_worker, (free_port(), str(out)), WORLD, out, SPAWN_TIMEOUT_S)


@pytest.mark.timeout(150)
def test_both_shards_get_the_leaders_request_stream(ranks: list[dict]) -> None:
    r0, r1 = ranks
    assert (r0["leader"], r0["is_leader"], r0["shared"]) == (0, True, True)
    assert (r1["leader"], r1["is_leader"], r1["shared"]) == (0, False, True)
    # Each of the 2 trajectories: the prompt, the code block, then the text after the injected output of the LEADER's
    # sandbox ("5"), on both ranks, in the same order with the same seeds.
    assert len(r0["train_calls"]) == 6 and r1["train_calls"] == r0["train_calls"]
    assert all("this rank's own answer" not in text for _, text, _, _ in r1["train_calls"])
    assert r0["train_released"] == r1["train_released"] == [0, 1]
    assert r0["train_left_running"] == r1["train_left_running"] == 0
    assert r0["train_texts"] == r1["train_texts"] == [STEP + "\n```output\n5\n```\n" + ANSWER] * 2
    assert r0["sandbox_calls"] > 0 and r1["sandbox_calls"] == 0  # one rank decides


def test_validation_rows_are_merged_and_each_rank_keeps_its_own(ranks: list[dict]) -> None:
    r0, r1 = ranks
    assert r0["eval_rows"] == r1["eval_rows"] == [PROMPT, OTHER, PROMPT]
    assert r0["eval_own"] == (0, 1) and r1["eval_own"] == (1, 3)
    assert r0["eval_calls"] == r1["eval_calls"] and r0["eval_calls"][:6] == [PROMPT] * 2 + [OTHER] * 2 + [PROMPT] * 2
    assert r0["eval_mine_prompts"] == [PROMPT] * 2 and r1["eval_mine_prompts"] == [OTHER] * 2 + [PROMPT] * 2
    assert r0["eval_mine_groups"] == [0, 0] and r1["eval_mine_groups"] == [1, 1, 2, 2]


def test_an_error_in_the_leaders_loop_stops_the_group(ranks: list[dict]) -> None:
    assert ranks[0]["error"] == ("ValueError", "boom in the tool loop")
    assert ranks[1]["error"][0] == "RuntimeError"
    assert "rank 0, the leader" in ranks[1]["error"][1] and "ValueError: boom in the tool loop" in ranks[1]["error"][1]
