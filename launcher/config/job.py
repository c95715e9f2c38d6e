"""The job file's typed schema.

Field names are the YAML keys unless a field's metadata names another key
(``yaml``); fields holding a size end in ``_bytes`` and accept '16GB'-style
strings in the file. ``None`` in ``StrategyConfig`` means "the planner chooses".
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Literal

from launcher.config.fields import with_fields
from launcher.engines import LAYOUT_FIELDS, NAMES
from launcher.levers import PERMITS, with_lever_fields

Task = Literal["causal_lm", "seq_cls", "sentence_embedding"]
Precision = Literal["bf16", "fp16", "fp32"]
PrecisionChoice = Literal["auto", "bf16", "fp16", "fp32"]
"""What a job may ask for: a dtype, or auto (bf16 where the devices compute it natively, else fp32)."""
Engine = Literal[NAMES]
"""A registered engine's name (launcher.engines.LAYOUTS)."""
Family = Literal["gpt2", "llama", "bert"]
MathLever = Literal[PERMITS]
"""A memory lever that changes the training math, used only when train.allow_levers lists it (docs/levers.md): the
words its LeverSpec permits (launcher.levers)."""


def _yaml(key: str, **kw):
    return field(metadata={"yaml": key}, **kw)


@dataclass(kw_only=True, slots=True)
class InlineArch:
    """A model architecture given inline; built with random weights."""

    family: Family
    """Which transformers architecture: gpt2 (causal), llama (causal), bert (encoder)."""
    hidden_size: int
    """Model width h, in features."""
    num_layers: int
    """Transformer blocks."""
    num_heads: int
    """Attention heads."""
    num_kv_heads: int | None = None
    """Key/value heads for GQA (llama); defaults to num_heads."""
    intermediate_size: int | None = None
    """MLP width, in features; defaults to 4h (gpt2, bert) or the llama rule."""
    vocab_size: int = 32000
    """Tokens in the vocabulary."""
    max_position_embeddings: int = 2048
    """Longest sequence the position table holds, in tokens."""
    tie_word_embeddings: bool | None = None
    """Share input and output embeddings; defaults to the family's default."""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """The training data: one local file, a save_to_disk directory or a cached hub dataset, tokenized to a fixed
    length (docs/data.md)."""

    path: str
    """A local .jsonl/.json/.csv/.parquet/.arrow file or save_to_disk directory (relative to the job file's
    directory, or absolute), or a hub dataset id already in the local Hugging Face cache."""
    format: Literal["auto", "text", "messages", "prompt_completion"] = "auto"
    """causal_lm rows: text (data.text_field), messages (a chat, loss on assistant turns), prompt_completion (loss
    on the completion); auto takes the first row's fields (messages, then prompt + completion, then text)."""
    text_field: str = "text"
    """The field holding each example's text."""
    packing: bool = False
    """causal_lm: several examples per max_seq_len sequence, position ids restarted per example; attention stays
    within an example with flash_attention_2 only (docs/data.md)."""
    label_field: str = "label"
    """seq_cls: the field holding the class label."""
    pair_field: str = "positive"
    """sentence_embedding: the field holding each text's positive pair."""
    max_seq_len: int = 512
    """Tokens per sequence after truncation."""
    num_labels: int | None = None
    """seq_cls: classes; defaults to the count found in the data."""
    eval_fraction: float = 0.1
    """Share of examples held out for evaluation, 0 to 0.5."""


