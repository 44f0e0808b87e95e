"""The SkyPilot backend: on-demand profiles run as a cluster, spot profiles as a managed job.

One idea at ~360 lines: base.Backend's contract (up, logs, access, status, down, fetch) on SkyPilot's
clusters and managed jobs, nearly all of it the class: starting a run and stopping it (the teardown's
waits and retries). What state a run is in (SkyPilot's queues merged with the run's status.json,
`merge_status`) is `run_state`'s, which `status` and `down` ask; the task it launches (`task`) and what
else stands apart are in the package's other modules.

Everything goes through SkyPilot's Python SDK (client/server: each call returns a request id that
`sky.get` / `sky.stream_and_get` resolves). The task is SkyPilot's own parse of the rendered
`sky/<profile>.yaml`; `launch` adds the run id and the secret values, in memory only.

Run identity. `LAUNCH_RUN_ID` is always set to the launch run id, for clusters and managed jobs
alike. For a managed job it is as stable as SKYPILOT_TASK_ID (envs are part of the task the jobs
controller re-launches on every recovery), and unlike SKYPILOT_TASK_ID it is known before the job
exists, so `launch` knows the remote run dir (`{volume}/runs/{run_id}`) and the volume keys to
fetch from without asking SkyPilot.
"""

from __future__ import annotations

import time
from pathlib import Path, PurePosixPath
from typing import Optional, TextIO


from payload import layout
from payload.errors import END_STATES

from ... import sky_internals
from ...errors import BackendError
from launcher.store.registry import Run
from launcher.profiles.uploads import remove_staged
from ..base import Access, Backend, LaunchSpec, RemoteStatus, remote_command, remote_path
from . import control, run_state
from .task import build_task, cluster_name
from .files import RunFiles, S3Volume, cluster_ssh, ensure_ssh_config, s3_ready, ssh_argv
from .sdk import (
    controller_gone, credentials_message, enum_name, first_line, job_statuses, map_sky_error,
    nothing_launched, profile_clouds, record_field, sdk, volume_record,
)
from launcher.term.ui import err_console

# status.json states in which the trainer has ended (payload/errors.py END_STATES; `interrupted`
# is what the payload writes when a signal stopped it).
_ENDED = (*END_STATES, "interrupted")


# ------------------------------------------------------------------------------------ backend


# `launch down` just after a signalled `launch up`: the local API server, busy with that launch on a
# loaded machine, did not answer within the client's 5 s read timeout (requests' ReadTimeout), and down
# gave up with the cluster still coming up. A few more tries, then the one-line error as before.
BUSY_TRIES, BUSY_WAIT_S = 4, 5.0


def _server_busy(e: BaseException) -> bool:
    try:
        import requests
    except ImportError:
        return False
    return isinstance(e, (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError))


