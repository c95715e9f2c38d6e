"""The rank side's entry and its built-in training worker. ``rank_entry`` is what torchrun starts on every rank
(``python -m launcher.worker.rank_entry RUN_DIR [--script PATH -- ARGS...]``): the rank's log, then this worker or
a user's --script (launcher.runtime.script).

The worker reads RUN_DIR/job.yaml, plan.json and ds_config.json, trains with the planned
engine, and writes RUN_DIR/ranks/rank-K.json, RUN_DIR/steps/rank-K.jsonl and
RUN_DIR/checkpoint/. Exit codes: 0 completed or checkpointed, 75 out of memory
(or over the enforced cap), 2 bad input, 1 any other failure.
"""
