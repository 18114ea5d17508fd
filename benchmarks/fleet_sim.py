"""A discrete-event simulation of the RL step's schedule: in line, batch shares and streaming, with K engines, N
training devices, the staleness bound S and (streaming) ``max_in_flight`` per engine. ``benchmarks.fleet_model``
runs it; it measures nothing itself.

The rules it models, each the product's (docs/fleet.md):

- an engine decodes all its trajectories that are not in a tool call together, one token each per decode step of
  ``1 / tokens_per_s_batch1 + (b - 1) / tokens_per_s_saturated`` seconds at b trajectories (its batch-size curve);
  between two events the batch does not change, so every one of them advances alike (token counts are continuous);
- a trajectory's response is cut into ``calls + 1`` equal segments; between two, it waits ``tool_call_latency_s``
  out of the decode batch but still in flight;
- the trainer's step: wait for its data, ``trainer_other_s`` (collect, score, check), the update
  (``update_fixed_s + tokens * update_s_per_token / N``), the push (``weights_gb * push_s_per_gb``) to every engine;
- an admission (a batch share, or one streamed group) pauses its engine's decoding ``admission_s``;
- in line is batch shares with the N training devices as the engines, S = 0 and no push: generation and update
  alternate on the same devices;
- batch shares: batch j is dispatched, its groups dealt over the engines, once every engine is idle and has weights
  no older than j - S; a push waits for the batch in flight (it queues behind it) and the trainer waits for the push;
- streaming: a group of batch j is admitted to the engine with the fewest in flight when its ``max_in_flight`` has
  room for the whole group and the engines' weights are no older than j - S; a push pauses every engine between
  decode steps; step t trains the first P groups to end whose staleness (t - the version they were admitted under)
  is at most S; a group over the bound is generated again.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

MODES = ("inline", "shares", "streaming")


@dataclass(frozen=True)
class PhaseCosts:
    """Measured (or published) costs of the phases, units in the names."""

    tokens_per_s_batch1: float  # one engine decoding one trajectory
    tokens_per_s_saturated: float  # the decode step's cost of one more trajectory in the batch, as tokens/s
    update_s_per_token: float  # one training device, per response token trained
    update_fixed_s: float = 0.0  # per step, whatever the tokens (optimizer step, gathers)
    push_s_per_gb: float = 0.0
    weights_gb: float = 0.0
    tool_call_latency_s: float = 0.0
    trainer_other_s: float = 0.0  # per step on the trainer: collect, score, check the batch
    admission_s: float = 0.0  # an engine's pause per admission call (prefill, scheduling): per batch share or group

    def decode_step_s(self, batch: int) -> float:
        return 1.0 / self.tokens_per_s_batch1 + (batch - 1) / self.tokens_per_s_saturated

    def push_s(self) -> float:
        return self.weights_gb * self.push_s_per_gb


@dataclass(frozen=True)
class Fleet:
    """The schedule and its sizes."""

    mode: str  # one of MODES
    engines: int  # K (in line: ignored, the N training devices generate)
    train_devices: int  # N
    prompts_per_step: int  # P groups a step
    samples_per_prompt: int  # G trajectories a group
    max_staleness: int = 1  # S (in line: 0)
    max_in_flight: int = 0  # streaming: trajectories per engine; 0 = its share of one batch
    steps: int = 8
    warmup_steps: int = 2

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: choose one of {MODES}")
        sizes = dict(engines=self.engines, train_devices=self.train_devices, prompts_per_step=self.prompts_per_step,
                     samples_per_prompt=self.samples_per_prompt)
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"{name}={value}: must be >= 1")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness={self.max_staleness}: must be >= 0")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps}: must be in [0, steps={self.steps})")
        if self.mode == "streaming" and 0 < self.max_in_flight < self.samples_per_prompt:
            raise ValueError(f"max_in_flight={self.max_in_flight}: a group of samples_per_prompt="
                             f"{self.samples_per_prompt} must fit; raise it or set 0 (one batch's)")


@dataclass(frozen=True)
class Prediction:
    steps_per_s: float
    engine_busy: float  # share of time an engine has a trajectory in flight
    engine_fill: float  # mean in flight over capacity (streaming: max_in_flight; shares: the share's size)
    trainer_wait_s: float  # per step: from the previous step's end to the update's start (incl. trainer_other_s)
    staleness_mean: float
    staleness_max: int
    regenerated: int  # streaming: groups over the bound generated again


class Engine:
    """One engine's decode batch on a clock of decode steps, so a trajectory's end is a fixed point of it."""

    def __init__(self, costs: PhaseCosts):
        self.costs, self.t, self.clock, self.epoch = costs, 0.0, 0.0, 0
        self.decoding: list[tuple[float, int]] = []  # (clock at the segment's end, trajectory)
        self.in_flight, self.paused_until = 0, 0.0
        self.area = self.busy = 0.0  # integrals over time of in flight and of in flight > 0

    def advance(self, now: float) -> None:
        dt = now - self.t
        self.area += self.in_flight * dt
        self.busy += dt if self.in_flight else 0.0
        if self.decoding and now > self.paused_until:
            running = now - max(self.t, self.paused_until)
            self.clock += running / self.costs.decode_step_s(len(self.decoding))
        self.t = now

    def next_end(self) -> float | None:
        if not self.decoding:
            return None
        start = max(self.t, self.paused_until)
        return start + (self.decoding[0][0] - self.clock) * self.costs.decode_step_s(len(self.decoding))


class Simulation:
    """One run of ``fleet.steps`` RL steps; ``run()`` returns the ``Prediction`` over the steps after warm-up."""

    def __init__(self, costs: PhaseCosts, fleet: Fleet, trajectories: list[tuple[int, int]]):
        self.costs, self.fleet, self.draws = costs, fleet, trajectories
        inline = fleet.mode == "inline"
        self.S = 0 if inline else fleet.max_staleness
        self.push_s = 0.0 if inline else costs.push_s()
        self.engines = [Engine(costs) for _ in range(fleet.train_devices if inline else fleet.engines)]
        batch = fleet.prompts_per_step * fleet.samples_per_prompt
        self.cap = (fleet.max_in_flight or math.ceil(batch / len(self.engines))) if fleet.mode == "streaming" else math.ceil(batch / len(self.engines))
        self.events: list[tuple] = []
        self.seq = 0
        self.now, self.version = 0.0, 0  # the engines' weights: updates pushed
        self.traj: list[dict] = []
        self.groups: list[dict] = []
        self.ended: list[int] = []  # groups ended, in order, not yet trained
        self.regen: list[int] = []
        self.next_group = 0
        self.trainer = "idle"  # idle | busy | push_wait | push
        self.step, self.step_end, self.waits, self.stale = 0, [], [], []
        self.snapshots: list[tuple[float, float]] = []  # (area, busy) summed over engines at each step's end
        self.regenerated, self.batch_groups = 0, {}
        self.handlers = {"segment_end": self.on_segment_end, "tool_return": self.on_tool_return,
                         "unpause": self.on_unpause, "update_end": self.on_update_end, "push_end": self.on_push_end}

    # events ------------------------------------------------------------------------------------------------------
    def at(self, t: float, kind: str, *payload) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def reschedule(self, e: int) -> None:
        engine = self.engines[e]
        engine.epoch += 1
        end = engine.next_end()
        if end is not None:
            self.at(end, "segment_end", e, engine.epoch)

    def run(self) -> Prediction:
        self.schedule()
        while self.step < self.fleet.steps:
            if not self.events:
                raise RuntimeError(f"the simulation stalled at step {self.step} ({self.fleet})")
            self.now, _, kind, payload = heapq.heappop(self.events)
            self.handlers[kind](*payload)
            self.schedule()
        return self.prediction()

    def on_segment_end(self, e: int, epoch: int) -> None:
        engine = self.engines[e]
        if epoch != engine.epoch:
            return
        engine.advance(self.now)
        while engine.decoding and engine.decoding[0][0] <= engine.clock + 1e-9:
            _, i = heapq.heappop(engine.decoding)
            tr = self.traj[i]
            tr["segment"] += 1
            if tr["segment"] < len(tr["segments"]):
                self.at(self.now + self.costs.tool_call_latency_s, "tool_return", e, i)
            else:
                engine.in_flight -= 1
                group = self.groups[tr["group"]]
                group["left"] -= 1
                if group["left"] == 0:
                    self.ended.append(tr["group"])
        self.reschedule(e)

    def on_tool_return(self, e: int, i: int) -> None:
        engine = self.engines[e]
        engine.advance(self.now)
        tr = self.traj[i]
        heapq.heappush(engine.decoding, (engine.clock + tr["segments"][tr["segment"]], i))
        self.reschedule(e)

    def on_unpause(self, e: int) -> None:
        self.engines[e].advance(self.now)
        self.reschedule(e)

    def on_update_end(self) -> None:
        self.trainer = "push_wait"

    def on_push_end(self) -> None:
        self.version += 1
        self.end_step()

    # the schedule ------------------------------------------------------------------------------------------------
    def new_group(self, batch: int, e: int, admission: bool = True) -> int:
        """A group of ``samples_per_prompt`` trajectories on engine ``e``; ``admission``: it pays ``admission_s``."""
        g = len(self.groups)
        self.groups.append({"batch": batch, "left": self.fleet.samples_per_prompt, "version": self.version,
                            "tokens": 0})
        engine = self.engines[e]
        engine.advance(self.now)
        if admission:
            engine.paused_until = max(engine.paused_until, self.now) + self.costs.admission_s
        for _ in range(self.fleet.samples_per_prompt):
            tokens, calls = self.draws[len(self.traj) % len(self.draws)]
            segments = [tokens / (calls + 1)] * (calls + 1)
            self.traj.append({"group": g, "segments": segments, "segment": 0})
            heapq.heappush(engine.decoding, (engine.clock + segments[0], len(self.traj) - 1))
            self.groups[g]["tokens"] += tokens
            engine.in_flight += 1
        self.reschedule(e)
        return g

    def schedule(self) -> None:
        if self.trainer == "push_wait":
            self.start_push()
        if self.fleet.mode == "streaming":
            self.admit()
        else:
            self.dispatch()
        if self.trainer == "idle":
            self.start_update()

    def start_push(self) -> None:
        idle = all(e.in_flight == 0 for e in self.engines)
        if self.fleet.mode == "streaming" or idle:  # batch shares: the push queues behind the batch in flight
            self.trainer = "push"
            for e, engine in enumerate(self.engines):
                engine.advance(self.now)
                engine.paused_until = max(engine.paused_until, self.now) + self.push_s
                self.reschedule(e)
                self.at(engine.paused_until, "unpause", e)
            self.at(self.now + self.push_s, "push_end")

    def dispatch(self) -> None:
        """Batch shares: the next batch's groups dealt over the engines once all are idle and fresh enough."""
        j = len(self.batch_groups)
        if self.trainer in ("push_wait", "push") or j > self.fleet.steps + self.S or j - self.S > self.version:
            return
        if any(e.in_flight for e in self.engines):
            return
        P, K = self.fleet.prompts_per_step, len(self.engines)
        self.batch_groups[j] = [self.new_group(j, k % K, admission=k < K) for k in range(P)]  # one call a share

    def admit(self) -> None:
        """Streaming: groups admitted where there is room, fresh ones within the bound; regenerated ones first."""
        P, G = self.fleet.prompts_per_step, self.fleet.samples_per_prompt
        if self.trainer == "push":
            return
        while True:
            engine = min(range(len(self.engines)), key=lambda k: self.engines[k].in_flight)
            if self.engines[engine].in_flight + G > self.cap:
                return
            if self.regen:
                self.new_group(self.regen.pop(0), engine)
                continue
            j = self.next_group // P
            if j >= self.fleet.steps + self.S + 1 or j - self.S > self.version:
                return
            self.new_group(j, engine)
            self.next_group += 1

    def start_update(self) -> None:
        t, P = self.step, self.fleet.prompts_per_step
        if self.fleet.mode == "streaming":
            fresh = []
            for g in self.ended:
                if t - self.groups[g]["version"] > self.S:
                    self.regen.append(self.groups[g]["batch"])
                    self.regenerated += 1
                else:
                    fresh.append(g)
            self.ended = fresh
            if len(fresh) < P:
                return
            take, self.ended = fresh[:P], fresh[P:]
        else:
            take = self.batch_groups.get(t)
            if take is None or any(self.groups[g]["left"] for g in take):
                return
        tokens = sum(self.groups[g]["tokens"] for g in take)
        start = self.now + self.costs.trainer_other_s
        update = self.costs.update_fixed_s + tokens * self.costs.update_s_per_token / self.fleet.train_devices
        self.waits.append(start - (self.step_end[-1] if self.step_end else 0.0))
        self.stale.append([t - self.groups[g]["version"] for g in take])
        self.trainer = "busy"
        self.at(start + update, "update_end")

    def end_step(self) -> None:
        for engine in self.engines:
            engine.advance(self.now)
        self.snapshots.append((sum(e.area for e in self.engines), sum(e.busy for e in self.engines)))
        self.step_end.append(self.now)
        self.step += 1
        self.trainer = "idle"

    def prediction(self) -> Prediction:
        w = self.fleet.warmup_steps
        t0 = self.step_end[w - 1] if w else 0.0
        span = self.step_end[-1] - t0
        area0, busy0 = self.snapshots[w - 1] if w else (0.0, 0.0)
        area, busy = self.snapshots[-1]
        K, n = len(self.engines), len(self.step_end)  # an update begun after the last step's end is not counted
        stale = [s for step in self.stale[w:n] for s in step]
        return Prediction(steps_per_s=(len(self.step_end) - w) / span, engine_busy=(busy - busy0) / (K * span),
                          engine_fill=(area - area0) / (K * self.cap * span),
                          trainer_wait_s=sum(self.waits[w:n]) / (n - w),
                          staleness_mean=sum(stale) / len(stale), staleness_max=max(stale),
                          regenerated=self.regenerated)


def draw(distribution: list[tuple[int, int]], n: int, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` (response tokens, tool calls) drawn from ``distribution`` with a seeded generator: the same every run."""
    rng = random.Random(seed)
    return [rng.choice(distribution) for _ in range(n)]


def simulate(costs: PhaseCosts, fleet: Fleet, distribution: list[tuple[int, int]], seed: int = 0) -> Prediction:
    """The prediction for ``fleet`` with trajectories drawn from ``distribution`` ((response tokens, calls) pairs)."""
    if not distribution:
        raise ValueError("distribution is empty: give (response tokens, tool calls) pairs, e.g. from a run's dumps")
    n = (fleet.steps + fleet.max_staleness + 4) * fleet.prompts_per_step * fleet.samples_per_prompt
    return Simulation(costs, fleet, draw(distribution, n, seed)).run()
