"""The transform catalogue: the seed chain's transforms, their fast variants and batch forms."""