class SkyPilotBackend(Backend):
    name = "skypilot"

    def __init__(self, out: Optional[TextIO] = None):
        self.out = out  # where SkyPilot's provisioning log streams (None: the console)
        self._routes: dict[str, RunFiles] = {}

    # -- up

    def up(self, spec: LaunchSpec) -> Run:
        p = spec.profile
        if p.cluster.is_local:
            raise BackendError(f"{p.name} runs on this machine: use `--backend local`")
        if p.outputs.push_to_hub and not spec.secrets.get("HF_TOKEN"):
            raise BackendError(f"outputs.push_to_hub ({p.outputs.push_to_hub}) needs HF_TOKEN: "
                               "export HF_TOKEN=hf_... and run `launch up` again")
        sky = sdk()
        servers = control.local_api_server_pids()
        with control.marked_process() as origin:  # the first SDK call may start a local API server
            try:
                return self._up(sky, spec)
            except BackendError as e:
                stopped = control.stop_api_server_we_started(sky, servers, origin)
                raise BackendError(f"{e}{stopped}") from None

    def _up(self, sky, spec: LaunchSpec) -> Run:
        p, run = spec.profile, spec.run
        run.cluster = None if p.cluster.use_spot else cluster_name(run.id)  # a volume may bill from here on
        kind = "managed_job" if p.cluster.use_spot else "cluster"
        run.handle.update(kind=kind, job_name=run.id, **({} if p.cluster.use_spot else {"cluster": run.cluster}))
        spec.place(run)
        try:
            self._check_clouds(sky, p)
            volume = self._ensure_volume(sky, p) if p.cluster.volume else None
        except BackendError:
            raise
        except Exception as e:  # noqa: BLE001 - SDK errors become one line
            raise map_sky_error(e, p) from None
        try:
            task = build_task(spec, volume["name"] if volume else None)
        except (ValueError, OSError) as e:  # schema errors of a hand-edited or stale render
            raise BackendError(f"{spec.task_yaml}: {first_line(e)}; re-render with `launch render "
                               f"{p.name}`") from None
        run.handle.update(kind=kind, job_name=run.id, run_dir=str(layout.run_dir(p.runtime_volume(), run.id)),
                          volume=volume, push_to_hub=p.outputs.push_to_hub, infra=p.cluster.infra_list,
                          bucket=p.cluster.bucket.model_dump() if p.cluster.bucket else None)
        if p.cluster.on_slurm:  # the run dir outlives the cluster on the shared filesystem (slurm_login.py)
            run.handle.slurm_login = p.cluster.infra_list[0].split("/", 1)[1]
        if not p.cluster.use_spot:
            run.cluster = cluster_name(run.id)
            run.handle.update(cluster=run.cluster, autostop_minutes=p.cluster.autostop_minutes)
        spec.place(run)  # before SkyPilot provisions: `status` and `down` find the job or cluster by name
        if p.cluster.use_spot:
            job_id, reason = self._launch_managed(sky, task, run.id, p)
        else:
            job_id, reason = self._launch_cluster(sky, task, run.cluster, p)
        if reason is None:  # the request has read the staged workdir (a detached one may still)
            remove_staged(run.id)
        run.handle.job_id = job_id
        run.job_id = None if job_id is None else str(job_id)
        run.state, run.reason = "starting", reason
        return run

    def _check_clouds(self, sky, p) -> None:
        """The profile's clouds against the API server's enabled list. That list is a cache (empty on
        a freshly started server until a credential check ran): before saying "no credentials", run
        SkyPilot's check for the profile's clouds once (`sky check CLOUD`) and ask again."""
        wanted = profile_clouds(p)

        def enabled() -> set:
            found = {str(c).lower() for c in sky.get(sky_internals.sdk_enabled_clouds()) or []}
            return found | ({"kubernetes"} if "k8s" in found else set())

        if any(w in enabled() for w in wanted):
            return
        sky.get(sky_internals.sdk_check(tuple(wanted), verbose=False))
        if not any(w in enabled() for w in wanted):
            raise BackendError(credentials_message(wanted))

    def _ensure_volume(self, sky, p) -> dict:
        """The profile's network volume: reused if SkyPilot knows it, else an existing RunPod volume of
        that name adopted (`use_existing`), else created where the GPUs are in stock (runpod_volumes)."""
        from .runpod_volumes import stock_note, volume_config

        v = p.cluster.volume
        record = volume_record(sky, v.name)
        how = "reused"
        if record is None:
            config, how = volume_config(p)
            volume = sky.volumes.Volume.from_yaml_config(config)
            sky.stream_and_get(sky.volumes.apply(volume), output_stream=self.out)
            name, region, zone = config["name"], volume.region, volume.zone
        else:
            name, region, zone = (record_field(record, k) for k in ("name", "region", "zone"))
            if p.cluster.region and region and p.cluster.region != region:
                raise BackendError(f"volume {v.name} is in {region}/{zone} but cluster.region is "
                                   f"{p.cluster.region}: drop cluster.region or use another volume name")
            note = stock_note(p, zone)
            if note:
                err_console().print(f"[yellow]![/] {note}", soft_wrap=True)
        key_prefix = str(PurePosixPath(layout.run_dir(v.mount, "x")).parent.relative_to(v.mount))
        return {"name": name, "type": v.type, "region": region, "zone": zone, "mount": v.mount,
                "key_prefix": key_prefix, "created": how == "created", "adopted": how == "adopted"}

    def _launch_cluster(self, sky, task, name: str, p) -> tuple[Optional[int], Optional[str]]:
        request = None
        try:
            request = sky.launch(task, cluster_name=name, idle_minutes_to_autostop=p.cluster.autostop_minutes,
                                 down=True)
            job_id, _ = sky.stream_and_get(request, output_stream=self.out)
        except KeyboardInterrupt:
            return None, f"detached while launching; SkyPilot goes on (`launch down` stops cluster {name})"
        except Exception as e:  # noqa: BLE001
            err = map_sky_error(e, p)
            if request is None or nothing_launched(e):
                raise err from None
            # Autostop is armed only after setup: a failed setup would leave the cluster billing.
            torn = self._down_quietly(sky, name)
            raise BackendError(f"{err}; cluster {name} " + ("torn down, nothing bills" if torn else
                               f"may still be up: `sky down {name}`")) from None
        return job_id, None

    def _launch_managed(self, sky, task, job_name: str, p) -> tuple[Optional[int], Optional[str]]:
        try:
            with control.controller_autostop():  # the controller is torn down when idle
                request = sky.jobs.launch(task, name=job_name)
            job_ids, _ = sky.stream_and_get(request, output_stream=self.out)
        except KeyboardInterrupt:
            return None, "detached while submitting; the jobs controller goes on (`launch down` cancels)"
        except Exception as e:  # noqa: BLE001
            raise map_sky_error(e, p) from None
        if isinstance(job_ids, (list, tuple)):
            return (job_ids[0] if job_ids else None), None
        return job_ids, None

    @staticmethod
    def _down_quietly(sky, name: str) -> bool:
        try:
            sky.get(sky.down(name))
            return True
        except Exception as e:  # noqa: BLE001
            from sky import exceptions as ex

            return isinstance(e, ex.ClusterDoesNotExist)

    # -- logs / status / down

    def logs(self, run: Run, follow: bool, out: TextIO, tail: Optional[int] = None) -> int:
        sky, h = sdk(), run.handle
        try:
            if h.kind == "managed_job":
                by = {"job_id": h.job_id} if h.job_id is not None else {"name": h.job_name}
                code = sky.jobs.tail_logs(**by, follow=follow, output_stream=out,
                                          **({"tail": tail} if tail else {}))
            else:  # SkyPilot's tail=0 (its default) is the whole log
                code = sky.tail_logs(run.cluster, h.job_id, follow, output_stream=out,
                                     **({"tail": tail} if tail else {}))
        except Exception as e:  # noqa: BLE001
            raise map_sky_error(e) from None
        return int(code or 0)

    def access(self, run: Run, command: Optional[str], tty: bool) -> Access:
        """`ssh CLUSTER` through SkyPilot's SSH config (~/.sky/generated/ssh/, written here when missing:
        files.ensure_ssh_config), into
        the run's directory on the volume. A managed job's machine is SkyPilot's to manage (recreated
        on recovery, reached through its jobs controller), so there is nothing stable to ssh into."""
        h = run.handle
        if h.kind == "managed_job":
            raise BackendError(f"{run.id} is a managed job: SkyPilot owns its machine (it is replaced on "
                               f"recovery); watch it with `launch logs {run.id} --follow`, or run on a cluster "
                               "(cluster.use_spot: false) to ssh in")
        if not run.cluster or not h.run_dir:
            raise BackendError(f"run {run.id} has no cluster yet: nothing to connect to")
        missing = ensure_ssh_config(run.cluster)
        if missing:
            raise BackendError(missing)
        return Access([*ssh_argv(run.cluster), "-t" if tty else "-T", run.cluster,
                       remote_command(h.run_dir, command)])

    def status(self, run: Run) -> RemoteStatus:
        return run_state.remote_status(sky=sdk(), run=run)

    def read_run_file(self, run: Run, rel: str) -> Optional[str]:
        """As `status` reads status.json: over SSH while the cluster is up (asked of SkyPilot), else
        from the volume (S3); None when neither has it."""
        up = False
        if run.handle.kind == "cluster" and run.cluster:
            try:
                state, _, _ = run_state.cluster_state(sky=sdk(), run=run)
                up = state in ("running", "completed", "failed")
            except Exception:  # noqa: BLE001 - SkyPilot unreachable: try the volume
                up = False
        return run_state.run_text(run=run, rel=rel, up=up)

    def write_run_file(self, run: Run, rel: str, text: str) -> bool:
        """Over SSH into a cluster's run dir, else through the RunPod volume's S3 API (managed jobs)."""
        h = run.handle
        if h.kind == "cluster" and run.cluster and h.run_dir:
            d, target = remote_path(h.run_dir), remote_path(f"{h.run_dir}/{rel}")
            return cluster_ssh(run.cluster, f"test -d {d} && cat > {target}.part && mv {target}.part {target}",
                               check=False, stdin=text) is not None
        if s3_ready(h):
            try:
                S3Volume(h.volume).write(f"{h.volume['key_prefix']}/{run.id}/{rel}", text)
                return True
            except Exception:  # noqa: BLE001 - not writable: the caller says what that means
                return False
        return False

    def down(self, run: Run) -> None:
        """Cancel the job, then the machines go (bounded waits). `launch down` has asked the trainer
        for its final checkpoint before this (final_save.py): SIGTERM is only SkyPilot's way to stop it."""
        sky, h = sdk(), run.handle
        for attempt in range(1, BUSY_TRIES + 1):
            try:
                if h.kind == "managed_job":
                    self._cancel_managed(sky, run)
                else:
                    self._down_cluster(sky, run)
                return
            except BackendError:
                raise
            except Exception as e:  # noqa: BLE001
                from sky import exceptions as ex

                if isinstance(e, ex.ClusterDoesNotExist):
                    return
                if attempt < BUSY_TRIES and _server_busy(e):
                    time.sleep(BUSY_WAIT_S)  # the API server is still taking a signalled `up`'s launch
                    continue
                raise map_sky_error(e) from None

    def _down_cluster(self, sky, run: Run) -> None:
        """`sky.cancel` (SIGTERM, and SIGKILL SKY_KILL_AFTER_S later: no use waiting longer for the
        run's status.json to say it ended), then `sky.down`; graceful for bucket mounts, so
        MOUNT_CACHED checkpoint uploads finish first."""
        if run_state.cluster_up(run=run) and self._job_active(sky, run):
            before = run_state.status_json(run=run, up=True) or {}
            sky.get(sky.cancel(run.cluster, job_ids=[run.handle.job_id]))
            if before.get("state") and before["state"] not in _ENDED:  # a trainer to wait for
                control.wait_until(
                    lambda: (run_state.status_json(run=run, up=True) or {}).get("state") in _ENDED,
                    control.SKY_KILL_AFTER_S + control.POLL_S)
        flush = {"graceful": True, "graceful_timeout": control.DOWN_GRACE_S} if run.handle.bucket else {}
        sky.get(sky.down(run.cluster, **flush))

    def _job_active(self, sky, run: Run) -> bool:
        job_id = run.handle.job_id
        if job_id is None:
            return False
        jobs = job_statuses(sky, run.cluster, job_id)
        return enum_name(jobs.get(job_id, jobs.get(str(job_id)))) in ("PENDING", "SETTING_UP", "RUNNING")

    def _cancel_managed(self, sky, run: Run) -> None:
        """`sky.jobs.cancel` (graceful: the task gets SIGTERM, then its cluster goes), then wait until
        the controller says the job ended, so nothing of it bills when `launch down` returns."""
        h = run.handle
        by = {"job_ids": [h.job_id]} if h.job_id is not None else {"name": h.job_name}
        try:
            sky.get(sky.jobs.cancel(**by, graceful=True, graceful_timeout=control.DOWN_GRACE_S))
        except Exception as e:
            if controller_gone(e):  # it went away because no job of it was active: nothing to cancel
                return
            raise

        def ended() -> bool:
            try:
                rec = run_state.managed_record(sky=sky, handle=h)
            except Exception as e:
                if controller_gone(e):
                    return True
                raise
            return rec is None or enum_name(record_field(rec, "status")).startswith(control.MANAGED_TERMINAL)

        if not control.wait_until(ended, 2 * control.DOWN_GRACE_S):
            raise BackendError(f"managed job {h.job_id or h.job_name} is still being cancelled "
                               f"after {2 * control.DOWN_GRACE_S:g} s and may bill until it ends: check "
                               "`sky jobs queue`, then `sky jobs cancel` it")

    # -- fetch

    def list_files(self, run: Run, roots: tuple[str, ...]) -> dict[str, int]:
        return self._files(run).list(roots)

    def copy_files(self, run: Run, rels: list[str], into: Path) -> None:
        self._files(run).copy(rels, into)

    def _files(self, run: Run) -> RunFiles:
        if run.id not in self._routes:  # decided once per run: a cluster may autostop meanwhile
            self._routes[run.id] = RunFiles.of(run, lambda: run_state.cluster_up(run=run))
        return self._routes[run.id]
