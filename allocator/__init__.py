"""gpuslice.allocator: the node daemon (slice store, slice files, placement, compute, its sockets)."""
