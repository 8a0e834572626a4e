"""The model room: the arithmetic every reader of results shares (`costs`, `judging`, `shards`).

It imports only `base`, so the plan-time checks and the catalogues can use it as well as report/,
regress/, explore/ and tune/ (docs/layout.md).
"""
