"""The one model of PyTorch's caching allocator that the rest of the doctor calls: the size
rules as pure functions of the settings (:mod:`.rules`, citing ``RULES.md``) and the allocator
of one device that applies them (:mod:`.engine`). Import the modules; this file re-exports nothing."""
