"""`python -m jaxformer.plan`: a training config compiled for a TPU topology from any machine.

The machinery is `jaxformer.train.planning` (one step's costs) and
`jaxformer.train.plan_search` (the best sharding); this package is their command line.
"""

EXIT_DOES_NOT_FIT = 3    # the step (with --search: every candidate) does not fit in HBM
