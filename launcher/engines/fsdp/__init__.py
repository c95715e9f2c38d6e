"""FSDP2 (fully_shard), plan side: ``spec`` (SPEC: layouts, levers, cost, rungs, words), ``memory`` (the memory
terms), ``emit`` (fsdp.yaml and accelerate's FSDP2 config). The rank side is launcher.worker.engines.fsdp. Nothing
is imported here: the registry (launcher.engines) imports the spec by name."""
