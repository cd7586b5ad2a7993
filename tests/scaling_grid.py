"""A small start grid for Chinchilla approach-3 fits in tests (the paper's 4,500-row grid
takes 10-20 s a fit)."""

from jaxformer.scaling import chinchilla


def small_grid():
  """72 rows of the paper's grid around (not at) the test laws: a, b <= 10, e in {0, 0.5},
  alpha, beta in {0.5, 1}."""
  grid = chinchilla.paper_grid()
  a, b, e, alpha, beta = grid.T
  keep = ((a <= 10) & (b <= 10) & (e >= 0) & (e <= 0.5) & (alpha > 0) & (alpha <= 1) &
          (beta > 0) & (beta <= 1))
  return grid[keep]
