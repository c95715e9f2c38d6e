"""The plain engine, plan side: no sharding wrapper. One rank trains the model as it is; several ranks hold a whole
replica each under torch DDP. ``layout`` (PlainLayout), ``memory`` (its terms), ``spec`` (SPEC: layouts, levers,
cost, words, accelerate's config). The rank side is launcher.worker.engines.plain. Nothing is imported here: the
registry (launcher.engines) imports the spec by name."""
