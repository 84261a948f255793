"""Execute: run trials in the C harness.

`build` compiles it; `harness` speaks its protocol to one server process, and
`processes` watches such a process from outside; `pycode` writes a Python
step's source. `tiers` chooses what a server preloads (checked by
`rebinding`, with `standins` for libraries under test loaded ahead of a
step), `warm` when it starts its interpreter too, `ahead` starts servers
before the inventory is read, `pool` keeps them, and `schedule` hands the
work to threads. `trials` turns sequences into classified, confirmed trial
records; `ldtrace` reads what the loader said about a trial, for `explain`.
"""
