"""The suite's two tiers and the guard that keeps them honest.

`slow`: a test that starts a process (the `launch` CLI, torchrun ranks, a script, git) or uses the Slurm cluster.
The fast tier is everything else, `pytest -m "not slow"`, for the edit loop. A test is slow when it carries the
marker itself (`@pytest.mark.slow`, or a module's `pytestmark`), when its module is listed in SLOW_MODULES, or when
it carries `slurm` or `gpu`.

The guard makes the marker impossible to forget: while a test that is not slow runs (its set-up, call and
tear-down), every way Python starts a process (subprocess, os.fork/system/posix_spawn, multiprocessing) fails the
test with one line that names the command and says how to mark it. It is installed for every run, the full suite
included, so CI catches a process-starting test the fast tier would otherwise run.
"""

from __future__ import annotations

import _posixsubprocess
import multiprocessing.process
import os
import subprocess
import threading
from collections.abc import Callable

import pytest

ALL = "*"
"""A module's every test."""

STARTS_PROCESSES: dict[str, str | tuple[str, ...]] = {
    "tests/backends/test_slurm_submit.py": ("test_a_compute_node_never_loads_the_cli",),
    "tests/backends/test_slurm_task.py": ("test_ranks_start_with_usr2_blocked_while_this_process_still_handles_it",
                                          "test_wait_for_ranks_waits_while_a_local_rank_lives_then_for_the_final_files"),
    "tests/benchmarks/test_gpu_check.py": ("test_without_cuda_it_says_so_and_exits_0",),
    "tests/benchmarks/test_validation_cells.py": ALL,
    "tests/calibrate/test_calibrate_cli.py": ("test_quick_hardware_calibration_writes_sane_numbers",),
    "tests/calibrate/test_calibrate_hardware.py": ALL,
    "tests/cli/test_chat_run.py": ALL,
    "tests/cli/test_conventions.py": ("test_version_prints_the_package_version",),
    "tests/cli/test_entry.py": ("test_a_closed_pipe_is_no_traceback", "test_bad_flag_exits_2_with_usage",
                                "test_help_exits_0_and_prints_everything",
                                "test_plan_json_is_flushed_whole_and_bad_input_keeps_exit_2"),
    "tests/cli/test_plan_cli.py": ("test_console_script_and_module_entry_agree", "test_help_explains_gb_and_gib"),
    "tests/cli/test_plan_out.py": ("test_plan_out_into_the_dir_of_a_live_launch_is_refused_at_once",
                                   "test_two_plan_outs_at_once_leave_one_complete_set"),
    "tests/cli/test_plain_cli.py": ALL,
    "tests/cli/test_run_cli.py": ALL,
    "tests/config/test_load.py": ("test_loading_a_job_probes_nothing",),
    "tests/emit/test_accelerate_launch.py": ALL,
    "tests/emit/test_ds_templates.py": ("test_templates_ship_in_the_wheel",),
    "tests/emit/test_emit_deepspeed.py": ("test_deepspeed_initialize_trains_on_nvme",),
    "tests/emit/test_exports.py": ("test_hf_trainer_fills_every_auto_and_deepspeed_accepts_it",
                                   "test_a_scripts_config_keeps_the_plans_memory_and_leaves_the_math_to_the_script"),
    "tests/emit/test_sbatch.py": ("test_deepspeed_plan_carries_its_ds_config",
                                  "test_golden_offload_plan_derives_time_mem_and_cpus",
                                  "test_golden_two_nodes_fsdp", "test_golden_weird_path_and_name",
                                  "test_script_runs_with_a_weird_run_dir",
                                  "test_script_writes_only_into_a_run_dir_launch_made_or_a_new_one"),
    "tests/faults/test_bad_input.py": ("test_bad_input_through_the_launch_binary",),
    "tests/faults/test_damaged_checkpoints.py": ALL,
    "tests/faults/test_fault_runs.py": ALL,
    "tests/faults/test_fuzz.py": ("test_damaged_checkpoints_export_or_are_refused_in_one_line",),
    "tests/faults/test_hostile_bounds.py": ("test_a_refusal_costs_under_10_s_and_1_gb",),
    "tests/faults/test_hostile_slurm.py": ("test_an_allowed_out_path_with_spaces_and_quotes_round_trips",
                                           "test_names_are_slugged_in_every_path"),
    "tests/faults/test_live_rundir.py": ALL,
    "tests/faults/test_run_endings.py": ALL,
    "tests/faults/test_safety.py": ("test_a_reused_pid_does_not_hold_the_dir",
                                    "test_overwrite_refuses_a_run_dir_whose_launch_still_lives",
                                    "test_ranks_that_outlive_their_launch_hold_the_dir"),
    "tests/faults/test_secret_paths.py": ALL,
    "tests/model/test_build.py": ALL,
    "tests/model/test_bundled_stats.py": ("test_a_cold_plan_of_a_bundled_family_imports_no_torch",),
    "tests/model/test_families.py": ("test_a_mixture_of_experts_runs_on_two_ranks_through_the_launcher",),
    "tests/planner/test_hardware.py": ("test_auto_detects_the_card_through_its_tool",
                                       "test_auto_on_a_card_without_a_profile_is_bad_input"),
    "tests/runtime/test_plan_digest.py": ("test_ranks_build_ops_with_the_ninja_the_cache_was_built_with",),
    "tests/runtime/test_script.py": ("test_a_plain_script_is_measured_and_judged_without_a_launcher_import",
                                     "test_an_unchanged_hf_trainer_script_runs_zero2_with_its_own_learning_rate",
                                     "test_an_unchanged_accelerate_script_runs_the_fsdp2_plan_sharded_on_cpu_ranks",
                                     "test_an_unchanged_trl_script_runs_zero3_with_optimizer_offload"),
    "tests/processes/test_ops.py": ("test_an_op_that_does_not_build_is_a_failed_run_before_any_rank",),
    "tests/processes/test_procs.py": ("test_a_process_is_its_pid_and_start_time", "test_a_zombie_is_not_alive",
                                     "test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields",
                                     "test_a_rank_dies_with_the_process_that_started_it_even_by_sigkill",
                                     "test_a_rank_started_after_its_launcher_died_leaves_at_once",
                                     "test_a_finished_rank_leaves_no_process_behind"),
    "tests/records/test_runstate.py": ("test_a_run_marked_running_whose_launch_is_gone_was_abandoned",),
    "tests/test_layers.py": ("test_the_cli_and_the_shared_names_import_no_heavy_library",),
    "tests/records/test_live.py": ("test_a_terminal_gets_the_live_table_and_a_pipe_gets_step_lines",),
    "tests/files/test_permissions.py": ("test_a_rank_log_never_holds_a_secret_even_mid_run",),
    "tests/worker/test_data.py": ("test_jsonl_and_csv_are_checked_without_importing_datasets",),
    "tests/worker/test_deepspeed_bf16_resume.py": ALL,
    "tests/worker/test_deepspeed_shm.py": ALL,
    "tests/worker/test_hybrid_run.py": ALL,
    "tests/worker/test_loading.py": ALL,
    "tests/worker/test_main.py": ("test_importing_the_worker_sets_no_environment_and_main_sets_it_first",),
    "tests/worker/test_multirank.py": ALL,
    "tests/worker/test_step_contract.py": ("test_fsdp2_optimizer_in_backward_trains_the_normal_step_curve",
                                           "test_fsdp_clip_norm_is_global_across_ranks",
                                           "test_zero2_and_fsdp2_train_the_same_loss_curve_with_clipping"),
}
"""Tests that start a process: module (path from the repository root) -> its test functions, or ALL. The guard
fails any other test that starts one, so an entry missing here is found at its first run."""

