"""The doctor's lab: the GPU programs that hold the doctor to what the GPU did. The only part of
the doctor that imports torch (inside its functions, so that it imports without a GPU); the
rest of the doctor never imports it, and the page in the browser never ships it.

:mod:`.recorder` (what every program uses: phase marks with the GPU's counters, allocation,
probes, calibrated GPU work), :mod:`.snapshots` (the book's seven workloads, recorded as
``alloc.doctor_snapshots``, and the reader's own snapshot), :mod:`.programs` and :mod:`.cases`
(the test oracles, recorded as ``alloc.doctor_cases``), :mod:`.heldout` (programs the doctor was
not built on, recorded as ``alloc.doctor_heldout``). Chapter 1 registers the experiments
(their ids keep its prefix). Import the modules; this file re-exports nothing."""
