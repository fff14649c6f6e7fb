"""The static checks' parts (pure Python, no torch): the vocabulary of ops and allow-lists
(`vocabulary`), C++/CUDA source held in strings (`cpp`), what a file's names mean (`names`), the
checks of code reachable from `ModelNew.forward` (`forward`) and of the whole file (`file_checks`).
`harness.judgment.integrity_static.check_source` runs them; nothing else imports this package's internals.
"""
