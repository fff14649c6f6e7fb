"""The worker pool: the requests of candidates verified in warm sandboxed worker processes (`pool`),
the lifecycle of those processes (`workers`), one such process with its channel and output
(`process`), the census answers taken in the census worker (`census_side`),
and the baselines timed in a worker no candidate ran in (`baseline_side`). It may use every other
part of the server side of the harness, `kb_mcp.profiling` (the work census) and `kb`; nothing of
the harness imports it."""
