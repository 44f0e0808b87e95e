"""`python -m launcher.catalog.child`: SkyPilot's optimizer on the shipped snapshot, in a process of its
own (see `choice_apart`), for a planning task and its profile's `about` given as JSON on stdin
(`{"task": ..., "about": ...}`: the parent read and validated the profile, the child does neither);
prints the Choice as one JSON line, or {"error": ...} when no instance in the snapshot fits."""

import json
import sys
from dataclasses import asdict

from launcher.catalog import PlanError, optimize_task


def main() -> None:
    given = json.load(sys.stdin)
    try:
        print(json.dumps(asdict(optimize_task(given["task"], given["about"]))))
    except PlanError as e:
        print(json.dumps({"error": str(e)}))


if __name__ == "__main__":
    main()
