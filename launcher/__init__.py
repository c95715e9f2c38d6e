"""launcher: a planner/launcher for memory-budgeted fine-tunes (docs/architecture.md)."""

import logging as _logging

# transformers (quantizers/auto.py) and peft import torchao whenever it is installed, and it is (QLoRA's NF4 base,
# launcher.worker.qlora); the import logs to stderr through logging's last-resort handler: torchao's CUDA-only
# kernels that cannot load here (torchao/__init__.py "Failed to load") and torch's deprecation of its Enum pytree
# registrations (torch/utils/_pytree.py). Neither matters to a run; `launch` keeps stderr for real problems, so
# every launcher process (CLI and ranks) raises those two loggers to ERROR before anything imports torchao.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
