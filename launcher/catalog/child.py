"""`python -m launcher.catalog.child`: SkyPilot's optimizer on the shipped snapshot for the profile
(JSON) on stdin, in a process of its own (see `choice_apart`); prints the Choice as one JSON line, or
{"error": ...} when no instance in the snapshot fits."""

import json
import sys
from dataclasses import asdict

from launcher.catalog import PlanError, optimize
from launcher.profiles.profile import Profile


def main() -> None:
    p = Profile.model_validate(json.load(sys.stdin))
    try:
        print(json.dumps(asdict(optimize(p))))
    except PlanError as e:
        print(json.dumps({"error": str(e)}))


if __name__ == "__main__":
    main()
