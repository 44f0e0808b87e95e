"""What launcher/ imports only inside the function that needs it, and why; everything else is imported at
the top of the module that uses it.

`launch --help`, `launch profiles` and TAB completion must not pay for SkyPilot (1.8 s), paramiko, pydantic
or rich. Two reasons defer an import, and no other:

1. HEAVY: the module is expensive to import or may be absent. A package (the standard library's
   among them) whose own import costs ~10 ms or more, or that is an extra (`launch[sky]`) or part of
   the training stack rather than a dependency of launch; and each launcher or payload module that
   imports one of those at its top (its reason names the chain). A name covers its submodules: `rich`
   is `rich.text` too, and `launcher.backends.skypilot` is that package, whose `__init__` each of its
   submodules runs first.
2. STARTUP: the importing module is one `import launcher.cli` loads (cli.py registers every command at
   import, for `launch --help` to list them), and the imported launcher or payload module is not. A
   STARTUP module imports at its top only what the start-up loads anyway; what its commands need beyond
   that is imported inside the command. Measured: the launcher and payload modules that are not HEAVY
   would add ~34 ms and 70 modules (sqlite3, csv, statistics, concurrent.futures; the registry, the
   catalog, the plan's tables) to a start-up of ~60 ms, were they imported at the STARTUP modules' tops.

No import is deferred to break a cycle: scripts/import_cycles.py (tests/house/test_imports.py) counts
the imports inside functions too, so two modules that import each other fail there wherever the import
sits.

tests/house/test_heavy_imports.py holds the rule: an import inside a function of anything else fails
with its file:line; `import launcher.cli` loads no HEAVY module and exactly the STARTUP ones; an entry
nothing defers any more is stale, and so is a launcher or payload entry whose top no longer reaches a
heavy package. The figures: `python -X importtime -c "import X"` alone (X with everything it pulls in),
best of three, Python 3.11 on a 2-core Linux machine.
"""

