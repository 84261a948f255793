"""Execute: run trials in the C harness. `build` compiles it, `harness` speaks its protocol to
one server process, `tiers` chooses what a server preloads, `pool` keeps the servers, and
`trials` turns sequences into classified, confirmed trial records."""
