"""Issue 32 item 10: a network failure while the GPU machine builds its environment (setup) ended with
uv's own exit 2, which the launcher reads as "config or data error" and never retries. Run for real:
payload/gpu_env.sh as the rendered setup sources it, with the package index (and, for the uv
download, a proxy) on a closed port of 127.0.0.1: a refused connection, no network reached."""

import socket
from pathlib import Path

from payload.errors import EXIT_CRASH, EXIT_TRANSIENT, RETRYABLE_EXIT_CODES
from test_gpu_env import node, setup  # noqa: F401  (the fixture: a GPU node's environment, offline)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def online(node: dict, **extra) -> dict:
    """The node with its package index on a closed local port (uv's own retries off, ours quick)."""
    env = {k: v for k, v in node.items() if k not in ("UV_OFFLINE", "UV_NO_INDEX", "UV_FIND_LINKS")}
    return {**env, "UV_INDEX_URL": f"http://127.0.0.1:{closed_port()}/simple", "UV_HTTP_RETRIES": "0",
            "LAUNCH_ENV_TRIES": "2", "LAUNCH_ENV_RETRY_S": "0", **extra}


def test_an_unreachable_package_index_ends_setup_as_transient_and_retried(node):
    env = online(node)
    r = setup(env)
    assert r.returncode == EXIT_TRANSIENT and EXIT_TRANSIENT in RETRYABLE_EXIT_CODES, (r.returncode, r.stderr)
    assert "Connection refused" in r.stderr  # uv's own reason, shown
    assert f"installing {env['LAUNCH_GPU_LOCK']} failed on the network (try 1 of 2); retrying" in r.stderr
    assert "ending setup with exit 75 (transient: retried on a fresh machine)" in r.stderr
    assert not list((Path(node["LAUNCH_VOLUME"]) / ".envs").glob("*/.complete"))


def test_setups_failing_on_the_network_in_a_row_stop_being_retried(node):
    env = online(node, LAUNCH_MAX_RETRIES="1", LAUNCH_ENV_TRIES="1")
    assert setup(env).returncode == EXIT_TRANSIENT  # the first: retried on a fresh machine
    r = setup(env)  # the same volume, the network still down: no endless paid retries
    assert r.returncode == EXIT_CRASH and "in 2 setups in a row: not retrying" in r.stderr
    assert setup(node).returncode == 0  # the network back: it builds, and the count starts over
    assert not (Path(node["LAUNCH_VOLUME"]) / ".envs" / ".network-failures").exists()


def test_the_uv_download_through_an_unreachable_proxy_is_transient(node, tmp_path):
    """No uv of the pinned version on PATH: pip, then curl, fetch it; both refused."""
    proxy = f"http://127.0.0.1:{closed_port()}"
    path = ":".join(p for p in node["PATH"].split(":") if not (Path(p) / "uv").exists())
    env = online(node, PATH=path, LAUNCH_ENV_TRIES="1", https_proxy=proxy, http_proxy=proxy, HTTPS_PROXY=proxy,
                 PIP_INDEX_URL=f"http://127.0.0.1:{closed_port()}/simple", PIP_RETRIES="0", PIP_TIMEOUT="2")
    r = setup(env)
    assert r.returncode == EXIT_TRANSIENT, r.stderr
    assert "downloading uv 0.13.9 failed on the network" in r.stderr


def test_a_lock_that_cannot_install_is_a_crash_not_a_config_error_nor_retried(node):
    Path(node["LAUNCH_GPU_LOCK"]).write_text("tinypkg==9.9\n")  # no such wheel in the (local) index
    r = setup(node)
    assert r.returncode == EXIT_CRASH and "not a network error" in r.stderr, r.stderr


# The data stage, the run's first: a Hub dataset that cannot be reached was a PayloadError (exit 2) too.
# With the Hub out of reach (huggingface_hub's offline switch: the ConnectionError `datasets` raises when
# it cannot get an answer, without waiting on its own backoff) the stage ends transient, and a dataset
# that is not there stays the user's input error.
DATA_STAGE = """
import sys
from payload import retry
from payload.config import DataConfig
from payload.data import prepare
from payload.errors import exit_code_for, one_line

retry.BASE_DELAY_S = 0.0
real = retry.with_retries
retry.with_retries = lambda what, fn, **kw: real(what, fn, **{**kw, "base_delay_s": 0.0})
cfg = DataConfig.model_validate({"sources": [{"name": "hub", "hf_dataset": sys.argv[1]}]})
try:
    prepare(cfg, sys.argv[2], base_dir=sys.argv[2], log=print)
except BaseException as e:
    print(exit_code_for(e), one_line(e))
"""


def data_stage(tmp_path, dataset: str, **env):
    import os
    import subprocess
    import sys

    run_env = {**{k: v for k, v in os.environ.items() if not k.startswith("HF_")}, "HF_HOME": str(tmp_path / "hf"),
               **env}
    done = subprocess.run([sys.executable, "-c", DATA_STAGE, dataset, str(tmp_path / "out")], env=run_env,
                          capture_output=True, text=True, timeout=120)
    return done.stdout.splitlines()[-1]


def test_a_hub_dataset_out_of_reach_ends_the_data_stage_transient(tmp_path):
    line = data_stage(tmp_path, "someone/chat-data", HF_HUB_OFFLINE="1")
    assert line.startswith(f"{EXIT_TRANSIENT} hub: cannot load Hugging Face dataset 'someone/chat-data'"), line
    assert line.endswith("(network: retried on a fresh machine)")


def test_a_dataset_that_is_not_there_stays_an_input_error(tmp_path):
    line = data_stage(tmp_path, str(tmp_path / "absent"))
    assert line.startswith("2 hub: cannot load Hugging Face dataset") and "FileNotFoundError" in line, line
