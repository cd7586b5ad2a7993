"""Device meshes, the logical-axis -> mesh-axis table, sharded state/batches, multi-host init
and stops every process agrees on.

    initialize()                                  # no-op on one process
    process_zero_first(fn, 'preparing the data')  # one-time work once, the others wait
    plan = ShardingPlan.from_config(config.mesh)  # mesh + logical rules
    state, shardings = plan.init_state(init_boxed)
    with StopRequest(start) as stop: ... stop.reached(step)   # SIGTERM: all stop at one step
    with Watchdog(timeout): ... watchdog.beat(phase, step)     # no process waits forever
"""

from jaxformer.parallel.distributed import barrier, initialize, process_zero_first
from jaxformer.parallel.mesh import make_mesh, resolve_mesh_shape
from jaxformer.parallel.preemption import StopRequest
from jaxformer.parallel.rules import MESH_AXES, logical_axis_rules
from jaxformer.parallel.sharding import CompiledStep, ShardingPlan, per_device_bytes
from jaxformer.parallel.watchdog import Watchdog

__all__ = ["MESH_AXES", "CompiledStep", "ShardingPlan", "StopRequest", "Watchdog", "barrier",
           "initialize",
           "logical_axis_rules", "make_mesh", "per_device_bytes", "process_zero_first",
           "resolve_mesh_shape"]