@dataclass(kw_only=True, slots=True)
class LoraConfig:
    """Low-rank adapters (peft) on the named modules; everything else is frozen."""

    r: int = 8
    """Adapter rank, in features."""
    alpha: float = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input, 0 to 1."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Module names (suffixes) that get adapters, e.g. q_proj, c_attn, query."""
    merge: bool = False
    """Also export the base model with the adapters merged in (RUN_DIR/model/merged/, a full model in the saved
    dtype) beside the adapter; costs the full model in rank 0's host memory at the end (docs/export.md)."""


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """What one training run does: batch, precision, optimizer, schedule, length."""

    global_batch_size: int
    """Sequences per optimizer step over all ranks; the planner never changes it."""
    precision: PrecisionChoice = "auto"
    """Compute dtype: auto (bf16 on GPUs of compute capability 8.0+ and on CPUs with AMX or AVX512-BF16, fp32
    elsewhere; the plan says which and why), bf16, fp16 (CUDA only) or fp32."""
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    """Optimizer; adamw keeps 2 fp32 states per parameter, sgd none."""
    lr: float = 2e-5
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    max_grad_norm: float | None = 1.0
    """Gradient clipping: before each optimizer step, if the L2 norm of all gradients together (over every rank and
    shard, after averaging over ranks and micro-batches) exceeds this, every gradient is scaled by
    max_grad_norm / norm. Every engine applies it the same way (DeepSpeed's gradient_clipping, FSDP2 in the
    worker); 1.0 is HF Trainer's default; 0 or null turns clipping off."""
    max_steps: int | None = None
    """Optimizer steps to run; give this or epochs."""
    epochs: float | None = None
    """Passes over the training data; give this or max_steps."""
    seed: int = 0
    """Seed for data order, init and dropout."""
    log_every_steps: int = 1
    """Steps between log steps, the only ones that read the loss on the host (a device sync) and write loss,
    tokens/s and the clip norm into steps/rank-K.jsonl; the first and the last step are log steps too. Every step
    still writes its line (progress, memory, lr)."""
    eval_every_steps: int = 0
    """Steps between evaluations; 0 evaluates once at the end."""
    lora: LoraConfig | None = None
    """Train low-rank adapters only (peft)."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] | None = None
    """transformers' attention kernel; None keeps the model config's (_attn_implementation), else sdpa. eager
    saves the a·s² score matrices per block, sdpa and flash_attention_2 do not: the plan's activation term follows."""
    checkpoint_every_steps: int = 0
    """Steps between checkpoints; 0 saves once at the end."""
    warn_total_time_h: float | None = 72.0
    """Hours of predicted training (step time x steps) past which the plan warns; null never warns. 72 h is
    past the longest wall time most Slurm partitions grant one job, so a run this long needs requeues or a
    different plan, and is worth a second look before it starts."""
    allow_levers: list[MathLever] = field(default_factory=list)
    """Memory levers that change the training math which the planner may use to fit the budget: adamw8bit and
    adamw4bit (block-quantized Adam states), adafactor (factored second moment), pure_bf16 (bf16 weights, grads
    and states, no fp32 master) and qlora (the LoRA base in 4-bit NF4). [] (the default) allows none; the exact
    levers (chunked loss, selective checkpointing, activation offload, optimizer step in backward) need no
    permission (docs/levers.md)."""


@dataclass(kw_only=True, slots=True)
@with_lever_fields(pins=True, after="activation_checkpointing")
@with_fields({name: (kind | None, None) for name, kind, _ in LAYOUT_FIELDS}, after="engine")
class StrategyConfig:
    """Each field left out (None) is chosen by the planner; a given one is kept. After engine come the pins of the
    engines' layouts, flat (launcher.engines.LAYOUT_FIELDS: zero_stage, fsdp_reshard_after_forward, fsdp_sharding,
    offload_optimizer, offload_params; each field's "pin" metadata says what it sets), and after
    activation_checkpointing one per registered lever (launcher.levers: its LeverSpec.pin_doc)."""

    engine: Engine | None = None
    """deepspeed or fsdp (FSDP2)."""
    micro_batch_size: int | None = None
    """Sequences per rank per forward pass."""
    activation_checkpointing: bool | None = None
    """Recompute blocks' activations in backward (every checkpoint_every-th block)."""
    safety_margin: float = 0.05
    """Share of the budget kept free for what the model does not see, 0 to 0.5."""


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """The machines the job runs on: host RAM, NVMe, GPUs per node and the hardware profile."""

    host_ram_per_node_bytes: int | None = _yaml("host_ram_per_node", default=None)
    """Host RAM per node, bytes ('512GB' in the file); None reads this machine's."""
    nvme_path: str | None = None
    """Local NVMe directory for offload."""
    nvme_free_bytes: int | None = _yaml("nvme_free", default=None)
    """Free bytes on nvme_path ('2TB' in the file); None reads the filesystem."""
    gpus_per_node: int | None = None
    """GPUs per node; defaults to --gpus on one node."""
    cpus_per_node: int | None = None
    """CPUs Slurm gives a job on one node (`sinfo -o %c`); a Slurm job's --cpus-per-task shares them among the
    node's ranks. None: the hardware profile's CPUs per device (8 per GPU, the low end of GPU nodes; 1 per CPU
    rank)."""
    hardware: str = "auto"
    """Hardware profile: a10g, l4, l40s, a100-40gb, a100-80gb, h100-80gb (SXM), h100-pcie, h200, b200, mi300x,
    rtx4090, v100-16gb, cpu, or auto (the card nvidia-smi or rocm-smi names; launcher.planner.hardware)."""


