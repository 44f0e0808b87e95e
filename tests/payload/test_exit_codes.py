"""Exit codes with meaning: the rendered `run` script ends with the payload's own code, not torchrun's
1, and a transient failure is retried only while the run makes progress (payload/exitcode.py).

The script is the one rendered into sky/local-demo.yaml, run by bash as SkyPilot runs it; only
the training launcher (`python -m payload.train.torchrun`, tested for real in tests/payload/train/test_torchrun_ends.py)
and the data stage are stand-ins (tiny scripts that write status.json as the payload does and exit),
`python -m payload.exitcode` is real."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from payload import exitcode
from payload.errors import EXIT_BUDGET, EXIT_CONFIG, EXIT_CRASH, EXIT_INTERRUPTED, EXIT_TRANSIENT

REPO = Path(__file__).resolve().parents[2]
RUN = yaml.safe_load((REPO / "sky" / "local-demo.yaml").read_text())["run"]


@pytest.fixture
def node(tmp_path):
    """PATH with a `python` whose training launcher is a stand-in (writes $FAKE_STATUS as status.json,
    exits $FAKE_TORCHRUN_RC) and that skips the data stage unless $FAKE_DATA_RC says how it fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    run_dir = tmp_path / "volume" / "runs" / "r1"
    (bin_dir / "python").write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1 $2" = "-m payload.train.torchrun" ]; then\n'
        f'  [ -z "${{FAKE_STATUS:-}}" ] || printf %s "$FAKE_STATUS" > {run_dir}/status.json\n'
        '  exit "${FAKE_TORCHRUN_RC:-0}"\n'
        'fi\n'
        'if [ "$1 $2 $3" = "-m payload data" ]; then exit "${FAKE_DATA_RC:-0}"; fi\n'
        'if [ "$1 $2 $3" = "-m payload post" ]; then exit 0; fi\n'
        f'exec {sys.executable} "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    run_dir.mkdir(parents=True)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "LAUNCH_LOCAL": "1",
           "LAUNCH_CONFIG": "sky/config/local-demo.yaml", "LAUNCH_VOLUME": str(tmp_path / "volume"),
           "LAUNCH_RUN_ID": "r1", "LAUNCH_MAX_RETRIES": "2", "PYTHONPATH": str(REPO),
           "SKYPILOT_NODE_IPS": "127.0.0.1", "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_RANK": "0",
           "SKYPILOT_NUM_GPUS_PER_NODE": "0"}
    return env, run_dir


def run_job(env, **fake) -> subprocess.CompletedProcess:
    env = {**env, **{f"FAKE_{k.upper()}": (json.dumps(v) if isinstance(v, dict) else str(v)) for k, v in fake.items()}}
    return subprocess.run(["bash", "-c", RUN], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("payload_code", [EXIT_BUDGET, EXIT_CONFIG, EXIT_TRANSIENT, EXIT_INTERRUPTED])
def test_the_job_exits_with_the_payloads_code_not_torchruns(node, payload_code):
    env, _ = node
    done = run_job(env, torchrun_rc=1, status={"state": "x", "step": 5, "exit_code": payload_code})
    assert done.returncode == payload_code, done.stderr


def test_without_a_fresh_status_json_torchruns_code_stands(node):
    env, run_dir = node
    assert run_job(env, torchrun_rc=1).returncode == EXIT_CRASH  # the payload never wrote one
    (run_dir / "status.json").write_text(json.dumps({"exit_code": EXIT_BUDGET}))
    old = time.time() - 3600
    os.utime(run_dir / "status.json", (old, old))  # a previous attempt's end
    assert run_job(env, torchrun_rc=1).returncode == EXIT_CRASH
    assert run_job(env, torchrun_rc=0).returncode == 0


def test_a_failing_data_stage_exits_with_its_own_code(node):
    env, _ = node
    assert run_job(env, data_rc=EXIT_CONFIG).returncode == EXIT_CONFIG


@pytest.mark.slow  # 3 s: payload processes retried
def test_transient_failures_are_retried_only_while_training_progresses(node):
    env, run_dir = node
    codes = [run_job(env, torchrun_rc=1, status={"step": 7, "exit_code": EXIT_TRANSIENT}).returncode
             for _ in range(3)]
    assert codes == [EXIT_TRANSIENT, EXIT_TRANSIENT, EXIT_CRASH]  # LAUNCH_MAX_RETRIES=2 in a row
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and "3 times in a row without training progress" in status["reason"]
    # Progress resets the count: a preemption every few hundred steps is retried for ever.
    for step in (8, 9, 10, 11):
        assert run_job(env, torchrun_rc=1, status={"step": step, "exit_code": EXIT_INTERRUPTED}).returncode \
            == EXIT_INTERRUPTED


def test_only_node_0_counts_retries(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"step": 1, "exit_code": EXIT_TRANSIENT}))
    for _ in range(5):
        assert exitcode.job_exit_code(tmp_path, 1, since=0, node_rank=1, max_retries=1) == (EXIT_TRANSIENT, None)
    assert not (tmp_path / exitcode.RETRIES).exists()


def test_a_broken_config_never_hides_the_stages_code(tmp_path, capsys):
    assert exitcode.main(["--config", str(tmp_path / "missing.yaml"), "3"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "3" and "exiting with the stage's code 3" in out.err
