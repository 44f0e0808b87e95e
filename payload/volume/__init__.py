"""A run's state on its volume: what survives the machine.

`checkpoints` writes and verifies checkpoint markers and decides retention (which checkpoints are
kept), `control` decides when the trainer saves and stops (time, SIGTERM, the budget, every rank
alike), `checksums` and `verify` check files before resume, export and merge, `lease` keeps one
trainer per run, `stop_request` is the save-and-exit `launch down` asks for, `money` the cost so far
and the budget stop, `timings` the measured phase durations, `observe` the status, metrics and
summary files the launcher reads. It may import the payload's base (errors, layout).
"""
