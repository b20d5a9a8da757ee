"""The protocol-neutral core: data plane, control, model manager, scheduling."""
