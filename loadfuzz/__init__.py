"""loadfuzz: a process-isolated load-order fuzzer for the native libraries Python wheels ship.

The pipeline, one stage a module or package: `inventory` (with `targets`,
`elf`, `registries`) reads what a target ships; `plan` and `predict` choose
load orders; `run` executes them in the C harness; `classify` names what
happened; `expect`, `campaign`, `results` and `report` sum a campaign up;
`search` fuzzes and reproduces; `cli`, `api` and `pytest_plugin` are the ways
in. `model` is the vocabulary they all share.
"""
