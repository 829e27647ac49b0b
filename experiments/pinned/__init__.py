"""Chapter 3: pinned (page-locked) host memory.

The chapter's public API; the code lives in the modules beside this one."""
from ..core.units import (  # noqa: F401
    KiB, MiB,
)
from .measurements import (  # noqa: F401
    async_copy, ASYNC_VARIANTS, bandwidth, BANDWIDTH_SIZES, del_is_safe, host_blocked_ms,
    overwrite_race, RACE_LABELS, RACE_STRATEGIES,
)
from .model import (  # noqa: F401
    empty_host_cache, features_text, next_pow2, POST_URL,
)
from .plots import (  # noqa: F401
    bandwidth_summary, del_summary, guard_costs_text, pin_cost_summary, plot_async_copy,
    plot_bandwidth, plot_del_is_safe, plot_double_buffer, plot_graph_replay, plot_lifecycle,
    plot_overwrite_race, plot_pin_cost, plot_pow2_rounding, plot_ring_sweep, race_timing_text,
    ring_summary,
)
from .checks import (  # noqa: F401
    check_graph_replay, check_loader, check_overwrite_guard, check_owned_prediction, check_rounding,
    judge_loader, OVERWRITE_OPTIONS,
)
from .host_cache import (  # noqa: F401
    lifecycle, pin_cost, PIN_SIZES_MIB, POW2_REQUESTS, pow2_rounding,
)
from .staging import (  # noqa: F401
    compute_schedule, double_buffer, graph_replay, STAGING_VALUES,
)

__all__ = [
    'async_copy', 'ASYNC_VARIANTS', 'bandwidth', 'BANDWIDTH_SIZES', 'bandwidth_summary',
    'check_graph_replay', 'check_loader', 'check_overwrite_guard', 'check_owned_prediction',
    'check_rounding', 'compute_schedule', 'del_is_safe', 'del_summary', 'double_buffer',
    'empty_host_cache', 'features_text', 'graph_replay', 'guard_costs_text', 'host_blocked_ms',
    'judge_loader', 'KiB', 'lifecycle', 'MiB', 'next_pow2', 'OVERWRITE_OPTIONS', 'overwrite_race',
    'pin_cost', 'pin_cost_summary', 'PIN_SIZES_MIB', 'plot_async_copy', 'plot_bandwidth',
    'plot_del_is_safe', 'plot_double_buffer', 'plot_graph_replay', 'plot_lifecycle',
    'plot_overwrite_race', 'plot_pin_cost', 'plot_pow2_rounding', 'plot_ring_sweep', 'POST_URL',
    'POW2_REQUESTS', 'pow2_rounding', 'RACE_LABELS', 'RACE_STRATEGIES', 'race_timing_text',
    'ring_summary', 'STAGING_VALUES'
]
