"""modelhost on Ray Serve (`modelhost ray`, the `ray` extra): replicas that each run modelhost's core, behind an
ingress that routes every request to a replica holding its model (docs/scale-out.md)."""
