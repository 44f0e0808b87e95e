# The emulated RunPod only (tests/cloud): see launch_emulator_hook.py.
import launch_emulator_hook  # noqa: F401
