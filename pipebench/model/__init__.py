"""The model room: the arithmetic every reader of results shares, below them all.

`costs` (the cost model: a chain's rate and starvation predicted from its single-process costs, and the
workers and cores a target needs), `judging` (the one spread-and-verdict rule the report's ★ and ≈ and
tune's races read, and the verdict words), `shards` (what splitting an epoch's shards among readers
costs, and the lines that say so). It imports only `base`, so the plan-time checks and the catalogues
can use it as well as report/, regress/, explore/ and tune/.
"""
