"""The sync detector at the address readers import it from:
``from experiments.sync_detector import no_syncs``. The code is in :mod:`experiments.syncs.detector`."""
from .syncs.detector import *  # noqa: F401,F403
