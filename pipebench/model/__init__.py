"""The model room: the arithmetic every reader of results shares, below them all.

`costs` (the cost model: a chain's rate and starvation predicted from its single-process costs, and the
workers and cores a target needs), `judging` (the one spread-and-verdict rule the report's ★ and ≈ and
tune's races read, and the verdict words). It imports only `base`, so the plan-time checks can use it
as well as report/, regress/, explore/ and tune/.
"""
