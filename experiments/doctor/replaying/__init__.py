"""A :class:`~experiments.doctor.reading.trace.Trace` becomes a
:class:`~experiments.doctor.replaying.run.Run`: the exact replay (:mod:`.replay`), with its
collaborators, the state before the recording (:mod:`.start`) and which pool each request went
to (:mod:`.attribution`), and what it recovers for the what-ifs, the request log
(:mod:`.requests`). Import the modules; this file re-exports nothing."""
