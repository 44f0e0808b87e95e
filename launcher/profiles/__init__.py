"""A profile, from the YAML you wrote to what goes to the machine.

`schema` is a profile's schema (the payload's RunConfig plus `cluster:`, `budget:`, `estimate:`,
`envs:`); `profile` loads `clusters/<name>.yaml` into it and applies `--set`; `checks` is everything checked before money (`validate`, `plan`, `up`), with
`data_count` (records and tokens counted as the data step will: what `plan` estimates from and what
no backend starts without), `datahints` for a missing data file and `cloud_names` for volume and bucket names; `boundary` is what
may cross to a run (paths inside their root by every route, env values not shaped like a token);
`render` writes `sky/<name>.yaml` and the resolved run config; `uploads` is the allowlist of files
uploaded; `scaffold` is `launch init`, `preview` is `launch data preview`. It may import term/, store/
and errors, and enters the payload through launcher/doors.py.
"""
