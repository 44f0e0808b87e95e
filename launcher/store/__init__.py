"""What launch keeps on this machine: its state dir, the run registry, and fetched artifacts.

`state` says where (`$LAUNCH_HOME`, default `~/.launch`), `registry` is the SQLite record of every
run with its state and billed time (a run's state only moves forward: `registry.observe`), `handle`
the typed record of what its backend learnt of a run (host, pids, directories, job), and
`artifacts` is the one contract for what `launch down --fetch-artifacts` leaves on disk and how it is
verified against the machine's MANIFEST. It may import term/ and errors; backends, runs and results
build on it.
"""
