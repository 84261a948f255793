"""ELF files as the dynamic loader sees them: `read` (one file), `cache` (what was read, kept
by the file's identity), `loader` (search path and link map), `opnames` (operator names in
read-only data). pyelftools only."""
