"""Chapter 1: the caching allocator and fragmentation.

The chapter's public API; the code lives in the modules beside this one."""
from ..core.units import (  # noqa: F401
    format_bytes, KiB, MiB,
)
from .measurements import (  # noqa: F401
    ALLOC_CONF_DOCS, anatomy, fragmentation_oom, graph_pools, knobs, pool_boundary, POST_URL,
    request_table, timeline,
)
from .workloads import (  # noqa: F401
    ANATOMY_SIZES, BIG_REQUEST_B, boundary_sequences, BOUNDARY_SIZES, GRAPH_BATCH_SIZES,
    graph_capture_ops, GRAPH_DTYPE, GRAPH_HIDDEN, GRAPH_ORDERS, KNOB_CAP_MIB, KNOBS,
    OOM_CAP_CHOICES, OOM_CAP_MIB, OOM_FILL_COUNT, OOM_FILL_MIB, oom_ops, OOM_PATTERNS,
    OOM_REQUEST_MIB, ORDERS, PROBE_SIZES, SMALL_COUNT, SMALL_SIZE_B, timeline_ops,
    TIMELINE_SMALL_MIB,
)
from .model import (  # noqa: F401
    AllocatorConfig, compact_layout, normalize_ops, request_anatomy, round_size, simulate,
)
from .plots import (  # noqa: F401
    autograd_pool_totals, lab_comparison, lab_comparison_table, plot_doctor_snapshots, plot_doctor_cases, plot_doctor_heldout, graph_pools_table,
    knobs_table, oom_figures_table, oom_message, oom_table, plot_anatomy,
    plot_fragmentation_oom, plot_graph_pools, plot_knobs, plot_pool_boundary, plot_request_table,
    plot_segments, plot_sequence, plot_timeline, request_table_html,
)
from .checks import (  # noqa: F401
    check_doctor_setting, DOCTOR_SETTINGS, check_frag_index, check_oom_reading, check_pool_boundary_choice, check_reserved_function,
    check_timeline_prediction, OOM_FIXES, POOL_BOUNDARY_OPTIONS, try_sequence,
)
from .fresh import (  # noqa: F401
    explain_setting_error, oom_job, SHARE_WINDOW_S, shared_jobs,
)
from .predict import (  # noqa: F401
    predict_graph_pools, predict_oom,
)
from ..doctor.answers.report import (  # noqa: F401  (the doctor: a package of its own, experiments.doctor)
    doctor, Report,
)
from ..doctor.lab.snapshots import own_snapshot  # noqa: F401
from .snapshot import (  # noqa: F401
    fragmentation_index, layout_summary, load_snapshot, parse_oom_message, parse_segments,
)

__all__ = [
    'ALLOC_CONF_DOCS', 'AllocatorConfig', 'anatomy', 'ANATOMY_SIZES', 'BIG_REQUEST_B',
    'boundary_sequences', 'BOUNDARY_SIZES', 'check_frag_index', 'check_oom_reading',
    'check_doctor_setting', 'check_pool_boundary_choice', 'doctor', 'DOCTOR_SETTINGS', 'lab_comparison',
    'lab_comparison_table', 'own_snapshot', 'plot_doctor_snapshots', 'plot_doctor_cases', 'plot_doctor_heldout', 'Report', 'check_reserved_function', 'check_timeline_prediction',
    'compact_layout', 'explain_setting_error', 'format_bytes', 'fragmentation_index',
    'fragmentation_oom', 'GRAPH_BATCH_SIZES', 'graph_capture_ops', 'GRAPH_DTYPE', 'GRAPH_HIDDEN',
    'autograd_pool_totals', 'GRAPH_ORDERS', 'graph_pools', 'graph_pools_table', 'KiB', 'KNOB_CAP_MIB', 'KNOBS', 'knobs',
    'knobs_table', 'layout_summary', 'load_snapshot', 'MiB', 'normalize_ops', 'OOM_CAP_CHOICES',
    'OOM_CAP_MIB', 'oom_figures_table', 'OOM_FILL_COUNT', 'OOM_FILL_MIB', 'OOM_FIXES', 'oom_job',
    'oom_message', 'oom_ops', 'OOM_PATTERNS', 'OOM_REQUEST_MIB', 'oom_table', 'ORDERS',
    'parse_oom_message', 'parse_segments', 'plot_anatomy', 'plot_fragmentation_oom',
    'plot_graph_pools', 'plot_knobs', 'plot_pool_boundary', 'plot_request_table', 'plot_segments',
    'plot_sequence', 'plot_timeline', 'pool_boundary', 'POOL_BOUNDARY_OPTIONS', 'POST_URL',
    'predict_graph_pools', 'predict_oom', 'PROBE_SIZES', 'request_anatomy', 'request_table',
    'request_table_html', 'round_size', 'SHARE_WINDOW_S', 'shared_jobs', 'simulate', 'SMALL_COUNT',
    'SMALL_SIZE_B', 'timeline', 'timeline_ops', 'TIMELINE_SMALL_MIB', 'try_sequence'
]
