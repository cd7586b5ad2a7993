"""`python -m jaxformer.plan`: a training config compiled for a TPU topology from any machine.

The machinery is `jaxformer.train.planning` (one step's costs) and
`jaxformer.train.plan_search` (the best sharding); this package is their command line.
"""
