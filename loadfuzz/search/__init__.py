"""Search: find load orders that fail and make them minimal. `shrink` (the shared minimiser),
`fuzz` (Hypothesis exploration: its `rounds`, run by `workers` on every core) and `repro`
(from a crash log line to a minimal order)."""
