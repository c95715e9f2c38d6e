"""DeepSpeed ZeRO 0-3, plan side: ``spec`` (SPEC: layouts, levers, cost, rungs, words), ``memory`` (the memory
terms), ``emit`` (ds_config.json from the templates/ package data), ``check`` (DeepSpeed's own parser at plan time).
The rank side is launcher.worker.engines.deepspeed. Nothing is imported here: the registry (launcher.engines)
imports the spec by name."""
