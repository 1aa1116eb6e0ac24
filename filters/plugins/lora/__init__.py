"""LoRA adapters of a pool: adapter affinity and the adapter named to the replica."""
