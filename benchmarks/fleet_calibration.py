"""The fleet model against a fleet benchmark's measured arms: each arm's ``PhaseCosts`` from what its runs logged
(``benchmarks.fleet_measure``), simulated (``benchmarks.fleet_sim``) over as many steps as the runs measured, and
its predicted steps per minute, trainer wait, engine busy and fill beside the measured ones.

Where each input comes from (every one printed with it by ``inputs_table``):

- the engine's decode speed: a least-squares fit over the in-line arm's steps at 1 torch thread (the fleet's engine
  is one process of one thread): a batch of responses ``L_i`` decoded together takes ``max L / tokens_per_s_batch1
  + (sum L - max L) / tokens_per_s_saturated`` seconds (the simulation's decode step, summed while the batch
  shrinks), fitted to each step's ``time/generation`` with its batch's dumped lengths. The fleet arms'
  ``time/generation`` is the slowest call's own timer, not the engine's seconds a batch, so it is not used;
- a tool call's latency: that arm's ``time/sandbox`` a step over its calls a step;
- the update: each arm's own ``time/update`` over its mean response tokens a step (it carries the contention of
  the engine beside it on the other core); the push: its ``time/weight_sync``;
- the trainer's other seconds a step: each arm's step less what the model simulates (``fleet_measure.other_s``);
- the response (tokens, calls) pairs: each arm's own dumps, every training record of every seed.

The in-line arm with torch's threads decodes on the 1-thread curve scaled to its own steps (one parameter: its
steps vary too little to separate the two); the asynchronous arms at the 1-thread speed.
Measured steps per minute count every step of a run, the first (nothing generated ahead) included, so the
simulation does too (no warm-up left out).
"""

from __future__ import annotations

import numpy as np

from benchmarks.fleet_measure import expand
from benchmarks.fleet_sim import Fleet, PhaseCosts, simulate

# benchmarks.fleet's arms: the schedule each one runs (benchmarks/fleet.py's ARMS)
ARMS = {"inline": dict(mode="inline", max_staleness=0, max_in_flight=0),
        "thread_s1": dict(mode="shares", max_staleness=1, max_in_flight=0),
        "fleet_s1": dict(mode="shares", max_staleness=1, max_in_flight=0),
        "stream_s1": dict(mode="streaming", max_staleness=1, max_in_flight=128)}
TOY = dict(prompts_per_step=16, samples_per_prompt=8, engines=1, train_devices=1)  # configs/toy_cpu.yaml's batch
TARGET = 0.15  # steps per minute within 15% of each measured arm


def decode_fit(batches: list[dict], shape: tuple[float, float] | None = None) -> tuple[float, float]:
    """(tokens_per_s_batch1, tokens_per_s_saturated) fitted to in-line steps: ``generation`` seconds against the
    batch's ``max_tokens`` decode steps and its ``tokens - max_tokens`` extra trajectory-steps. ``shape``: another
    fit of the same model (the 1-thread arm's), whose curve is kept and only scaled to these steps (one parameter,
    for an arm whose steps vary too little to separate the two)."""
    rows = [b for b in batches if b["generation"] is not None]
    if len(rows) < 3:
        raise ValueError(f"decode fit: {len(rows)} in-line steps with time/generation; give an in-line arm's "
                         "fleet.json with 3 steps or more")
    x = np.array([[b["max_tokens"], b["tokens"] - b["max_tokens"]] for b in rows], dtype=float)
    y = np.array([b["generation"] for b in rows])
    if shape is not None:
        curve = x @ np.array([1.0 / shape[0], 1.0 / shape[1]])
        scale = float(curve @ y / (curve @ curve))
        return shape[0] / scale, shape[1] / scale
    (per_step, per_extra), *_ = np.linalg.lstsq(x, y, rcond=None)
    if per_step <= 0 or per_extra <= 0:
        raise ValueError(f"decode fit: seconds a decode step {per_step:.3g}, a trajectory more {per_extra:.3g}; "
                         "both must be > 0: the in-line steps' batches vary too little to separate them")
    return 1.0 / per_step, 1.0 / per_extra


