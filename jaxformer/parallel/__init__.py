"""Device meshes and the logical-axis -> mesh-axis table."""
