"""One optimizer pass on and off, side by side: the forward + backward of a default model's plan
with every pass (relsql's RULES) against the same grounding's plan without the pass named, on
the targets of bench.outside's corpus manifests (`Template.auto` and `Model` with their defaults).

    python -m bench.pass_off --pass stack_products --manifests /tmp/outside/corpus/*/*.json

The two nets share the weights' initial values (the same seed) and run alternately, in rounds of
`--steps` full-batch steps on one torch thread, so that a shared machine's load falls on both;
the table gives each plan's op count (weights left out) and the medians over `--rounds` rounds
of milliseconds per step, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch


def _step(net) -> None:
    outputs = net()
    sum(value.sum() for value in outputs.values()).backward()
    for p in net.parameters():
        p.grad = None


def _nets(manifest: dict, entry: dict, left_out: str):
    import relsql
    from relsql.compile import CompiledNet, make_plan
    from relsql.compile.passes import RULES

    keys = {"keys": manifest["keys"]} if manifest.get("keys") else {}
    db = relsql.connect(manifest["path"], read_only=True, **keys)
    options = {"time_column": entry["time_column"]} if entry.get("time_column") else {}
    template = relsql.Template.auto(db, target=entry["target"], **options)
    model = relsql.Model(db, template, target=entry["target"], seed=0, progress=False, **options)
    learner = model.learner
    net = learner.net
    without = tuple(rule for rule in RULES if rule.__name__ != left_out)
    if len(without) == len(RULES):
        raise SystemExit(f"no pass named {left_out!r}; passes: {', '.join(dict.fromkeys(r.__name__ for r in RULES))}")
    plan = make_plan(learner.template, net.grounding, net.dtype, without, outputs=[learner.output])
    other = CompiledNet(plan, net.grounding, dtype=net.dtype, seed=0)
    other.load_state_dict(net.state_dict(), strict=False)
    return net, other


def _ops(net) -> int:
    return sum(op.kind != "param" for op in net.plan.ops)


def measure(manifest: dict, entry: dict, left_out: str, rounds: int, steps: int) -> dict:
    on, off = _nets(manifest, entry, left_out)
    for net in (on, off):
        for _ in range(3):
            _step(net)
    times: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(rounds):
        for name, net in (("on", on), ("off", off)):
            started = time.perf_counter()
            for _ in range(steps):
                _step(net)
            times[name].append((time.perf_counter() - started) / steps * 1e3)
    on_ms, off_ms = statistics.median(times["on"]), statistics.median(times["off"])
    return {"database": manifest["name"], "target": entry["target"], "ops_on": _ops(on), "ops_off": _ops(off),
            "ms_on": on_ms, "ms_off": off_ms, "ratio": on_ms / off_ms}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pass", dest="left_out", required=True, help="the pass to leave out of the second plan")
    parser.add_argument("--manifests", nargs="+", required=True)
    parser.add_argument("--first-targets", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(f"| database | target | ops with {args.left_out} | without | ms per step with | without | ratio |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for path in args.manifests:
        manifest = json.loads(Path(path).read_text())
        if not manifest.get("valid", True):
            continue
        for entry in manifest["targets"][:args.first_targets]:
            row = measure(manifest, entry, args.left_out, args.rounds, args.steps)
            ratios.append(row["ratio"])
            print(f"| {row['database']} | {row['target']} | {row['ops_on']} | {row['ops_off']} | {row['ms_on']:.2f} | "
                  f"{row['ms_off']:.2f} | {row['ratio']:.3f} |", flush=True)
    if ratios:
        print(f"\nmedian ratio {statistics.median(ratios):.3f} over {len(ratios)} targets "
              "(below 1: the pass makes a step faster)")


if __name__ == "__main__":
    main()
