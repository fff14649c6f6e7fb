"""The judgment: what a caller asks of a verification and what it may claim (`options`, `caps`), the
findings a verification records (`findings`) and the one function that turns evidence into a verdict
(`verdict`), the precision a candidate's kernels compute in and the precision probes' rule
(`precision`, `probing`), the static checks (`integrity_static`, `static/`) and the kernel
census's findings (`kernels`). Pure but for `precision`'s SASS read, run in the sandbox. It may use
`harness.gpu` (the memory report), `harness.sandbox` and `kb`."""
