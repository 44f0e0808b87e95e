"""The plan: what a profile will run on, how long it takes, what it costs, whether it fits, before money.

`estimate` is `launch plan` itself (instance and $/hour from the catalog, every billed phase, memory,
storage); a plan's dollars and their low-high range are decided in `cost`; tokens/s comes from
`speed` (anchors x MFU) with `throughput` (datasheets, network, stage factors) and `calibration`
(your own finished runs), from records and tokens counted as the data step will (profiles/
data_count.py); `storage` prices volumes and buckets per month, `compare` ranks what to rent,
`budget_gate` is the question before a run planned over its cap, `show` prints it. It may import catalog/, profiles/, store/,
term/ and errors.
"""
