"""A run's handle: what its backend, its start and its refreshes learnt of it, kept in the registry's
`handle` column as one JSON object (launcher/store/registry.py).

One typed field per key launch writes or reads, each saying who writes it and who reads it; every
other key (one a newer or an older launch wrote) is kept in `extra`, so a record read and saved again
loses nothing. `to_dict()` is the JSON object as it was: a key is in it once it was read from the
registry or set (None included: a SkyPilot run records `"bucket": null`), in the order it came, and a
key never set is absent, so the stored JSON and every `--json` output are what they were while the
handle was a plain dict. A value of another type than its field's (a hand-edited registry) reads as
None, as the readers treated it, and is kept as it was in `extra`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union, get_args, get_type_hints


@dataclass(eq=False, repr=False)
class Handle:
    # -- where a local or ssh run lives: written by backends/local.py and backends/ssh.py `up`
    pid: Optional[int] = None
    """The run's driver process (on this machine, or the ssh host). Read by the local backend's
    `_alive`/`status` and ssh's `_state`: none means `launch up` stopped before the driver started."""
    pgid: Optional[int] = None
    """The driver's process group, signalled by local `down` and polled by ssh `_finished`."""
    home: Optional[str] = None
    """local: the run's own directory ($LAUNCH_HOME/local/RUN: driver, logs, exit code). The backend
    computes it again (LocalBackend.home); kept for people and tests."""
    volume: Union[str, dict, None] = None
    """local and ssh: the volume's directory, a path (on this machine, or the host), read by local's
    `volume`, plan/calibration.py and ssh's `up` (a resume keeps it) and `down`. skypilot: the
    SkyPilot volume as a dict (name, type, region, zone, mount, key_prefix, created, adopted), or None
    without one, read by skypilot/files.py (S3 reads and fetches), runs/volumes.py and runs/teardown.py."""
    num_nodes: Optional[int] = None
    """local: how many node processes it runs, read by runs/refresh.py `backend_for`."""
    run_dir: Optional[str] = None
    """The payload's run directory where the run runs (local, ssh and skypilot `up`), read by every
    backend's status, files and access, by plan/calibration.py and runs/teardown.py."""

    # -- how an ssh run is reached: written by backends/ssh.py `up`, read by its `_conn` unless said
    ssh_route: Optional[dict] = None
    """What ~/.ssh/config said of the host at `up` (identity files, jumps, proxy command: sshconn.Target.route)."""
    host: Optional[str] = None
    """`user@host:port`; also read by runs/refresh.py, runs/pick.py (a resume goes there) and runs/teardown.py."""
    known_hosts: Optional[str] = None
    """The known_hosts file the host key was checked against."""
    identity_file: Optional[str] = None
    """The key given with --identity-file (None: ssh config's or the agent's); also read by runs/pick.py."""
    remote_root: Optional[str] = None
    """Where the runs' own directories are on the host; read by ssh `up` (a resume keeps its place)."""
    run_root: Optional[str] = None
    """The run's own directory on the host (workdir, driver, pid, exit code), read by ssh logs/status/down."""
    log: Optional[str] = None
    """The run's log on the host, read by ssh `logs`."""
    gpus_per_node: Optional[int] = None
    """The GPUs torchrun was started with on the host (for people; nothing reads it)."""
    upload: Optional[dict] = None
    """What the last upload of the workdir sent (files_sent, bytes_sent, files_unchanged, files_removed)."""

    # -- a SkyPilot run: written by backends/skypilot/backend.py `up`, read by that backend unless said
    kind: Optional[str] = None
    """"cluster" or "managed_job"; also read by skypilot/files.py and runs/volumes.py."""
    job_name: Optional[str] = None
    """The managed job's name (the run id), read by logs, cancel and skypilot/runpod_pods.py."""
    cluster: Optional[str] = None
    """A cluster run's cluster name (the backend reads `Run.cluster`; kept for people)."""
    infra: Optional[list] = None
    """The profile's `cluster.infra` list, read by skypilot/runpod_pods.py (is the job on RunPod)."""
    bucket: Optional[dict] = None
    """The profile's bucket (store, name, mount, mode), or None; read by `down` (a graceful flush),
    skypilot/files.py (where the files are), runs/volumes.py and runs/teardown.py."""
    push_to_hub: Optional[str] = None
    """The profile's outputs.push_to_hub, or None; read by skypilot/files.py (where the model went)."""
    slurm_login: Optional[str] = None
    """A Slurm run's login node (`Host` of ~/.slurm/config), read by skypilot/slurm_login.py and files.py."""
    autostop_minutes: Optional[Union[int, float]] = None
    """A cluster's autostop, read by `status`: a gone cluster billed that long after the run ended."""
    job_id: Optional[Union[int, str]] = None
    """SkyPilot's job id (None: detached before it was known), read by logs/status/down and runpod_pods.py."""
    runpod_pods_seen: Optional[str] = None
    """The job's cluster as RunPod names its pods, once RunPod listed one: written by the refresh from
    `status` (skypilot/runpod_pods.py Verdict.keep), read by runpod_pods.check."""

    # -- the experiment: written by runs/experiment.py `recorded` at every start and resume
    overrides: Optional[list] = None
    """The `--set KEY=VALUE` overrides, read by runs/experiment.py (a resume carries them),
    runs/refresh.py (status rows) and results/compare.py."""
    envs: Optional[dict] = None
    """The `--env` additions, read by runs/experiment.py and runs/refresh.py."""
    config: Optional[dict] = None
    """The resolved profile, flattened, read by runs/experiment.py (the resume rule), runs/pick.py and
    results/compare.py."""
    history: Optional[list] = None
    """One entry per start and resume, read by runs/refresh.py (status rows) and results/compare.py."""
    provenance: Optional[dict] = None
    """What produced the run (commit, diff, profile and data hashes); a new run's only. Read by
    runs/experiment.py, runs/refresh.py and results/compare.py."""

    # -- written by runs/refresh.py `remember`, read by its status rows
    last_status: Optional[dict] = None
    """Where the run got to when last seen (step, loss, stage...), shown once it has ended."""

    extra: dict = field(default_factory=dict)
    """Every key launch does not know, and a known key whose value has another type, as stored."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_keys", {k: None for k in _TYPES if getattr(self, k) is not None})

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self, name, value)
        keys = self.__dict__.get("_keys")
        if keys is not None and name in _TYPES:  # set after construction: in the record, None too
            keys.setdefault(name, None)
            self.extra.pop(name, None)

    @classmethod
    def from_dict(cls, d) -> "Handle":
        """The handle of a stored JSON object: keys absent stay unset, unknown keys and values of another
        type go to `extra`; anything but a dict reads as an empty handle (as the registry read it)."""
        h = cls()
        for k, v in (d.items() if isinstance(d, dict) else ()):
            if k in _TYPES and (v is None or _fits(v, _TYPES[k])):
                setattr(h, k, v)
            else:
                h._keys.setdefault(k, None)
                h.extra[k] = v
        return h

    def to_dict(self) -> dict:
        """The JSON object stored: the keys read or set, in that order, then any added to `extra`."""
        out = {k: self.extra[k] if k in self.extra else getattr(self, k) for k in self._keys
               if k in self.extra or k in _TYPES}
        return {**out, **{k: v for k, v in self.extra.items() if k not in out}}

    def update(self, **values) -> "Handle":
        """Set these fields, in this order (a name that is no field is a TypeError); returns self."""
        for k, v in values.items():
            if k not in _TYPES:
                raise TypeError(f"Handle has no field {k!r}")
            setattr(self, k, v)
        return self

    def copy(self) -> "Handle":
        """A new handle with the same keys (values shared, as `dict(handle)` shared them)."""
        return Handle.from_dict(self.to_dict())

    def merged(self, changes: Union["Handle", dict]) -> "Handle":
        """A new handle with `changes` on top (the keys a Handle has set, or a dict's), as
        `{**old, **new}` merged two dicts: a key already there keeps its place."""
        new = changes.to_dict() if isinstance(changes, Handle) else dict(changes)
        return Handle.from_dict({**self.to_dict(), **new})

    def __eq__(self, other) -> bool:
        return self.to_dict() == other.to_dict() if isinstance(other, Handle) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Handle({self.to_dict()!r})"


def _accepted(hint) -> tuple:
    """The types a field's annotation allows, None aside (Optional[Union[int, float]] -> (int, float))."""
    return tuple(a for a in get_args(hint) or (hint,) if a is not type(None))


_TYPES = {k: _accepted(hint) for k, hint in get_type_hints(Handle).items() if k != "extra"}


def _fits(value, types: tuple) -> bool:
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
