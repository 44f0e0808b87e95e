"""The terminal: how launch writes to you, and nothing about what it writes.

One rich console and its `✓`/`✗` lines (`ui`), tables that fit 80 columns without cutting what you
copy (`tables`), sizes, dollars and durations written one way everywhere, and strict `--json`
(`units`), terminal control codes out of saved logs (`logtext`). The bottom of the launcher: it may
import only launcher/errors.py (and payload/volume/money.py, the door for the one money formatter);
every other group prints through it.
"""
