"""Execute: run trials in the C harness. `build` compiles it, `harness` speaks its protocol to
one server process, `tiers` chooses what a server preloads, `warm` when it starts its interpreter
too, `pool` keeps the servers, and
`trials` turns sequences into classified, confirmed trial records."""
