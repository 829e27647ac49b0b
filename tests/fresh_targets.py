"""CPU stand-ins run by tests/test_runner.py in a fresh process."""
import os
import time


def echo(**kwargs):
    return {"kwargs": kwargs, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "pid": os.getpid()}


def boom(message="bad input"):
    raise ValueError(message)


def oom():
    import torch

    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")


def sleepy(seconds):
    time.sleep(seconds)
    return "woke"


def die():
    os._exit(3)


def not_json():
    return object()
