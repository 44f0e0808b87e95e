"""What a run produced, looked at from here: checkpoints, evaluation, chat, and runs side by side.

`fetched` is `launch checkpoints`, `launch eval` and `launch chat` on a run's fetched (or live)
results, running the payload's own verification, evaluation and inference here; `compare` is
`launch compare`. Artifacts arrive through store/artifacts.py (fetch and verification). It may
import runs/, backends/, profiles/, store/, term/ and errors.
"""
