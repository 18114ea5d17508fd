"""``python -m zerotir rollouts <run dir> [--step K] [--split S] [--filter F ...] [--limit N] [--color O] [--serve]``:
what the model wrote.

Prints a summary line for every step on disk, then the trajectories of one step (``--step``, default the latest),
filtered and capped: code syntax-highlighted, outputs in yellow (red when the execution failed), answers green when
correct and red when wrong. ``--color`` shows the trajectories written with their tokens token by token under an
overlay (log-prob, entropy, engine/trainer mismatch, loss weight, weight version). ``--serve`` starts the web viewer
instead (``zerotir.rollout_log.server``) on 127.0.0.1 and prints its URL. ``<run dir>`` is the run's
``trainer.default_root_dir`` (its ``rollouts/`` folder is read) or a rollouts folder itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zerotir.rollout_log.records import FILTERS, SPLITS, matches, read_step, step_files
from zerotir.rollout_log.render import OVERLAYS, rich_tokens, rich_trajectory, summary_line


class RolloutsInputError(ValueError):
    """A run folder without rollouts, or a step that is not on disk."""


def rollouts_folder(run_dir: str | Path) -> Path:
    """``<run dir>/rollouts`` when it exists, else ``run_dir`` itself if it holds rollout files."""
    run_dir = Path(run_dir)
    for folder in (run_dir / "rollouts", run_dir):
        if any(step_files(folder, split) for split in SPLITS):
            return folder
    raise RolloutsInputError(f"{run_dir}: no rollout files (step_<k>.jsonl.gz) in it or in its rollouts/ folder; "
                             "point it at a run's trainer.default_root_dir (the RolloutDumper callback writes there)")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m zerotir rollouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's trainer.default_root_dir, or its rollouts/ folder")
    parser.add_argument("--step", type=int, default=None, help="the RL step to show (default: the latest on disk)")
    parser.add_argument("--split", choices=SPLITS, default="train", help="training rollouts or an evaluation's")
    parser.add_argument("--filter", dest="filters", action="append", choices=FILTERS, default=[],
                        help="keep trajectories that are correct / wrong / had a failed execution (error) / called "
                             "a tool, any tool / called none; repeat to combine (all must hold)")
    parser.add_argument("--limit", type=int, default=5, help="trajectories shown at most (0: only the summaries)")
    parser.add_argument("--width", type=int, default=None, help="terminal width (default: detected)")
    parser.add_argument("--color", choices=OVERLAYS, default=None,
                        help="show the trajectories written with their tokens token by token, coloured by this "
                             "(the others as usual)")
    parser.add_argument("--serve", action="store_true", help="start the web viewer on 127.0.0.1 instead")
    parser.add_argument("--port", type=int, default=None, help="the web viewer's port (default: a free one)")
    args = parser.parse_args(argv)
    if args.port is not None and not args.serve:
        parser.error("--port is the web viewer's: add --serve")
    if args.limit < 0:
        parser.error(f"--limit must be >= 0, got {args.limit}")
    return args


def show(run_dir: str | Path, step: int | None = None, split: str = "train", filters: list[str] | None = None,
         limit: int = 5, console: object | None = None, color: str | None = None) -> int:
    """Print the step summaries and the chosen trajectories to ``console`` (a ``rich.console.Console``), those
    with tokens under the overlay ``color`` when given; returns how many trajectories were shown."""
    from rich.console import Console
    from rich.rule import Rule

    console = console or Console()
    folder = rollouts_folder(run_dir)
    steps = step_files(folder, split)
    if not steps:
        raise RolloutsInputError(f"{folder}: no {split} rollouts (the others: "
                                 f"{[s for s in SPLITS if step_files(folder, s)]})")
    chosen = max(steps) if step is None else step
    if chosen not in steps:
        raise RolloutsInputError(f"--step {chosen}: no {split} rollouts of that step in {folder} (on disk: "
                                 f"{_ranges(list(steps))})")
    console.print(Rule(f"{split} rollouts in {folder}"))
    records_of = {k: read_step(folder, k, split) for k in steps}
    for k, records in records_of.items():
        console.print(summary_line(k, records), style="bold" if k == chosen else None, highlight=False)
    kept = [r for r in records_of[chosen] if all(matches(r, f) for f in filters or [])]
    label = f" matching {' + '.join(filters)}" if filters else ""
    console.print(Rule(f"step {chosen}: {len(kept)} of {len(records_of[chosen])} trajectories{label}, "
                       f"showing {min(limit, len(kept))}"))
    for record in kept[:limit]:
        console.print(rich_trajectory(record))
        if color is not None:
            console.print(Rule(f"tokens, coloured by {color}", style="dim") if "tokens" in record else
                          Rule("no per-token record (not in this step's sample)", style="dim"))
            if "tokens" in record:
                console.print(rich_tokens(record, color))
        console.print()
    if filters and not kept:
        others = [k for k, records in records_of.items()
                  if k != chosen and any(all(matches(r, f) for f in filters) for r in records)]
        console.print(f"matching {' + '.join(filters)}: " + (f"steps {_ranges(others)} (--step {others[-1]})"
                                                              if others else "no other step either"), highlight=False)
    return min(limit, len(kept))


def _serve(run_dir: str | Path, port: int) -> int:
    """Run the web viewer until interrupted (Ctrl-C)."""
    from zerotir.rollout_log.server import make_server, url_of

    server = make_server(rollouts_folder(run_dir), port)
    print(f"zerotir rollouts: serving {run_dir} at {url_of(server)} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _ranges(steps: list[int]) -> str:
    return f"{steps[0]}..{steps[-1]} ({len(steps)} steps)" if len(steps) > 3 else ", ".join(map(str, steps))


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m zerotir rollouts``; returns the exit code (2 on bad input)."""
    from rich.console import Console

    args = _parse_args(argv)
    try:
        if args.serve:
            return _serve(args.run_dir, args.port or 0)
        show(args.run_dir, args.step, args.split, args.filters, args.limit, Console(width=args.width), args.color)
    except (RolloutsInputError, OSError) as err:
        print(f"zerotir rollouts: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
