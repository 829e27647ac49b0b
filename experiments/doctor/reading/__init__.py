"""A file becomes a :class:`~experiments.doctor.reading.trace.Trace`: the one restricted,
bounded loader (:mod:`.loader`, with its pickle reader :mod:`.unpickler`, which runs no code),
the trace as columns (:mod:`.rows`), and the checked, normalised trace (:mod:`.trace`).
Import the modules; this file re-exports nothing."""
