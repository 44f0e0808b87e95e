"""launch: infrastructure as code for fine-tuning LLMs on rented GPUs (the local CLI).

The folders are the table of contents (README.md "Architecture" draws the tree). Each group is one
idea, imports only the groups below it (GROUPS), and is imported by other groups only through its face
(FACES: the modules other groups may import; the rest are its own business). tests/house/test_groups.py
fails on an import that runs back up or reaches past a face, and on a declaration nobody uses.
"""

__version__ = "0.1.0"

# Bottom to top. A top-level module is a group of its own: `launcher` is this file (the version).
GROUPS: dict[str, tuple[str, ...]] = {
    "launcher": (),
    "errors": (),
    "doors": (),
    "heavy": (),  # what is imported only inside functions, and why (tests/house/test_heavy_imports.py)
    "sky_internals": (),  # SkyPilot names outside its public SDK, each with where 0.14.1 defines it
    "project": (),  # where the user's project is, and what this install ships
    "term": (),
    "store": ("errors", "term"),
    "trainenv": ("project", "store"),  # the Python with the training stack on this machine
    "profiles": ("project", "term", "store"),
    "catalog": ("sky_internals", "profiles", "store"),
    "plan": ("project", "term", "store", "profiles", "catalog"),
    "backends": ("errors", "sky_internals", "term", "store", "trainenv", "profiles", "catalog"),
    "runs": ("launcher", "errors", "project", "term", "store", "trainenv", "profiles", "catalog", "plan",
             "backends"),
    "results": ("errors", "project", "term", "store", "trainenv", "profiles", "backends", "runs"),
    "cli": ("launcher", "errors", "project", "term", "store", "trainenv", "profiles", "catalog", "plan", "runs",
            "results"),
    "__main__": ("cli",),  # `python -m launcher`
}

# What other groups may import of each group (modules relative to the group; "" is its __init__).
FACES: dict[str, tuple[str, ...]] = {
    "launcher": ("",),
    "errors": ("",),
    "project": ("",),
    "trainenv": ("",),
    "term": ("ui", "tables", "units", "logtext", "completion", "transfer"),
    "store": ("state", "registry", "handle", "artifacts", "claims"),
    "profiles": ("profile", "schema", "checks", "data_count", "render", "uploads", "preview", "scaffold"),
    "catalog": ("",),
    "plan": ("estimate", "show", "compare", "storage", "budget_gate"),
    "backends": ("", "local", "final_save", "skypilot", "skypilot.control", "skypilot.sdk"),
    "runs": ("start", "lifecycle", "refresh", "teardown", "experiment", "rehearse", "access", "volumes"),
    "results": ("fetched", "compare"),
}
