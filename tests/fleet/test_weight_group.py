"""The weight group and its pushes on CPU (gloo): a sender and two engine processes, spawned.

The sender's process has a default gloo group of its own (world 1, formed first), as a trainer under Lightning has;
the weight group must live beside it. Each receiver holds an ``HFEngine`` over a tiny model with other random weights
than the sender's; after a push its parameters must equal the sender's bit for bit and it must decode greedily as the
sender's model does. A third, hand-made push carries mixed dtypes, a 0-dim, an empty and a non-contiguous tensor in
one bucket. Forming a group that a rank never joins, or whose sender never comes, fails within the timeout naming
the address (in this process: nothing to spawn).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tests.gloo import run_ranks
from tests.ports import free_port

from zerotir.fleet.weight_group import GroupAddress, WeightGroupError, form_weight_group
from zerotir.fleet.weight_push import PushStats, WeightSender, receive_push
from zerotir.rollout.engine import SamplingParams, generate
from zerotir.rollout.hf_engine import HFEngine
from zerotir.parallel.weight_sync import Bucket, plan_buckets, sync_weights
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

WORLD = 3  # the sender and 2 engine processes
BUCKET_BYTES = 1  # every layer a bucket of its own: several buckets per push
GROUP_TIMEOUT_S = 240.0  # hang guards: spawned processes import torch first, slowly on a loaded machine
SPAWN_TIMEOUT_S = 300.0
JOIN_TIMEOUT_S = 1.0
PROMPTS = ["Hello", "2+3="]


def _tiny(seed: int):
    tok = build_byte_tokenizer()
    return tok, build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=4, seed=seed).eval()


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Move every parameter (the norms' ones included), as an update would."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))


def _greedy(engine: HFEngine, tok) -> list[list[int]]:
    prompts = [tok.encode(p) for p in PROMPTS]
    return [s[0].token_ids for s in generate(engine, prompts, SamplingParams(temperature=0.0, max_new_tokens=12))]


def _mixed() -> Bucket:
    """One bucket of everything a push must carry: dtypes interleaved, a 0-dim, an empty, a transposed tensor."""
    gen = torch.Generator().manual_seed(5)
    return [("a", torch.randn(3, 4, generator=gen)), ("b", torch.randn(5, generator=gen).to(torch.bfloat16)),
            ("c", torch.tensor(7.5)), ("d", torch.arange(5)), ("e", torch.zeros(0, 3)),
            ("f", torch.tensor([True, False, True])), ("g", torch.arange(6.0).reshape(2, 3).t())]


class _Recorder:
    """An engine stand-in that keeps a copy of every bucket it is given."""

    def __init__(self) -> None:
        self.buckets: list[Bucket] = []

    def update_weights(self, named_tensors: Bucket) -> None:
        self.buckets.append([(name, t.clone()) for name, t in named_tensors])


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _sender(address: GroupAddress, default_port: int) -> dict:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{default_port}", rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        tok, model = _tiny(seed=0)
        sender = WeightSender(form_weight_group(address, 0, WORLD, "cpu", GROUP_TIMEOUT_S))
        out = {"planned_buckets": len(plan_buckets(model, BUCKET_BYTES)), "params": [], "sync": []}
        for version, seed in ((1, 11), (2, 12)):
            _perturb(model, seed)
            with sender.push(version):
                out["sync"].append(sync_weights(model, sender, bucket_bytes=BUCKET_BYTES))
            out["params"].append(_params(model))
        with sender.push(3):
            sender.update_weights(_mixed())
        out["stats"] = [asdict(s) for s in sender.pushes]
        out["greedy"] = _greedy(HFEngine(model, tok), tok)
        total = torch.tensor([3.0])
        dist.all_reduce(total)  # the default group, after the pushes
        out["default"] = (float(total), dist.get_world_size(), dist.get_backend())
        sender.stop()
        out["closed"] = sender.group.closed
        return out
    finally:
        dist.destroy_process_group()


def _receiver(address: GroupAddress, rank: int) -> dict:
    tok, model = _tiny(seed=100 + rank)  # other weights than the sender's until a push lands
    engine = HFEngine(model, tok)
    group = form_weight_group(address, rank, WORLD, "cpu", GROUP_TIMEOUT_S)
    out = {"before": _params(model), "versions": [], "params": []}
    for _ in range(2):
        out["versions"].append(receive_push(group, engine))
        out["params"].append(_params(model))
    out["greedy"] = _greedy(engine, tok)
    recorder = _Recorder()
    out["versions"].append(receive_push(group, recorder))
    out["mixed"] = recorder.buckets
    out["after_stop"] = receive_push(group, engine)
    out["closed"] = group.closed
    return out


def _worker(rank: int, port: int, default_port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    address = GroupAddress("127.0.0.1", port)
    out = _sender(address, default_port) if rank == 0 else _receiver(address, rank)
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("weights")
    port = free_port()
    default_port = free_port()
    while default_port == port:
        default_port = free_port()
    return run_ranks(_worker, (port, default_port, str(out)), WORLD, out, SPAWN_TIMEOUT_S)


@pytest.mark.timeout(600)
def test_every_receiver_gets_the_senders_weights_exactly(ranks: list[dict]) -> None:
    sender, receivers = ranks[0], ranks[1:]
    for got in receivers:
        assert got["versions"][:2] == [1, 2]
        for push in range(2):
            want = sender["params"][push]
            assert got["params"][push].keys() == want.keys() and len(want) == 21  # embed, 2 x 9, norm, lm_head
            assert all(torch.equal(got["params"][push][name], want[name]) for name in want)
        assert all(not torch.equal(got["before"][n], sender["params"][0][n]) for n in got["before"])
        assert all(not torch.equal(sender["params"][0][n], sender["params"][1][n]) for n in got["before"])


def test_a_receiver_decodes_as_the_sender(ranks: list[dict]) -> None:
    assert all(len(ids) == 12 for ids in ranks[0]["greedy"])
    assert ranks[1]["greedy"] == ranks[2]["greedy"] == ranks[0]["greedy"]


def test_each_push_reports_its_version_bytes_buckets_and_tensors(ranks: list[dict]) -> None:
    sender = ranks[0]
    nbytes = sum(t.numel() * t.element_size() for t in sender["params"][0].values())
    assert sender["planned_buckets"] == 5  # embed, layer 0, layer 1, norm, lm_head
    for push, (stats, sync) in enumerate(zip(sender["stats"][:2], sender["sync"])):
        assert stats["version"] == push + 1 and stats["seconds"] > 0
        assert (stats["bytes"], stats["buckets"], stats["tensors"]) == (nbytes, 5, 21)
        assert (sync["bytes"], sync["buckets"], sync["tensors"]) == (nbytes, 5, 21)
    mixed = _mixed()
    third = sender["stats"][2]
    assert (third["version"], third["buckets"], third["tensors"]) == (3, 1, 7)
    assert third["bytes"] == sum(t.numel() * t.element_size() for _, t in mixed) == 48 + 10 + 4 + 40 + 0 + 3 + 24


def test_a_bucket_of_mixed_dtypes_and_shapes_lands_in_order(ranks: list[dict]) -> None:
    want = _mixed()
    for got in ranks[1:]:
        assert got["versions"][2] == 3 and len(got["mixed"]) == 1
        bucket = got["mixed"][0]
        assert [name for name, _ in bucket] == [name for name, _ in want]
        for (_, g), (_, w) in zip(bucket, want):
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def test_stop_ends_the_group_and_the_default_group_still_works(ranks: list[dict]) -> None:
    assert ranks[0]["default"] == (3.0, 1, "gloo")
    assert ranks[0]["closed"] and all(r["closed"] and r["after_stop"] is None for r in ranks[1:])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rank,world,message", [
    (0, 3, r"at 127\.0\.0\.1:{port}, rank 0 of 3: rank\(s\) \[1, 2\] did not join within"),  # ranks that never join
    (1, 2, r"rank 1 of 2: rank 0 \(the trainer's sender\) did not answer at 127\.0\.0\.1:{port} within"),  # no sender
], ids=["missing_receivers", "missing_sender"])
def test_a_group_with_a_missing_side_fails_in_time_naming_it(rank: int, world: int, message: str) -> None:
    address = GroupAddress("127.0.0.1", free_port())
    start = time.monotonic()
    with pytest.raises(WeightGroupError, match=message.format(port=address.port)):
        form_weight_group(address, rank, world, timeout_s=JOIN_TIMEOUT_S)
    assert time.monotonic() - start < JOIN_TIMEOUT_S + 60


@pytest.mark.timeout(120)
def test_a_push_is_framed_and_checks_its_input() -> None:
    group = form_weight_group(GroupAddress("127.0.0.1", free_port()), 0, 1, timeout_s=10.0)  # a sender alone
    sender = WeightSender(group)
    with pytest.raises(RuntimeError, match="outside a push: call begin"):
        sender.update_weights([("a", torch.ones(2))])
    with pytest.raises(ValueError, match="receive_push runs on the engine processes"):
        receive_push(group, _Recorder())
    with pytest.raises(ValueError, match="version=-1"):
        sender.begin(-1)
    with pytest.raises(ZeroDivisionError), sender.push(4):
        sender.update_weights([("a", torch.ones(2))])
        raise ZeroDivisionError  # the push is aborted, the sender can push again
    with pytest.raises(ValueError, match="'z' has dtype torch.complex64"), sender.push(5):
        sender.update_weights([("z", torch.ones(2, dtype=torch.complex64))])
    sender.begin(6)
    with pytest.raises(RuntimeError, match="push 6 is still open"):
        sender.begin(7)
    sender.update_weights([("a", torch.ones(2)), ("b", torch.ones(3, dtype=torch.float16))])
    stats = sender.end()
    assert stats == PushStats(6, stats.seconds, 4 * 2 + 2 * 3, 1, 2) and sender.pushes == [stats]  # bytes: f32, f16
    sender.stop()
    with pytest.raises(WeightGroupError, match="the group is closed"):
        group.broadcast(torch.ones(1), "anything")


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"rank": 3, "world_size": 3}, "0 <= rank < world_size"),
    ({"rank": 0, "world_size": 2, "timeout_s": 0}, "timeout_s=0"),
    ({"rank": 0, "world_size": 2, "device": "meta"}, "device=meta"),
])
def test_bad_settings_are_refused_naming_them(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        form_weight_group(GroupAddress("127.0.0.1", free_port()), **kwargs)
    with pytest.raises(ValueError, match="port=0"):
        GroupAddress("127.0.0.1", 0)


def test_an_nccl_weight_group_is_built_to_raise_and_abandoned_by_abort(monkeypatch):
    """The NCCL half runs only on GPUs: the backend is built with TORCH_NCCL_ASYNC_ERROR_HANDLING at
    CleanUpOnly (a failed broadcast raises instead of the watchdog tearing the trainer down), a value the user set is
    kept, gloo is left alone; abandoning an NCCL group aborts its communicator instead of waiting on a dead peer."""
    from zerotir.fleet import weight_group as wg

    monkeypatch.delenv(wg.ASYNC_ERRORS, raising=False)
    with wg._errors_raise(torch.device("cuda", 0)):
        assert os.environ[wg.ASYNC_ERRORS] == wg.CLEAN_UP_ONLY
    assert wg.ASYNC_ERRORS not in os.environ
    with wg._errors_raise(torch.device("cpu")):
        assert wg.ASYNC_ERRORS not in os.environ
    monkeypatch.setenv(wg.ASYNC_ERRORS, "1")
    with wg._errors_raise(torch.device("cuda", 0)):
        assert os.environ[wg.ASYNC_ERRORS] == "1"

    calls = []
    backend = type("Backend", (), {"abort": lambda self: calls.append("abort"),
                                   "shutdown": lambda self: calls.append("shutdown")})()
    for device in ("cuda", "cpu"):
        group = wg.WeightGroup(None, backend, wg.GroupAddress("127.0.0.1", 1), 0, 2, torch.device(device), 1.0)
        group.abandon()
        group.abandon()  # idempotent
    assert calls == ["abort", "shutdown"]


def test_an_interrupted_group_aborts_nccl_once_and_refuses_every_later_collective():
    """``interrupt`` (the push watcher's call, from another thread) aborts an NCCL communicator so its
    pending collective raises, and is a no-op on gloo, whose waits cannot be cut from Python; either way the group's
    next collective raises at once, and ``abandon`` does not abort a second time."""
    from zerotir.fleet import weight_group as wg

    calls = []
    backend = type("Backend", (), {"abort": lambda self: calls.append("abort"),
                                   "shutdown": lambda self: calls.append("shutdown")})()
    cuda = wg.WeightGroup(None, backend, wg.GroupAddress("127.0.0.1", 1), 0, 2, torch.device("cuda"), 1.0)
    assert cuda.interrupt() is True and cuda.interrupt() is False
    with pytest.raises(wg.WeightGroupError, match="interrupted .a member's process died.; form a new group"):
        cuda.broadcast(torch.zeros(1), "a bucket")
    cuda.abandon()
    cpu = wg.WeightGroup(None, backend, wg.GroupAddress("127.0.0.1", 1), 0, 2, torch.device("cpu"), 1.0)
    assert cpu.interrupt() is False
    with pytest.raises(wg.WeightGroupError, match="interrupted"):
        cpu.share({"kind": "begin"})
    cpu.abandon()
    assert calls == ["abort", "shutdown"]
