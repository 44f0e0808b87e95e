"""`python -m launcher`: the `launch` command (what launcher/trainenv.py runs again in the training stack's
environment)."""

from launcher.cli import main

main()
