"""A run's life: start it, follow it, resume it, stop it, and what keeps billing after.

`start` is `launch up` as named steps (resolve, claim, place, plan and gate, start, record), with
`pick` (the claims, and which run a resume continues, where) and `rendering` (the task a run starts
with, and the dry run's account of it); `experiment` holds the resume rule (a resumed run keeps its
recorded config; what may change is payload/config/resume.py's) and the run's provenance; `rehearse`
is `--rehearse`; `refresh` is the refresh of a run's state and bill and its status row; `lifecycle`
is `logs`, `status` (with its budget teardown) and `cost`; `teardown` is `down`; `access` is `launch
ssh`/`exec`; `volumes` is what keeps billing after `down`. It may import backends/, plan/, catalog/,
profiles/, store/, term/, errors and the launcher's version.
"""
