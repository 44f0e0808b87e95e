"""The payload: the self-contained program that runs on the GPU machine (`python -m payload STAGE`).

It never imports the launcher. Its folders are its table of contents (README.md "Architecture"):
each group is one idea, imports only the groups below it (GROUPS) and is imported by other groups
only through its face (FACES); tests/house/test_groups.py holds both. `errors`, `layout` and `retry` are the
base every group may use; `__main__` (the stage runner) and `exitcode` (what a rendered `run` exits
with) are the entry points on top.
"""

# Bottom to top. A top-level module is a group of its own.
GROUPS: dict[str, tuple[str, ...]] = {
    "payload": (),
    "errors": (),
    "layout": (),
    "retry": (),
    "config": ("errors", "layout"),
    "volume": ("errors", "layout"),
    "model": ("errors", "retry"),
    "preflight": ("errors", "layout", "retry", "config", "model"),
    "data": ("errors", "layout", "retry", "config", "model"),
    "outputs": ("errors", "layout", "retry", "config", "volume", "model", "data"),
    "train": ("errors", "layout", "config", "volume", "model", "data", "outputs"),
    "exitcode": ("errors", "layout", "config"),
    "__main__": ("errors", "config", "volume"),
}

# What other groups may import of each group (modules relative to the group; "" is its __init__).
FACES: dict[str, tuple[str, ...]] = {
    "errors": ("",),
    "layout": ("",),
    "retry": ("",),
    "config": ("", "stages", "evaluation", "resume"),
    "volume": ("checkpoints", "control", "checksums", "verify", "observe", "money", "lease", "stop_request",
               "timings"),
    "model": ("modeling", "adapters", "sharding", "attention", "memory", "dims"),
    "data": ("", "trainset"),
    "outputs": ("evaluate", "infer", "tracking", "manifest"),
}
