"""The builds: what a candidate may ask of the compilers (`allow_lists`), the compiler
runs built from it (`toolchain`), the build service that builds
`load_inline` extensions in the sandbox and publishes them (`builds`), builds ahead of a verification
(`ahead`) and the compile-only path (`compile_only`). It may use the harness's shared modules
(`harness.candidate`, `harness.problem`, `harness.protocol`), `harness.judgment`, `harness.sandbox`
and `kb`."""
