"""Follow one small run through the package's parts: which part calls which, and how often control
goes back up a layer (a lower part calling code of a part above it, through a function it was handed).

The layers are pyproject.toml's (``[tool.importlinter]``): imports only go down, and parts on one
line never import each other, so a call that goes up, or across to a part beside its caller, is a
hidden coupling no import checker sees (a closure or callback handed down). A call whose frame
below is a library's (Lightning's hooks, ``nn.Module.__call__``, a context manager) is counted
apart, with the nearest of our frames below the library's: what handed the library the call.

What it sees is what this one run runs (its threads too, not its worker processes): code on paths
it does not take (a GPU's, another data format's) is not followed; give their overrides to trace
them where they run. A call up a layer through a library's frame is listed, not judged.

    python scripts/trace_run_parts.py                   # prints the summary
    python scripts/trace_run_parts.py --save            # and writes scripts/results/run_parts/trace.json

The run is the test suite's tiny job (synthetic data, 16 px images, one epoch of 8 batches); its
shape, not its size, is what is counted: a call counts once per distinct (caller, callee) pair too.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.config.compose import compose_for_run  # noqa: E402
from trainer.run import run  # noqa: E402

TINY = [
    "data.image_size=16",
    "data.batch_size=8",
    "data.num_samples=64",
    "data.val_samples=16",
    "trainer.max_epochs=1",
    "checkpoint.enabled=false",
]


def layers() -> dict:
    """part name (``data``, ``run``, ...) -> its layer's height (0: the base)."""
    import tomllib  # Python 3.11+ (the package supports 3.10): here, where it is used

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    stack = next(c for c in contracts if c["type"] == "layers")["layers"]
    return {part.strip(): len(stack) - 1 - i for i, line in enumerate(stack) for part in line.split("|")}


def part_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "trainer" and len(parts) > 1 else None


def trace(overrides: list) -> dict:
    height = layers()
    calls = []  # (caller part or None for a library, callee part, caller function, callee function)

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = part_of(frame.f_globals.get("__name__", ""))
        if callee is None:
            return
        back = frame.f_back  # a library frame in between (Lightning's hooks, torch's): no caller part
        caller = part_of(back.f_globals.get("__name__", "")) if back is not None else None
        where = lambda f: f"{f.f_globals['__name__']}.{f.f_code.co_qualname}"  # noqa: E731
        if caller is None:  # the nearest of our frames below the library's: who handed the library this call
            while back is not None and part_of(back.f_globals.get("__name__", "")) is None:
                back = back.f_back
            through = part_of(back.f_globals["__name__"]) if back is not None else None
            calls.append((None, callee, where(back) if back is not None else "(outside)", where(frame), through))
        else:
            calls.append((caller, callee, where(back), where(frame), None))

    cfg = compose_for_run(overrides)
    with tempfile.TemporaryDirectory() as out:
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            run(cfg, out, overrides)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    crossings = [c for c in calls if c[0] is not None and c[0] != c[1]]
    up = [c for c in crossings if height[c[1]] > height[c[0]]]
    across = collections.Counter((c[2], c[3]) for c in crossings if height[c[1]] == height[c[0]])
    hooks = [c for c in calls if c[0] is None]
    # a library calling code of a part above the one that called the library (a function handed down through it)
    up_through = [c for c in hooks if c[4] is not None and c[4] != c[1] and height[c[1]] > height[c[4]]]
    through_pairs = collections.Counter((c[2], c[3]) for c in up_through)
    entered = collections.Counter(c[1] for c in crossings)
    pairs = collections.Counter((c[2], c[3]) for c in up)

    def callers_from_outside(module: str) -> collections.Counter:
        """Which of our functions outside ``module`` called into it, how often."""
        inside = module + "."
        return collections.Counter(c[2] for c in calls if c[3].startswith(inside) and not c[2].startswith(inside))

    into_switchboard = callers_from_outside("trainer.switches.switchboard")
    return {
        "overrides": overrides,
        "calls_into_the_package": len(calls),
        "part_to_part_calls": len(crossings),
        "distinct_part_to_part_calls": len({(c[2], c[3]) for c in crossings}),
        "calls_up_a_layer": len(up),
        "distinct_calls_up_a_layer": len(pairs),
        "up_a_layer": [{"from": a, "to": b, "times": n} for (a, b), n in pairs.most_common()],
        "across_a_layer": [{"from": a, "to": b, "times": n} for (a, b), n in across.most_common()],
        "entered_from_another_part": dict(entered.most_common()),
        "entered_run_build_from_outside": sum(callers_from_outside("trainer.run.build").values()),
        "entered_the_switchboard_from_outside": sum(into_switchboard.values()),
        "library_hooks_into_the_package": len(hooks),
        "calls_up_a_layer_through_a_library": len(up_through),
        "up_a_layer_through_a_library": [
            {"below": a, "to": b, "times": n} for (a, b), n in through_pairs.most_common()
        ],
        "switchboard_entered_from": dict(into_switchboard),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", action="store_true", help="write scripts/results/run_parts/trace.json")
    ap.add_argument("overrides", nargs="*", help="more overrides for the traced run")
    args = ap.parse_args()
    result = trace(TINY + args.overrides)
    lists = ("up_a_layer", "across_a_layer", "entered_from_another_part", "up_a_layer_through_a_library")
    summary = {k: v for k, v in result.items() if k not in lists}
    print(json.dumps(summary, indent=2))
    print("up a layer (distinct):")
    for row in result["up_a_layer"]:
        print(f"  {row['times']:5d}  {row['from']} -> {row['to']}")
    print("across, to a part beside the caller's (distinct):")
    for row in result["across_a_layer"]:
        print(f"  {row['times']:5d}  {row['from']} -> {row['to']}")
    print("up a layer through a library (distinct; the nearest of our frames below the library's):")
    for row in result["up_a_layer_through_a_library"]:
        print(f"  {row['times']:5d}  {row['below']} -> {row['to']}")
    if args.save:
        out = ROOT / "scripts" / "results" / "run_parts"
        out.mkdir(parents=True, exist_ok=True)
        (out / "trace.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out / 'trace.json'}")


if __name__ == "__main__":
    main()
