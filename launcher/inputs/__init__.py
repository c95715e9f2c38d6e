"""The planner's inputs, gathered from the job, the model and the machine: ``plan_inputs`` (model statistics,
activation constants, the request), ``machine`` (GPU, RAM, NVMe, the hardware profile), ``precision`` (what a
device computes in), ``cache`` (the one reader of LAUNCHER_CACHE) and ``variants`` (a job's sweep: section)."""
