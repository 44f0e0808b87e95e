"""A hung stage says where it waits: SIGUSR1 writes every thread's stack to its log (stderr) and the stage
goes on (payload/volume/observe.py `stacks_on_usr1`: `python -m payload` sets it up before any stage,
torchrun's agent before its workers start)."""

import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

HUNG = """
import threading, time
from payload.volume.observe import stacks_on_usr1

def waiting_for_a_collective():
    print("ready", flush=True)
    time.sleep(60)

stacks_on_usr1()
threading.Thread(target=lambda: time.sleep(60), name="heartbeat", daemon=True).start()
waiting_for_a_collective()
"""


def test_sigusr1_writes_every_threads_stack_to_the_log_and_the_stage_goes_on(tmp_path):
    log = tmp_path / "run.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", HUNG], cwd=REPO, stdout=subprocess.PIPE, stderr=err,
                                text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while "waiting_for_a_collective" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        text = log.read_text()
        assert "waiting_for_a_collective" in text, text  # the main thread, where it waits
        assert "Current thread" in text and "Thread 0x" in text, text  # and the others (a heartbeat, a loader)
        time.sleep(0.2)
        assert proc.poll() is None  # still running: a look, not a stop
    finally:
        proc.kill()
        proc.wait()


def test_every_stage_and_torchruns_agent_set_it_up_before_they_run():
    import inspect

    from payload import __main__ as entry
    from payload.train import torchrun

    body = inspect.getsource(entry.main)
    assert body.index("stacks_on_usr1()") < body.index("run_stage(")
    body = inspect.getsource(torchrun.main)
    assert body.index("stacks_on_usr1()") < body.index("torchrun(")