TAKES_SECONDS: dict[str, str | tuple[str, ...]] = {
    "tests/calibrate/test_calibrate_cli.py": ("test_refit_from_run_dirs_recovers_constants",
                                              "test_run_coefficients_are_token_counts_worked_by_hand",
                                              "test_a_script_run_is_refit_as_the_script_it_ran"),
    "tests/calibrate/test_calibrate_profiles.py": ("test_activation_constants_round_trip",),
    "tests/calibrate/test_calibrate_timing.py": ("test_refit_writes_the_profile_and_the_planner_charges_it",),
    "tests/cli/test_flash_attention.py": ("test_flash_attention_plans_for_a_cuda_profile_without_the_package",
                                          "test_run_needs_the_package_where_the_ranks_start"),
    "tests/cli/test_plan_out.py": ("test_swaps_under_the_lock_are_never_seen_half_done",),
    "tests/faults/test_fallback_ladder.py": ("test_micro_batch_first_largest_that_fits_and_the_global_batch_stays",
                                             "test_offload_host_ram_cannot_hold_is_skipped_for_nvme",
                                             "test_nvme_is_not_a_rung_for_device_memory"),
    "tests/faults/test_fuzz.py": ("test_random_documents_load_or_fail_with_config_error",
                                  "test_random_yaml_text_loads_or_fails_with_config_error"),
    "tests/faults/test_hostile_verdicts.py": ("test_refused",),
    "tests/model/test_activations.py": ALL,
    "tests/config/test_load.py": ("test_plan_and_sbatch_see_the_resolved_paths",),
    "tests/model/test_activations_paper.py": ALL,  # its module fixture probes for 5 s of CPU
    "tests/model/test_bundled_stats.py": ("test_every_bundled_config_ships_its_current_introspection",
                                          "test_a_shipped_probe_equals_a_fresh_probe",
                                          "test_a_length_between_shipped_ones_is_interpolated_and_equals_a_fresh_probe"),
    "tests/model/test_chunked_loss.py": ("test_chunked_loss_and_grads_equal_transformers",),
    "tests/model/test_families.py": ("test_family_plans_and_trains_through_the_recipe",),
    "tests/model/test_offline.py": ("test_a_patch_elsewhere_is_caught",),
    "tests/planner/test_advice.py": ("test_every_suggestion_plans_as_it_says", "test_no_budget_past_the_card",
                                     "test_a_budget_that_fails_on_host_ram_is_not_offered"),
    "tests/planner/test_backward_end.py": ("test_dev_cells_end_of_backward_matches_what_the_ranks_measured",),
    "tests/planner/test_buckets.py": ("test_plans_use_the_checked_sizes",),
    "tests/planner/test_hardware.py": ("test_a_130gb_budget_fits_an_h200_not_an_h100",),
    "tests/planner/test_lora_suggestion.py": ("test_no_fit_message_suggests_the_family_targets",),
    "tests/planner/test_rejected.py": ("test_plan_json_round_trips_the_typed_rejected_and_never_parses_an_old_reason",),
    "tests/planner/test_search.py": ("test_nothing_fits_says_what_would_with_numbers",
                                     "test_plans_fit_and_more_budget_never_hurts"),
    "tests/planner/test_search_speed.py": ("test_fast_search_chooses_what_scoring_every_candidate_chooses",
                                           "test_tight_budgets_in_steps_choose_the_same",
                                           "test_a_large_per_rank_batch_is_searched_early_and_chooses_the_same"),
    "tests/records/test_categories.py": ("test_grew_most_compares_like_with_like_on_measured_fsdp2_runs",),
    "tests/test_layers.py": ("test_an_upward_import_is_caught",),
    "tests/inputs/test_precision.py": ("test_plan_decides_auto_on_cpu_ranks_and_says_why",),
    "tests/worker/test_checkpoint.py": ("test_fsdp_checkpoint_round_trip",
                                        "test_a_requeue_before_the_first_checkpoint_sets_every_earlier_step_aside",
                                        "test_worker_resume_repeats_no_step_and_matches_a_straight_run",
                                        "test_resume_moves_steps_past_the_checkpoint_aside_and_stamps_the_attempt"),
    "tests/worker/test_loop.py": ("test_loss_is_read_on_log_steps_only",),
    "tests/worker/test_plain_rank.py": ALL,
    "tests/worker/test_low_memory_optimizers.py": ("test_fsdp_checkpoint_round_trip_keeps_the_low_memory_state",
                                                   "test_fsdp_pure_bf16_rounds_its_dtensor_shards_and_resumes_exactly",
                                                   "test_pure_bf16_low_bit_adamw_rounds_stochastically_over_quantized_moments"),
    "tests/worker/test_recipes.py": ("test_sentence_embedding_minilm_loss_falls",),
}
"""In-process tests that take over about a second of CPU alone (fake-tensor probes, property tests, FSDP2 and
DeepSpeed set up in the test's process): slow so that the fast tier stays under 3 minutes on 2 cores."""

