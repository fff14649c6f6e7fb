"""The harness: a candidate verified against its problem, in processes that run untrusted code in a
sandbox (docs/harness.md). Its parts, each a folder of its own, from the bottom up:

* `sandbox/`: how untrusted processes are started, confined and talked to (bubblewrap, seccomp,
  scratch folders, the signed channel); uses nothing of ours but `kb`.
* `gpu/`: the GPU as a shared resource (the machine-wide lane and its key, the device's memory,
  the memory plan); uses nothing of ours but `kb`.
* `judgment/`: what a verification concludes (options, findings, the verdict and `judge`, the
  precision and static checks); may use `gpu` (the memory report) and `sandbox` (the SASS read).
* the modules here: what both sides and both flows share (problems, candidates, second shapes,
  phases, baselines, the plausibility bound, the profile records, `protocol`, every message between
  the server side and the sandbox); they may use `judgment` and `gpu`.
* `builds/`: what a candidate may ask of the compilers, the build service, builds ahead and the
  compile-only path; may use the modules here, `judgment` and `sandbox`.
* `pool/`: the worker pool, its worker processes and its census and baselines sides; may use every
  part above and `kb_mcp.profiling` (the work census).
* `worker/`: the worker side, the only code that imports torch, run inside the sandbox as processes
  of its own; it uses the pure modules (the modules here, `judgment`, `gpu`'s memory plan,
  `builds`' toolchain, `sandbox`'s channel) and nothing above imports it.

`kb_mcp.profiling` (Nsight Compute) sits between the shared modules and `pool/`. docs/architecture.md
("Import rules") holds the table and tests/test_architecture.py checks it.
"""
