"""Chapter 2: cross-stream memory (record_stream versus an event handoff).

The chapter's public API; the code lives in the modules beside this one."""
from ..core.units import (  # noqa: F401
    MiB,
)
from .measurements import (  # noqa: F401
    memory_cap, pipeline, POST_URL, runahead, RUNAHEAD_POINTS, SLACK_BYTES, strategies, timeline,
    validate_cap,
)
from .workloads import (  # noqa: F401
    block_ids, buffer_numel, max_live_buffers, overlap_ms, reference_handoff, run_pipeline,
    STRATEGIES, warm_up,
)
from .plots import (  # noqa: F401
    memory_cap_table, plot_counters, plot_memory_cap, plot_pipeline, plot_runahead, plot_strategies,
    plot_timeline, runahead_table, strategies_table,
)
from .checks import (  # noqa: F401
    check_allocated_peak, check_allocation_stream, check_block_predictions, check_cap_stall,
    check_event_handoff, check_fsdp_limit, check_peak_prediction,
)
from .fsdp import (  # noqa: F401
    FSDP_POINTS, fsdp_mode, fsdp_run, fsdp_runahead, fsdp_step, ProcessGroupUnavailable,
)
from .fsdp_plots import (  # noqa: F401
    fsdp_replay_table, fsdp_runahead_table, fsdp_streams_table, plot_fsdp_replay, plot_fsdp_runahead,
    plot_fsdp_step,
)

__all__ = [
    'block_ids', 'buffer_numel', 'check_allocated_peak', 'check_allocation_stream',
    'check_block_predictions', 'check_cap_stall', 'check_event_handoff', 'check_fsdp_limit', 'check_peak_prediction',
    'FSDP_POINTS', 'fsdp_mode', 'fsdp_replay_table', 'fsdp_run', 'fsdp_runahead', 'fsdp_runahead_table', 'fsdp_step',
    'fsdp_streams_table', 'plot_fsdp_replay', 'plot_fsdp_runahead', 'plot_fsdp_step', 'ProcessGroupUnavailable',
    'max_live_buffers', 'memory_cap', 'memory_cap_table', 'MiB', 'overlap_ms', 'pipeline',
    'plot_counters', 'plot_memory_cap', 'plot_pipeline', 'plot_runahead', 'plot_strategies',
    'plot_timeline', 'POST_URL', 'reference_handoff', 'run_pipeline', 'runahead', 'RUNAHEAD_POINTS',
    'runahead_table', 'SLACK_BYTES', 'strategies', 'STRATEGIES', 'strategies_table', 'timeline',
    'validate_cap', 'warm_up'
]
