"""ELF files as the dynamic loader sees them: `read` (one file), `loader` (search path and
link map), `opnames` (operator names in read-only data). pyelftools only."""
