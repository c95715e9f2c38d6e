"""The training loop: micro-batches, accumulation, evaluation, checkpoints, and stopping on request."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from launcher.config.job import Job
from launcher.errors import ConfigError
from launcher.files.fsutil import atomic_write, open_private
from launcher.planner.plan import Plan
from launcher.processes.rankenv import ATTEMPT_ENV
from launcher.records.steprow import StepRow, read_rows
from launcher.runtime.control import CheckpointRequests
from launcher.runtime.probe import MemoryProbe
from launcher.units import format_bytes
from launcher.worker import checkpoint
from launcher.worker.data import Stream, eval_batches, eval_counted, read_records, split, total_steps
from launcher.worker.export import export_at_end
from launcher.worker.loading import is_loader
from launcher.worker.model import build, count_params, to_device, tokenizer_for
from launcher.worker.offload import offload_activations
from launcher.worker.recipes import make_recipe
from launcher.worker.tokcache import tokenized


def seed_all(seed: int) -> None:
    """Seed Python's, numpy's and torch's RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ATTEMPT_ENV (launcher.processes.rankenv) is set by the Slurm task to SLURM_RESTART_COUNT; absent on local runs,
# which count their resumes instead.


def check_world(environ: Mapping[str, str], plan: Plan, group_size: int) -> None:
    """The world torchrun formed must be the plan's nodes x GPUs per node, or the data split and the memory
    verdict are for a run that is not this one. ``group_size`` is what the process group reports."""
    want = plan.nodes * plan.gpus_per_node
    p = []
    if plan.world_size != want:
        p.append(f"plan.json: world_size {plan.world_size} but nodes x gpus_per_node = {plan.nodes} x "
                 f"{plan.gpus_per_node} = {want}; re-plan the run dir (launch --overwrite)")
    for key, expected, fix in (
        ("WORLD_SIZE", want, f"start {plan.nodes} node(s) with --nproc-per-node {plan.gpus_per_node} "
                             f"(launch --nodes {plan.nodes} --gpus {plan.gpus_per_node}), or re-plan for the world "
                             "you have"),
        ("LOCAL_WORLD_SIZE", plan.gpus_per_node, f"start {plan.gpus_per_node} rank(s) on every node "
                                                  f"(--gpus {plan.gpus_per_node}), or re-plan"),
    ):
        raw = environ.get(key)
        if raw is None:
            continue
        try:
            seen = int(raw)
        except ValueError:
            p.append(f"{key}={raw!r} is not an integer; torchrun sets it, so start the ranks with torchrun "
                     "(launch does)")
            continue
        if seen != expected:
            p.append(f"{key}: torchrun started {seen} rank(s) but the plan is {plan.nodes} node(s) x "
                     f"{plan.gpus_per_node} GPU(s), so {key} must be {expected}; {fix}")
    if group_size != want and not any(x.startswith("WORLD_SIZE") for x in p):
        p.append(f"process group: {group_size} rank(s) joined but the plan is {plan.nodes} x {plan.gpus_per_node} = "
                 f"{want}; start {want} ranks, or re-plan for {group_size}")
    if p:
        raise ConfigError(p)


def discarded_path(path: Path) -> Path:
    """steps/rank-K.discarded.jsonl beside steps/rank-K.jsonl: the lines a resume set aside."""
    return path.with_name(path.name.removesuffix(".jsonl") + ".discarded.jsonl")


