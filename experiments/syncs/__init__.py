"""Chapter 4: hidden host-device syncs.

The chapter's public API; the code lives in the modules beside this one."""
from .measurements import (  # noqa: F401
    BLIND_SPOT_CASES, BLIND_SPOT_WORK_MS, blind_spots, case_study, catalogue, CATALOGUE_QUIET,
    CATALOGUE_SYNCING, COPY_SIZES_KIB, COPY_VARIANTS, describe_case_study, find_hidden_syncs,
    pageable_threshold, POST, queue_probe, QUEUED_MS, run_ahead, RUN_AHEAD_SYNC_STEP,
    RUN_AHEAD_VARIANTS,
)
from .model import (  # noqa: F401
    BLOCKED_FRACTION, copy_threshold, predicted_run_ahead_ms, RUN_AHEAD_STEPS,
)
from .plots import (  # noqa: F401
    blind_spot_table, case_study_table, catalogue_table, plot_blind_spots, plot_case_study,
    plot_case_study_timeline, plot_catalogue, plot_pageable_threshold, plot_queue_probe,
    plot_run_ahead, run_ahead_table,
)
from .checks import (  # noqa: F401
    check_bubble_cost, check_classification, check_run_ahead_prediction, check_sync_free_rewrite,
    check_threshold, classification_template, QUIZ_OPS,
)
from .case import (  # noqa: F401
    PHASES as CASE_PHASES, predicted_step_ms, reduce_grad_stats, reduce_grad_stats_fixed,
    run_case_study, STAT_COLUMNS, SUM_COLS,
)
from .detector import (  # noqa: F401
    BLIND_SPOTS, count_debug_mode_syncs, KINDS, no_gpu_message, no_syncs, SyncDetector, SyncError,
    SyncEvent,
)
from .ops import (  # noqa: F401
    CAPTURE_NUMEL, capture_probe, get_op, host_blocked_series, measure_op, NUMEL_CHOICES, OP_IDS,
    OPS,
)

__all__ = [
    'BLIND_SPOT_CASES', 'blind_spot_table', 'BLIND_SPOT_WORK_MS', 'BLIND_SPOTS', 'blind_spots',
    'BLOCKED_FRACTION', 'CAPTURE_NUMEL', 'capture_probe', 'CASE_PHASES', 'case_study',
    'case_study_table', 'catalogue', 'CATALOGUE_QUIET', 'CATALOGUE_SYNCING', 'catalogue_table',
    'check_bubble_cost', 'check_classification', 'check_run_ahead_prediction',
    'check_sync_free_rewrite', 'check_threshold', 'classification_template', 'COPY_SIZES_KIB',
    'copy_threshold', 'COPY_VARIANTS', 'count_debug_mode_syncs', 'describe_case_study',
    'find_hidden_syncs', 'get_op', 'host_blocked_series', 'KINDS', 'measure_op', 'no_gpu_message',
    'no_syncs', 'NUMEL_CHOICES', 'OP_IDS', 'OPS', 'pageable_threshold', 'plot_blind_spots',
    'plot_case_study', 'plot_case_study_timeline', 'plot_catalogue', 'plot_pageable_threshold',
    'plot_queue_probe', 'plot_run_ahead', 'POST', 'predicted_run_ahead_ms', 'predicted_step_ms',
    'queue_probe', 'QUEUED_MS', 'QUIZ_OPS', 'reduce_grad_stats', 'reduce_grad_stats_fixed',
    'run_ahead', 'RUN_AHEAD_STEPS', 'RUN_AHEAD_SYNC_STEP', 'run_ahead_table', 'RUN_AHEAD_VARIANTS',
    'run_case_study', 'STAT_COLUMNS', 'SUM_COLS', 'SyncDetector', 'SyncError', 'SyncEvent'
]
