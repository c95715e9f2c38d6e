"""The per-rank training worker: what ``python -m launcher.rank_entry RUN_DIR`` runs under torchrun.

It reads RUN_DIR/job.yaml, plan.json and ds_config.json, trains with the planned
engine, and writes RUN_DIR/ranks/rank-K.json, RUN_DIR/steps/rank-K.jsonl and
RUN_DIR/checkpoint/. Exit codes: 0 completed or checkpointed, 75 out of memory
(or over the enforced cap), 2 bad input, 1 any other failure.
"""