HEAVY: dict[str, str] = {
    # packages
    "sky": "SkyPilot, 1.8 s and ~1800 modules: its SDK (backends/skypilot), its offline optimizer "
           "(catalog; a plan whose answer is kept imports none), its names outside the SDK (sky_internals.py)",
    "runpod": "1.7 s, ~640 modules, and an extra (`launch[sky]`): RunPod's prices, pods and network volumes "
              "through its SDK (backends/skypilot/price.py, runpod_pods.py, runpod_volumes.py)",
    "datasets": "1.0 s, ~1070 modules, the training stack's: `launch data preview` with a tokenizer "
                "(profiles/preview.py)",
    "boto3": "180 ms, ~350 modules, and an extra (`launch[sky]`): a RunPod network volume's S3 API "
             "(backends/skypilot/files.py)",
    "botocore": "8 ms for botocore.exceptions, but only there with boto3 (`launch[sky]`): its ClientError "
                "(backends/skypilot/files.py)",
    "paramiko": "110 ms, ~330 modules: the ssh backend's connection (backends/sshconn.py, ssh.py at their top)",
    "requests": "68 ms, ~185 modules: whether SkyPilot's API server was busy (its ReadTimeout, "
                "backends/skypilot/backend.py `_server_busy`), after a failed SDK call only",
    "huggingface_hub": "66 ms for huggingface_hub.errors, the training stack's, not a dependency of launch: "
                       "the tokenizer cache (profiles/data_count.py) and the Hub's errors (`launch eval`, `chat`)",
    "pydantic": "28 ms alone, ~120 ms with the schemas built on it (launcher.profiles.schema, "
                "payload.config): imported at the top of the launcher and payload modules listed below",
    "rich": "15-40 ms (rich.text 15, rich.table 23, rich.markup 23, rich.console 25, rich.progress 33, "
            "~45-95 modules): the console, tables and progress bars; `--help` and completion print through click",
    "yaml": "13 ms, ~25 modules: the rendered task's YAML (runs/rendering.py, profiles/uploads.py, "
            "catalog/snapshot.py; at the top of backends/tasks.py, profiles/render.py)",
    "psutil": "13 ms, ~30 modules: the local backend's processes and SkyPilot's local API server "
              "(backends/local.py, backends/skypilot/control.py)",
    "PIL": "11 ms for PIL.Image: an image's size for token counts (profiles/data_count.py) and `launch chat "
           "--image` (results/fetched.py)",
    "tokenizers": "8 ms, the training stack's, not a dependency of launch: the model's own tokenizer for the "
                  "token count, when the Hub cache holds it (profiles/data_count.py)",
    "importlib.metadata": "9 ms, ~40 modules (email, zipfile, socket), standard library: SkyPilot's version in "
                          "the key of the kept optimizer answers (catalog/optimizer.py `_snapshot_key`)",
    "uv": "may be absent: the training stack's environment is built with the `uv` on PATH then "
          "(trainenv.py `_uv`)",
    # launcher and payload modules that import one of the above at their top
    "launcher.backends.local": "66 ms: launcher.backends.tasks (yaml) at its top; the local backend, "
                               "imported by name (backends/factory.py) and for a local run's files",
    "launcher.backends.ssh": "144 ms: paramiko at its top (backends/sshconn.py) and backends.tasks (yaml); "
                             "the ssh backend (backends/factory.py)",
    "launcher.backends.skypilot": "185 ms before SkyPilot itself: its __init__ imports task (yaml) and price "
                                  "(launcher.profiles.schema, pydantic); the SkyPilot backend and SDK wrappers",
    "launcher.plan.estimate": "164 ms: launcher.profiles.schema (pydantic) and render (yaml) at its top; "
                              "`launch plan`, `profiles`, `validate`, the budget gate",
    "launcher.plan.compare": "177 ms: launcher.plan.estimate at its top; `launch plan --compare`",
    "launcher.profiles.profile": "127 ms: pydantic and payload.config.yamlio (yaml) at its top: a profile "
                                 "read and validated",
    "launcher.profiles.schema": "122 ms: pydantic and payload.config at its top: the profile's sections",
    "launcher.profiles.schema_json": "54 ms: pydantic's JSON Schema generator at its top; "
                                     "sky/profile.schema.json (profiles/render.py)",
    "launcher.profiles.checks": "145 ms: launcher.profiles.profile (pydantic, yaml) at its top: the checks "
                                "before money (`validate`, `plan`, `up`, `data preview`)",
    "launcher.profiles.render": "143 ms: yaml and launcher.profiles.profile at its top: sky/ tasks and run "
                                "configs",
    "launcher.runs.experiment": "137 ms: payload.config.resume (pydantic, yaml) at its top: the resume rule "
                                "and provenance (`up`, `status RUN`, `down`, `compare`)",
    "payload.config": "109 ms: the run schema (pydantic models) and its YAML reader; every payload.config.* "
                      "module runs its __init__",
    "payload.data": "115 ms: the data step, through payload.config (payload.data.pipeline); `plan` counts "
                    "records with it, `data preview` shows them",
}

# What `import launcher.cli` loads of launcher/ and payload/ (cli.py registers every command at import):
# `launch --help` and TAB completion pay for these and no more.
STARTUP: tuple[str, ...] = (
    "launcher",
    "launcher.cli",
    "launcher.errors",
    "launcher.project",
    "launcher.trainenv",
    "launcher.term",
    "launcher.term.completion",
    "launcher.term.tables",
    "launcher.term.ui",
    "launcher.term.units",
    "launcher.profiles",
    "launcher.profiles.preview",
    "launcher.profiles.scaffold",
    "launcher.runs",
    "launcher.runs.access",
    "launcher.runs.lifecycle",
    "launcher.runs.pick",
    "launcher.runs.refresh",
    "launcher.runs.rendering",
    "launcher.runs.start",
    "launcher.runs.teardown",
    "launcher.runs.volumes",
    "launcher.results",
    "launcher.results.compare",
    "launcher.results.fetched",
    "payload",
    "payload.layout",
)