@dataclass(kw_only=True, slots=True)
class SlurmConfig:
    """Slurm submission settings (launcher: slurm, and `launch plan --sbatch`); each maps to an #SBATCH option or
    submitit parameter. Every value but ``setup`` is checked for its Slurm syntax and for control characters
    (launcher.config.slurm_rules) before it is written anywhere; time, memory and CPUs left out are derived from
    the plan (launcher.emit.slurm_params.slurm_resources)."""

    partition: str | None = None
    """Slurm partition, or several joined by commas (letters, digits, '_', '-', '.')."""
    account: str | None = None
    """Slurm account (letters, digits, '_', '-', '.')."""
    qos: str | None = None
    """Quality of service (letters, digits, '_', '-', '.')."""
    timeout_min: int | None = None
    """Time limit, minutes; None derives it from the plan: predicted step time x the run's steps (train.max_steps,
    or train.epochs over the data) x 1.5 plus the start-up (weight load, DeepSpeed op build, first step)."""
    cpus_per_task: int | None = None
    """CPUs per task (one task per node runs the torchrun agent and all its ranks), 1 to 4096; None derives it:
    cluster.cpus_per_node, else the hardware profile's CPUs per device x the node's ranks."""
    mem_gb: float | None = None
    """Host memory per node, in Slurm's GB (--mem=64GB: Slurm counts 1024 MB to its GB, so GiB), 1 to 65536; None
    derives it from the plan's host RAM per node x 1.25 plus each rank's process."""
    constraint: str | None = None
    """Node feature constraint: features joined by & | , with [] () *N ! and no spaces, e.g. a100&ib."""
    exclusive: bool = False
    """Request whole nodes."""
    signal_delay_s: int = 90
    """Seconds before the time limit when USR2 asks for a checkpoint."""
    max_requeues: int = 3
    """Requeues after preemption or timeout before giving up."""
    array_parallelism: int = 64
    """Array tasks running at once."""
    additional_parameters: dict[str, object] = field(default_factory=dict)
    """Extra #SBATCH directives, sbatch long option (without dashes) to value; keys must be options sbatch or
    submitit knows, values one line of text (a Slurm time or size where the option takes one)."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run before the job starts, written into the script exactly as given: the one place for raw
    shell (module load, source a venv). Each item must be one line; nothing in it is quoted or checked."""


@dataclass(kw_only=True, slots=True)
class SweepConfig:
    """Variants of the job, each planned and run on its own (a Slurm array)."""

    # builtins.list: inside this class the name `list` is the field below, and the annotations are
    # evaluated in the class namespace (from __future__ import annotations).
    grid: dict[str, builtins.list[object]] = field(default_factory=dict)
    """Dotted job key to values; the product of all grids."""
    list: builtins.list[dict[str, object]] = field(default_factory=builtins.list)
    """Partial jobs (dotted keys to values), one variant each."""


@dataclass(kw_only=True, slots=True)
class Job:
    """A job file: what to train, on what data, under which per-GPU budget."""

    name: str
    """Job name; the run dir starts with it."""
    model: str | InlineArch
    """A local dir with config.json, a bundled config name, a hub id, or an inline architecture."""
    task: Task
    """Which recipe runs: causal_lm, seq_cls or sentence_embedding."""
    data: DataConfig
    """The data section (no unit): file, fields, max_seq_len in tokens."""
    train: TrainConfig
    """The train section (no unit): batch in sequences, lr, steps."""
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    """The strategy section (no unit): pinned engine/sharding/offload/micro-batch; the rest is planned."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """The cluster section (no unit): host RAM and NVMe in bytes, GPUs per node, hardware profile."""
    launcher: Literal["local", "slurm"] = "local"
    """local runs through torchrun here; slurm submits through submitit."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """The slurm section (no unit): partition, time limit in minutes, requeues."""
    sweep: SweepConfig | None = None
    """The sweep section (no unit): grid or list of variants; None runs the job once."""
    gpus: int | None = None
    """GPUs (ranks) per node; --gpus overrides."""
    nodes: int = 1
    """Nodes; --nodes overrides."""
    budget_bytes: int | None = _yaml("budget", default=None)
    """Per-GPU memory budget, bytes ('16GB' in the file); --budget overrides."""
    auto_fallback: int = 0
    """On OOM, relaunch down the remedy ladder up to this many times."""
    checkpoint_on_interrupt: bool = False
    """On Ctrl-C or SIGTERM, ask the ranks to checkpoint at the next step and wait for them (up to
    --checkpoint-timeout seconds) before stopping; --checkpoint-on-interrupt sets it too."""
    base_dir: str = field(default=".", metadata={"internal": True})
    """Directory of the job file; relative data paths start here."""
