"""Profiling under Nsight Compute, the product's second flow (`profile_kernel`, `classify_state`):
a profile of one forward (`profiler`, with its standby drivers `profile_standby` and ncu run in the
sandbox `ncu_run`), ncu's CSV pages read into `harness.profile_model` records (`ncu_parse`), a user's
own report read (`ncu_import`), profiles stored by id (`profile_store`), and the work census a
verification asks for (`work`).
Server side, no torch: the process ncu profiles is `harness.worker.profile_driver`, on the worker
side. It may use `harness.sandbox`, `harness.gpu`, the harness's shared modules (`harness.problem`,
`harness.protocol`, `harness.profile_model`, `harness.plausibility`) and `kb`; `harness.pool` and
`tools` use it."""
