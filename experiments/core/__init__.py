"""The core every chapter builds on: device and provenance, measurement, the registry of
experiments, recorded results, fresh processes, plotting, widgets, claims, checks, units,
tables and the command line. It imports no chapter."""
