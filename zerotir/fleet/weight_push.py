"""One weight push from the trainer to the engine processes of a weight group, bucket by bucket, with its version.

``WeightSender`` (rank 0) is a ``zerotir.parallel.weight_sync.WeightReceiver``, so ``sync_weights(actor, sender,
bucket_bytes)`` drives a push unchanged, a bucket of whole layers at a time (ZeRO-3 gathers included). Each bucket
goes as a small manifest (names, shapes, dtypes: a ``WeightGroup.share`` message) and then one flat broadcast per dtype
(its tensors' bytes, concatenated, so any dtype crosses gloo and NCCL alike). ``receive_push`` in an engine process
rebuilds each bucket as views of those buffers and hands it to ``engine.update_weights`` as it arrives, so an engine
process holds at most one bucket besides its model. A push is framed by ``begin(version)`` / ``end()`` (or ``with
sender.push(version):``): the receivers learn its version and that it is complete (the bucket and tensor counts must
match). With a LoRA actor (a ``peft.PeftModel``) a push carries only its adapter: the adapter's settings in the
``begin`` message, its tensors in one bucket, handed whole to ``engine.update_adapter`` at the push's end (an engine that declares no
adapter path refuses it). ``stop`` ends the group on every side. An engine process calls ``receive_push`` when a push
is announced to it (the fleet's actors do); one that waits longer than the group's timeout for the sender fails.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from zerotir.fleet.weight_group import SENDER, WeightGroup, WeightGroupError
from zerotir.lora import is_adapted
from zerotir.rollout.engine import EngineWeights
from zerotir.rollout.vllm_lora import actor_adapter
from zerotir.parallel.weight_sync import DEFAULT_BUCKET_BYTES, Bucket, WeightReceiver, sync_weights

_BEGIN, _BUCKET, _END, _ABORT, _STOP = "begin", "bucket", "end", "abort", "stop"
# The dtypes a push carries, by the name its manifest gives them.
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


@dataclass(frozen=True)
class PushStats:
    """One push, as the sender saw it."""

    version: int
    seconds: float  # begin to end, the gathering of the buckets (ZeRO-3) included
    bytes: int  # tensor bytes sent; the manifests are left out
    buckets: int
    tensors: int


class WeightSender:
    """The trainer's end of the group (rank 0): a ``WeightReceiver`` that broadcasts each bucket to the engine
    processes, so ``sync_weights(actor, sender, bucket_bytes)`` drives a push.

    One push: ``begin(version)``, the buckets, ``end()``; or ``with sender.push(version):``. ``pushes`` keeps each
    push's ``PushStats``. ``stop`` ends the group for every process.
    """

    def __init__(self, group: WeightGroup):
        if group.rank != SENDER:
            raise ValueError(f"{group}: a WeightSender runs on rank {SENDER}; the engine processes call receive_push")
        self.group = group
        self.pushes: list[PushStats] = []
        self._version: int | None = None
        self._start = 0.0
        self._counts = [0, 0, 0]  # bytes, buckets, tensors of the push in progress

    def begin(self, version: int, adapter: dict[str, Any] | None = None) -> None:
        """Start push ``version`` (the trainer's step, >= 0); ``adapter``: the push is a LoRA adapter with these
        settings (``zerotir.rollout.vllm_lora.adapter_config``), not weights."""
        if self._version is not None:
            raise RuntimeError(f"WeightSender.begin({version}): push {self._version} is still open; end() it first")
        if version < 0:
            raise ValueError(f"WeightSender.begin(version={version}): a version is >= 0 (the trainer's step)")
        self.group.share({"kind": _BEGIN, "version": version, "adapter": adapter})
        self._version, self._start, self._counts = version, time.perf_counter(), [0, 0, 0]

    def update_weights(self, named_tensors: Bucket) -> None:
        """Broadcast one bucket of ``(HF name, tensor)``: its manifest, then one flat buffer per dtype."""
        if self._version is None:
            raise RuntimeError("WeightSender.update_weights outside a push: call begin(version) first, or use "
                               "`with sender.push(version): sync_weights(actor, sender, ...)`")
        bucket = list(named_tensors)
        specs = [[name, list(t.shape), _dtype_name(name, t.dtype)] for name, t in bucket]
        flats = _flats(bucket, self.group.device)  # before the manifest: only the transport can fail after it
        self.group.share({"kind": _BUCKET, "tensors": specs})
        for flat in flats:
            self.group.broadcast(flat, f"the {flat.numel()}-byte buffer of a bucket")
        self._counts[0] += sum(flat.numel() for flat in flats)
        self._counts[1] += 1
        self._counts[2] += len(bucket)

    def end(self) -> PushStats:
        """Close the open push; its receivers then return its version."""
        if self._version is None:
            raise RuntimeError("WeightSender.end() without begin(version)")
        nbytes, buckets, tensors = self._counts
        self.group.share({"kind": _END, "version": self._version, "buckets": buckets, "tensors": tensors})
        stats = PushStats(self._version, time.perf_counter() - self._start, nbytes, buckets, tensors)
        self.pushes.append(stats)
        self._version = None
        return stats

    @contextlib.contextmanager
    def push(self, version: int, adapter: dict[str, Any] | None = None) -> Iterator[WeightSender]:
        """``begin(version, adapter)`` ... ``end()``. An error inside tells the receivers the push is aborted (they raise it)
        unless the transport itself failed, then propagates."""
        self.begin(version, adapter)
        try:
            yield self
        except BaseException as exc:
            self.abort(exc)
            raise
        self.end()

    def abort(self, cause: BaseException) -> None:
        """Drop the open push: unless the transport itself failed (``WeightGroupError``), the receivers are told it
        was aborted, and raise."""
        version, self._version = self._version, None
        if version is not None and not isinstance(cause, WeightGroupError):
            with contextlib.suppress(WeightGroupError):
                self.group.share({"kind": _ABORT, "version": version, "reason": f"{type(cause).__name__}: {cause}"})

    def stop(self) -> None:
        """Tell every receiver the group ends, then leave it (after them)."""
        if self._version is not None:
            raise RuntimeError(f"WeightSender.stop() while push {self._version} is open; end() it first")
        self.group.share({"kind": _STOP})
        self.group.close()


class KeepGathering:
    """A push's receiver that never stops the gathers: each bucket goes to ``sender`` until the transport fails
    (``failure``); after that the buckets are still taken, and dropped. Under ZeRO-3 the gathers are collectives of
    every training rank, so rank 0 must finish them with the others whatever happens to the engines."""

    def __init__(self, sender: WeightSender):
        self.sender = sender
        self.failure: WeightGroupError | None = None

    def update_weights(self, named_tensors: Bucket) -> None:
        if self.failure is None:
            try:
                self.sender.update_weights(named_tensors)
            except WeightGroupError as exc:
                self.failure = exc


def push_weights(sender: WeightSender, model: nn.Module, version: int,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> PushStats:
    """``model``'s weights to every receiver as push ``version``, bucket by bucket (``sync_weights``). Every bucket
    is gathered (ZeRO-3) even after the transport failed, at the push's start or in a bucket, so that the other
    training ranks' gathers finish with this one's; the failure is raised after the last bucket.

    Raises:
        WeightGroupError: the transport failed (a receiver died, a timeout); the receivers left hold a mix of versions.
    """
    if is_adapted(model):
        return push_adapter(sender, model, version)
    relay = KeepGathering(sender)
    try:
        sender.begin(version)
    except WeightGroupError as exc:
        relay.failure = exc
    try:
        sync_weights(model, relay, bucket_bytes)
    except BaseException as exc:
        sender.abort(exc if relay.failure is None else relay.failure)
        raise
    if relay.failure is not None:
        sender.abort(relay.failure)
        raise relay.failure
    return sender.end()


def push_adapter(sender: WeightSender, model: nn.Module, version: int) -> PushStats:
    """A LoRA actor's adapter (``peft.get_peft_model_state_dict``) to every receiver as push ``version``: its
    settings in the ``begin`` message, its tensors in one bucket; the base weights stay where they are. Under ZeRO-3
    the adapter is gathered first, with every training rank (``FleetWeights.join_push``)."""
    with actor_adapter(model) as (tensors, config), sender.push(version, adapter=config):
        sender.update_weights(list(tensors.items()))
    return sender.pushes[-1]


def receive_push(group: WeightGroup, engine: EngineWeights) -> int | None:
    """On an engine process (rank >= 1): receive one push, each bucket into ``engine.update_weights`` as it arrives
    (one bucket in memory at a time). Returns the push's version, or None when the sender stopped the group (it is
    then closed here).

    Raises:
        WeightGroupError: the sender aborted the push (the engine then holds a mix of two versions until the next
            one lands), sent something out of order, or did not answer within the group's timeout.
        ValueError: a LoRA push into an engine that takes no adapters (``EngineWeights.adapter_path``), raised once
            the push is received whole.
    """
    if group.rank == SENDER:
        raise ValueError(f"{group}: receive_push runs on the engine processes (rank >= 1); rank 0 has WeightSender")
    first = group.share(None)
    if first["kind"] == _STOP:
        group.close()
        return None
    if first["kind"] != _BEGIN:
        raise WeightGroupError(f"{group}: a push starts with {_BEGIN!r}, got {first['kind']!r}")
    version, buckets, tensors = first["version"], 0, 0
    adapter, adapter_tensors = first.get("adapter"), []  # a LoRA push: its tensors go to the engine at the end
    while True:
        message = group.share(None)
        if message["kind"] == _BUCKET:
            bucket = _receive_bucket(group, message["tensors"])
            if adapter is None:
                engine.update_weights(bucket)
            else:
                adapter_tensors.extend(bucket)
            buckets, tensors = buckets + 1, tensors + len(bucket)
            del bucket
        elif message["kind"] == _END:
            if (message["buckets"], message["tensors"]) != (buckets, tensors):
                raise WeightGroupError(f"{group}: push {version} ended after {message['buckets']} buckets and "
                                       f"{message['tensors']} tensors; this rank received {buckets} and {tensors}")
            if adapter is not None and engine.adapter_path(None) != "adapter":
                raise ValueError(f"{group}: push {version} is a LoRA adapter but this engine "
                                 f"({type(engine).__name__}) serves no adapters; start a vLLM engine with lora_rank "
                                 "(model.base.lora.rank) or a transformers engine")
            if adapter is not None:
                engine.update_adapter(dict(adapter_tensors), adapter)
            return version
        elif message["kind"] == _ABORT:
            raise WeightGroupError(f"{group}: the sender aborted push {version} ({message['reason']}); this engine "
                                   f"holds a mix of versions until the next push lands")
        else:
            raise WeightGroupError(f"{group}: unexpected {message['kind']!r} inside push {version}")


def _dtype_name(name: str, dtype: torch.dtype) -> str:
    key = str(dtype).removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"{name!r} has dtype {dtype}; a push carries {sorted(_DTYPES)}")
    return key


def _flats(bucket: Bucket, device: torch.device) -> list[torch.Tensor]:
    """The bucket's tensors as one flat uint8 buffer per dtype (dtypes in order of first appearance, empty ones
    left out), on ``device``."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for _, tensor in bucket:
        by_dtype.setdefault(tensor.dtype, []).append(tensor.detach().reshape(-1).to(device))
    flats = [torch.cat(parts).view(torch.uint8) for parts in by_dtype.values()]
    return [flat for flat in flats if flat.numel()]


def _receive_bucket(group: WeightGroup, specs: list[list[Any]]) -> Bucket:
    """The bucket a manifest announces: its per-dtype buffers received, each tensor a view of its dtype's buffer."""
    numels: dict[torch.dtype, int] = {}
    for _, shape, dtype in specs:
        numels[_DTYPES[dtype]] = numels.get(_DTYPES[dtype], 0) + math.prod(shape)
    flats: dict[torch.dtype, torch.Tensor] = {}
    for dtype, numel in numels.items():
        buffer = torch.empty(numel * dtype.itemsize, dtype=torch.uint8, device=group.device)
        if numel:
            group.broadcast(buffer, f"the {buffer.numel()}-byte buffer of a bucket")
        flats[dtype] = buffer.view(dtype)
    offsets = dict.fromkeys(numels, 0)
    bucket: Bucket = []
    for name, shape, dtype_name in specs:
        dtype, numel = _DTYPES[dtype_name], math.prod(shape)
        bucket.append((name, flats[dtype][offsets[dtype]: offsets[dtype] + numel].view(shape)))
        offsets[dtype] += numel
    return bucket