PROCESS_FIXTURES = ("parsed", "initialized", "hf_filled_parsed", "cpu_run", "clipped", "curve_runs", "loaded_ranks",
                    "terminal_run", "single_rank_runs", "trained_runs")
"""Fixtures that start a process (DeepSpeed's own parser or engine in a child, a CPU run through the CLI): a test
that uses one is slow, since it may be the one that sets the fixture up."""

ALWAYS_SLOW = ("slurm", "gpu")
"""Markers that make a test slow: the Slurm cluster, a GPU run."""

HOW_TO_MARK = ("mark it @pytest.mark.slow (or its module with pytestmark = pytest.mark.slow, or list it in "
               "tests/tiers.py STARTS_PROCESSES), so that the fast tier (pytest -m 'not slow') starts no process")


def listed(item: pytest.Item, table: dict[str, str | tuple[str, ...]]) -> bool:
    """Whether ``table`` names ``item``'s test function (all its parameters) or its whole module."""
    names = table.get(item.nodeid.split("::", 1)[0], ())
    return names == ALL or getattr(item, "originalname", item.name) in names


def is_slow(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to the slow tier: its own marker, a slurm or gpu marker, or a table above."""
    if any(item.get_closest_marker(name) for name in ("slow", *ALWAYS_SLOW)):
        return True
    if set(getattr(item, "fixturenames", ())) & set(PROCESS_FIXTURES):
        return True
    return listed(item, STARTS_PROCESSES) or listed(item, TAKES_SECONDS)


FAST_TIMEOUT_S = 120
"""pytest-timeout's limit for a fast test without its own `timeout` marker: the slowest takes about 4 s under a load
of 8 on 2 cores, so only a hang reaches it. Slow tests get pyproject's `timeout` (900 s; the Slurm requeue test
takes about 2 minutes and waits while its job progresses)."""


def mark_slow(items: list[pytest.Item], *, timeouts: bool = True) -> None:
    """Give every slow item the `slow` marker, so that `-m "not slow"` deselects it, and with ``timeouts`` (the
    pytest-timeout plugin is loaded: a GPU machine's image may lack it) every fast one the fast tier's timeout."""
    for item in items:
        if is_slow(item):
            if not item.get_closest_marker("slow"):
                item.add_marker(pytest.mark.slow)
        elif timeouts and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(FAST_TIMEOUT_S))


class ProcessGuard:
    """Fails a test that is not slow when it starts a process. install() once per session; guarding(item) around
    each phase of each test."""

    def __init__(self) -> None:
        self.installed = False
        self.item: pytest.Item | None = None
        self.started: dict[str, str] = {}
        """nodeid -> the first process it started (kept if the test swallows the failure, e.g. in a thread)."""
        self._lock = threading.Lock()

    def install(self) -> None:
        """Wrap every process-starting entry point Python has (the lowest ones too: multiprocessing's spawn calls
        _posixsubprocess directly, its fork context os.fork). Once: conftest.py can be imported under two names."""
        if self.installed:
            return
        self.installed = True
        def wrap(owner: object, name: str, describe: Callable[..., str]) -> None:
            real = getattr(owner, name, None)
            if real is None:
                return

            def guarded(*args, **kwargs):
                self.check(describe(*args, **kwargs))
                return real(*args, **kwargs)

            setattr(owner, name, guarded)

        wrap(subprocess.Popen, "_execute_child", lambda _self, args, *a, **k: f"subprocess {_argv(args)}")
        wrap(multiprocessing.process.BaseProcess, "start", lambda p: f"multiprocessing {p.name}")
        wrap(_posixsubprocess, "fork_exec", lambda args, *a, **k: f"fork_exec {_argv(args)}")
        for name in ("fork", "forkpty"):
            wrap(os, name, lambda name=name: f"os.{name}()")
        for name in ("posix_spawn", "posix_spawnp"):
            wrap(os, name, lambda path, argv, *a, name=name, **k: f"os.{name} {_argv(argv)}")
        wrap(os, "system", lambda command: f"os.system {command[:200]!r}")

    def check(self, what: str) -> None:
        """Called before a process starts: fine outside a fast test, else recorded and the test failed."""
        item = self.item
        if item is None:
            return
        with self._lock:
            self.started.setdefault(item.nodeid, what)
        pytest.fail(f"{item.nodeid} started a process ({what}) but is not marked slow: {HOW_TO_MARK}", pytrace=False)

    def guarding(self, item: pytest.Item):
        """A hook wrapper's body: guard the phase of ``item`` it wraps, then fail it if it started a process that
        it caught (in a thread, or under a broad except)."""
        self.item = None if is_slow(item) else item
        try:
            result = yield
        finally:
            self.item = None
            what = self.started.pop(item.nodeid, None)
        if what is not None:
            pytest.fail(f"{item.nodeid} started a process ({what}) but is not marked slow: {HOW_TO_MARK}",
                        pytrace=False)
        return result


def _argv(args: object) -> str:
    if isinstance(args, (str, bytes, os.PathLike)):
        return repr(os.fsdecode(args))[:200]
    try:
        return repr(" ".join(os.fsdecode(a) for a in args))[:200]
    except TypeError:
        return repr(args)[:200]


GUARD = ProcessGuard()
"""The session's guard (one per process, whichever name conftest.py was imported under)."""