def move_steps_after(path: Path, step: int, *, attempt: int, resumed_from: str | None) -> int:
    """Keep lines with step <= ``step`` in ``path``; append the others to rank-K.discarded.jsonl. Returns how many.

    A resumed run redoes the steps after its checkpoint, and each step must appear once in the step log; the
    dropped lines are the only record that those steps ran once already (after a crash past the last
    checkpoint), so they are kept aside with why, instead of being deleted.
    """
    if not path.is_file():
        return 0
    keep, dropped = [], []
    for line in path.read_text().splitlines():
        try:
            row = StepRow.from_line(line)
        except ValueError:
            if line.strip():
                dropped.append({"unparsable_line": line})  # cut short by a kill: evidence all the same
            continue
        if row.step <= step:
            keep.append(line)
        else:
            dropped.append(row.to_json())
    if not dropped:
        return 0
    discarded = discarded_path(path)
    stamp = {"discarded_at": time.time(), "discarded_by_attempt": attempt, "resumed_from_step": step,
             "resumed_from": resumed_from}
    with open_private(discarded, "a") as f:
        for row in dropped:
            f.write(json.dumps({**row, **stamp}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    atomic_write(path, "".join(line + "\n" for line in keep), durable=False)
    return len(dropped)


def attempts_in(path: Path) -> list[int]:
    """The attempt stamps in a step log (lines from before attempts were stamped count as attempt 0)."""
    if not path.is_file():
        return []
    return [int(row.attempt or 0) for row in read_rows(path.read_text().splitlines())]


def step_log_line(row: StepRow, total_steps: int, budget_bytes: int) -> str:
    """One log step in the rank log: step/total, loss, lr, tokens/s (all ranks), this rank's peak against the
    budget, and the time left at this step's pace."""
    left_s = row.step_time_s * max(total_steps - row.step, 0)
    parts = [f"step {row.step}/{total_steps}", f"loss {row.loss:.4f}"]
    if row.lr is not None:
        parts.append(f"lr {row.lr:.3g}")
    if row.tokens_per_s is not None:
        parts.append(f"{row.tokens_per_s:.0f} tok/s")
    parts.append(f"peak {format_bytes(row.mem_peak_bytes)} of {format_bytes(budget_bytes)}")
    parts.append(f"eta {left_s:.0f} s")
    return "launcher: " + ", ".join(parts)


class Trainer:
    """One rank's training run: data, model through the engine, the step loop with logging, evaluation, checkpoints
    and resume, all measured by the memory probe."""

    def __init__(self, *, job: Job, plan: Plan, engine, run_dir: Path, device: torch.device, probe: MemoryProbe):
        self.job, self.plan, self.engine, self.device, self.probe = job, plan, engine, device, probe
        self.run_dir = run_dir
        self.ckpt_root = run_dir / "checkpoint"
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        check_world(os.environ, plan, self.world_size)
        self.attempt = 0
        """Stamped on every step line: SLURM_RESTART_COUNT on Slurm, the resume count on a local run."""
        self.step_stamp: dict[str, object] = {}
        self.requests = CheckpointRequests(run_dir)
        self.first_loss: float | None = None
        self.eval_loss: float | None = None
        self.eval_accuracy: float | None = None
        """seq_cls: the share of eval examples classified right, each example counted once."""

    # -- setup ------------------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Read, split and tokenize before the model exists, so host-side data never counts as device memory."""
        job, plan = self.job, self.plan
        self.recipe = make_recipe(job.task, job.data)
        if job.task == "causal_lm":
            self.recipe.loss_chunks = plan.strategy.loss_chunks
        rows = read_records(job.data.path)
        self.recipe.fit_labels(rows)
        train_rows, eval_rows = split(rows, job.data.eval_fraction)
        self.seq_len = plan.seq_len
        self.tokenizer = tokenizer_for(job)
        # Rank 0 tokenizes once per dataset into the launcher's cache; the other ranks wait for it, then load.
        self.train_data, self.eval_data = tokenized(self.recipe, self.tokenizer, rows, train_rows, eval_rows,
                                                    self.seq_len)
        self.stream = Stream(
            num_examples=len(self.train_data["input_ids"]),  # sequences: fewer than rows when packed
            micro_batch_size=plan.strategy.micro_batch_size,
            grad_accum_steps=plan.strategy.grad_accum_steps,
            world_size=self.world_size,
            rank=self.rank,
            seed=job.train.seed,
        )
        self.total_steps = total_steps(
            max_steps=job.train.max_steps, epochs=job.train.epochs, steps_per_epoch=self.stream.steps_per_epoch
        )
        self.n_train = len(self.train_data["input_ids"])
        self.n_eval = len(self.eval_data["input_ids"]) if self.eval_data else 0

    def build(self) -> None:
        """Build the model (seeded, so rank 0's init is every rank's), hand it to the engine's setup, and record its
        sizes in the probe."""
        job, plan = self.job, self.plan
        seed_all(job.train.seed)  # rank 0's random init is the one every rank gets
        # The engine decides whether rank 0 alone builds the model (one host copy per job; the others build on
        # meta and its setup fills them) and whether transformers checkpoints the blocks.
        self.engine.before_build()
        model = build(job, self.recipe, seq_len=self.seq_len, hf_checkpointing=self.engine.hf_checkpointing,
                      checkpoint_every=self.engine.checkpoint_every,
                      checkpoint_policy=self.engine.checkpoint_policy,
                      on_meta=self.engine.rank0_load and not is_loader())
        total, trainable = count_params(model)
        self.engine.setup(model, job.train, self.probe)
        self.probe.note(
            engine=self.engine.name,
            label=plan.strategy.label(),
            task=job.task,
            total_params=total,
            trainable_params=trainable,
            micro_batch_size=plan.strategy.micro_batch_size,
            grad_accum_steps=plan.strategy.grad_accum_steps,
            seq_len=self.seq_len,
            precision=plan.precision,
            total_steps=self.total_steps,
            train_examples=self.n_train,
            eval_examples=self.n_eval,
        )
        seed_all(job.train.seed + self.rank)  # distinct dropout masks per rank from here on

    def _host_batch(self, data: dict[str, torch.Tensor], idx: list[int]) -> dict[str, torch.Tensor]:
        index = torch.tensor(idx, dtype=torch.long)
        return {k: v.index_select(0, index) for k, v in data.items()}

    def is_log_step(self, step: int, *, stopping: bool) -> bool:
        """Whether the step's loss is reduced over ranks and read on the host (a sync): every log_every_steps,
        the first step of a run (first_loss), the last, and a step the run stops after (a checkpoint request)."""
        every = self.job.train.log_every_steps
        return self.first_loss is None or step % every == 0 or step == self.total_steps or stopping

    # -- run --------------------------------------------------------------------------------------------------
    def _step_log_path(self) -> Path | None:
        return self.probe.step_log.path if self.probe.step_log is not None else None

    def _find_attempt(self) -> int:
        """This run's attempt number; every rank must stamp the same one, so a local count is agreed (MAX)."""
        raw = os.environ.get(ATTEMPT_ENV)
        if raw is not None:
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{ATTEMPT_ENV}={raw!r} is not an integer; it is set by the Slurm task to "
                                  "SLURM_RESTART_COUNT: unset it in the submitting shell") from None
        path = self._step_log_path()
        seen = []
        if path is not None:
            seen = attempts_in(path) + attempts_in(discarded_path(path))
        mine = max(seen) + 1 if seen else 0
        t = torch.tensor([mine], dtype=torch.int64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t[0])

    def resume(self) -> int:
        """Resume from the latest complete checkpoint, if any, and stamp this attempt; returns the step to
        continue after (0 when starting over)."""
        self.attempt = self._find_attempt()
        self.step_stamp = {"attempt": self.attempt}
        if os.environ.get(ATTEMPT_ENV) is not None and os.environ.get("SLURM_JOB_ID"):
            # A `launch --slurm --resume` is a new job whose restart count starts at 0 again.
            self.step_stamp["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
        tag = checkpoint.latest_tag(self.ckpt_root)
        path = self._step_log_path()
        if path is not None:
            self.probe.step_log.close()  # reopened in append mode by the next step; the file is replaced below
        if tag is None:
            # Requeued or restarted before the first checkpoint: every step runs again from step 1.
            if path is not None:
                move_steps_after(path, 0, attempt=self.attempt, resumed_from=None)
            return 0
        state = checkpoint.load(
            self.engine,
            self.ckpt_root,
            tag,
            world_size=self.world_size,
            samples_per_step_per_rank=self.stream.samples_per_step,
        )
        self.first_loss = state.first_loss
        if path is not None:
            move_steps_after(path, state.global_step, attempt=self.attempt, resumed_from=tag)
        self.probe.step = state.global_step
        self.probe.note(resumed_from_step=state.global_step, resumed_from=tag)
        return state.global_step

    def save(self, step: int) -> str:
        """Save a checkpoint of ``step`` (engine files, trainer state) in the probe's checkpoint phase;
        returns its tag."""
        with self.probe.phase("checkpoint"):
            state = checkpoint.TrainerState(
                global_step=step,
                micro_steps=step * self.plan.strategy.grad_accum_steps,
                samples_per_rank=step * self.stream.samples_per_step,
                world_size=self.world_size,
                samples_per_step_per_rank=self.stream.samples_per_step,
                engine=self.engine.name,
                first_loss=self.first_loss,
            )
            tag = checkpoint.save(self.engine, self.ckpt_root, state)
        self.probe.note(checkpoint=str(self.ckpt_root / tag))
        return tag

    def run(self) -> str:
        """Train to the planned step count; returns the rank status: completed or checkpointed."""
        self.requests.install()
        try:
            return self._run()
        finally:
            self.requests.restore()

    def _run(self) -> str:
        with self.probe.phase("init"):
            self.build()
            start = self.resume()
        if start == 0 and self.eval_data:
            # A baseline for the final eval loss: did training help at all?
            self.probe.note(eval_loss_initial=self.evaluate())
        self.probe.write(status="running")
        train_cfg = self.job.train
        accum = self.plan.strategy.grad_accum_steps
        self.engine.train(True)
        self.probe.restart_step_clock()
        step = start
        for step in range(start + 1, self.total_steps + 1):
            # The loss stays a device tensor until a log step: reading it (.item()) every micro-batch would wait
            # for the device each time. Tokens are counted on the host batch, before it moves.
            loss_sum, tokens = torch.zeros((), dtype=torch.float32, device=self.device), 0
            for micro in range(accum):
                with self.probe.phase("forward"):
                    host = self._host_batch(self.train_data, self.stream.micro_batch(step - 1, micro))
                    tokens += self.recipe.tokens(host)
                    batch = to_device(host, self.device)
                    del host
                    # Activation offload covers forward and the loss: what they save for backward
                    # (launcher.worker.offload).
                    with offload_activations(self.plan.strategy.activation_offload):
                        loss = self.recipe.loss_tensor(self.engine.forward, batch)
                    del batch
                    loss_sum += loss.detach().float()
                with self.probe.phase("backward"):
                    self.engine.backward(loss)
                    del loss
                    if micro < accum - 1:
                        self.engine.step()
            with self.probe.phase("optimizer_step"):
                stepped = self.engine.step()
            if not stepped:
                raise RuntimeError(f"engine did not step the optimizer after {accum} micro-batches at step {step}")
            # A collective every step (a checkpoint request stops the run at the next step), but no loss in it.
            reason = self.requests.agreed(self._comm_device()) if step < self.total_steps else None
            if self.is_log_step(step, stopping=reason is not None):
                mean_loss, global_tokens = self._global_mean(loss_sum / accum, tokens)
                if self.first_loss is None:
                    self.first_loss = mean_loss
                norm = self.engine.grad_norm()
                extra = {} if norm is None else {"grad_norm": float(norm)}
                row = self.probe.step_done(step, mean_loss, global_tokens, lr=self.engine.lr(), **extra,
                                           **self.step_stamp)
                self.probe.note(first_loss=self.first_loss)
                # The rank log (this process's stdout) gets the log step as a plain line too.
                print(step_log_line(row, self.total_steps, self.plan.budget_bytes), flush=True)
            else:
                # Step lines keep coming (progress, memory, step time for the live view), without loss or tok/s.
                self.probe.step_done(step, None, None, lr=self.engine.lr(), **self.step_stamp)
            del loss_sum
            if train_cfg.eval_every_steps and step % train_cfg.eval_every_steps == 0 and step < self.total_steps:
                self.evaluate()
            if step == self.total_steps:
                break
            periodic = bool(train_cfg.checkpoint_every_steps) and step % train_cfg.checkpoint_every_steps == 0
            if periodic:
                self.save(step)
            if reason is not None:
                if not periodic:
                    self.save(step)
                if self.rank == 0:
                    self.requests.consume()
                self.probe.note(stop_reason=reason)
                return "checkpointed"
        self.evaluate()
        if step > start or checkpoint.latest_tag(self.ckpt_root) is None:
            self.save(step)
        export_at_end(self)  # RUN_DIR/model: the Hugging Face model dir (launcher.worker.export)
        return "completed"

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def _global_mean(self, loss: torch.Tensor, tokens: int) -> tuple[float, int]:
        """(loss averaged over ranks, tokens summed over ranks): one all-reduce and one read on the host."""
        comm = self._comm_device()
        t = torch.stack([loss.detach().to(comm, torch.float64),
                         torch.tensor(float(tokens), dtype=torch.float64, device=comm)])
        dist.all_reduce(t)
        mean, total = t.tolist()
        return mean / self.world_size, int(total)

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean loss over the eval split, averaged over ranks (seq_cls: accuracy recorded too); None without
        eval data."""
        if not self.eval_data:
            return None
        n = next(iter(self.eval_data.values())).shape[0]
        mbs = self.plan.strategy.micro_batch_size
        batches = eval_batches(n, micro_batch_size=mbs, world_size=self.world_size, rank=self.rank)
        counted = eval_counted(n, micro_batch_size=mbs, world_size=self.world_size, rank=self.rank)
        self.engine.train(False)
        total = torch.zeros((), dtype=torch.float32, device=self.device)  # read once, after the last batch
        right = torch.zeros((), dtype=torch.float32, device=self.device)
        for idx, flags in zip(batches, counted, strict=True):
            with self.probe.phase("eval"):
                batch = to_device(self._host_batch(self.eval_data, idx), self.device)
                loss, correct = self.recipe.eval_step(self.engine.forward, batch, torch.tensor(flags))
                total += loss.float()
                if correct is not None:
                    right += correct.float()
                del batch, loss, correct
        self.engine.train(True)
        mean, _ = self._global_mean(total / max(len(batches), 1), 0)
        self.eval_loss = mean
        fields: dict[str, object] = {"eval_loss": mean, "eval_step": self.probe.step}
        if self.recipe.task == "seq_cls":
            # _global_mean divides by the world size; times it back, over the n examples each counted once.
            mean_right, _ = self._global_mean(right, 0)
            self.eval_accuracy = mean_right * self.world_size / n
            fields["eval_accuracy"] = self.eval_accuracy
        self.probe.note(**fields)
        return mean
