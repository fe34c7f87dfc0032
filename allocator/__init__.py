"""gpuslice.allocator: the node daemon (inventory, ledger, placement, leases)."""
