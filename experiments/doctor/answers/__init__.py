"""A :class:`~experiments.doctor.replaying.run.Run` becomes what the reader reads: the what-ifs
(:mod:`.whatif`), the suggestion (:mod:`.suggest`), the OOM explanation (:mod:`.oom`), the
report and :func:`~experiments.doctor.answers.report.doctor` (:mod:`.report`, telling a
progress hook each step: :mod:`.progress`) and its figure (:mod:`.figure`, matplotlib, imported
when drawn). Import the modules; this file re-exports nothing."""