def arm_costs(arm: dict, decode: tuple[float, float]) -> PhaseCosts:
    """One arm's ``PhaseCosts``: ``decode`` from ``decode_fit``, the rest from the arm's own measured seconds."""
    s, batches = arm["seconds"], arm["batches"]
    tokens = float(np.mean([b["tokens"] for b in batches]))
    calls = float(np.mean([b["calls"] for b in batches]))
    return PhaseCosts(tokens_per_s_batch1=decode[0], tokens_per_s_saturated=decode[1],
                      update_s_per_token=s["update"] / tokens, push_s_per_gb=s["push"], weights_gb=1.0,
                      tool_call_latency_s=s["sandbox"] / calls if calls else 0.0, trainer_other_s=arm["other_s"])


def predict(name: str, arm: dict, decode: tuple[float, float]):
    steps = round(arm["steps"])
    fleet = Fleet(**ARMS[name], **TOY, steps=steps, warmup_steps=0)
    return simulate(arm_costs(arm, decode), fleet, expand(arm["responses"]))


def calibrate(measured: dict) -> list[dict]:
    """Per arm of ``measured`` (``fleet_model``'s measured file: ``arms`` and ``inline_1t``), its prediction beside
    what it measured: steps/min (the target), and for reference the trainer's wait and the engine's occupancy."""
    one_thread = decode_fit(measured["inline_1t"]["batches"])
    rows = []
    for name, arm in measured["arms"].items():
        if name not in ARMS:
            raise ValueError(f"arm {name!r}: the model knows benchmarks.fleet's arms {sorted(ARMS)}")
        decode = decode_fit(arm["batches"], one_thread) if name == "inline" else one_thread
        p = predict(name, arm, decode)
        s = arm["seconds"]
        pairs = [("steps_per_min", 60 * p.steps_per_s, arm["steps_per_min"])]
        if "wait" in s:  # the trainer from its last step's end to its update's start
            pairs.append(("wait_s", p.trainer_wait_s, s["step"] - s["update"] - s["push"]))
        pairs += [(k, getattr(p, "engine_" + k), arm["occupancy"][k]) for k in ("busy", "fill")
                  if k in arm["occupancy"]]
        rows += [dict(arm=name, metric=m, predicted=pr, measured=me, error=pr / me - 1) for m, pr, me in pairs]
    return rows


def inputs_table(measured: dict) -> list[str]:
    """Every input of the calibration with where it came from."""
    src = measured["source"]
    one_thread = decode_fit(measured["inline_1t"]["batches"])
    lines = [f"- measured: `{src['fleet']}` and `{src['inline_1t']}` (runs started {src['runs_started']}), "
             f"written by `{src['written_by']}`",
             f"- engine decode (asynchronous arms): {one_thread[0]:.0f} tokens/s at batch 1, one more trajectory "
             f"{1e3 / one_thread[1]:.3f} ms a decode step: fitted to the 1-thread in-line arm's "
             f"{len(measured['inline_1t']['batches'])} steps (time/generation against each batch's dumped lengths)"]
    for name, arm in measured["arms"].items():
        decode = decode_fit(arm["batches"], one_thread) if name == "inline" else one_thread
        c = arm_costs(arm, decode)
        lines.append(f"- {name} ({arm['seeds']} seeds, {arm['steps']:.0f} steps): update "
                     f"{c.update_s_per_token * 1e3:.3f} ms a token (time/update), trainer other "
                     f"{c.trainer_other_s:.2f} s a step (time/step less the simulated phases), push "
                     f"{c.push_s():.3f} s (time/weight_sync), tool call "
                     f"{c.tool_call_latency_s:.3f} s (time/sandbox over calls), responses: "
                     f"{sum(n for *_, n in arm['responses'])} dumped records"
                     + (f", decode {decode[0]:.0f} tokens/s at batch 1, {1e3 / decode[1]:.3f} ms a trajectory "
                        "more (the 1-thread curve scaled to its steps)" if name == "inline" else ""))
    return lines


def calibration_table(rows: list[dict], measured: dict) -> str:
    lines = ["| arm | metric | predicted | measured | error |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['arm']} | {r['metric']} | {r['predicted']:.2f} | {r['measured']:.2f} | {r['error']:+.0%} |"
              for r in rows]
    missed = [r["arm"] for r in rows if r["metric"] == "steps_per_min" and abs(r["error"]) > TARGET]
    verdict = (f"Steps per minute within {TARGET:.0%} for every arm." if not missed else
               f"Steps per minute off by more than {TARGET:.0%}: {', '.join(missed)}.")
    return "\n".join(["Calibration, predicted against measured:", "", *lines, "", verdict, "", "Inputs:",
                      *inputs_table(measured)])
