import os
from pathlib import Path

import pytest

from experiments.core import alloc_conf, runner
from experiments.core.alloc_conf import UnsupportedOptionError

ROOT = Path(__file__).resolve().parent.parent
ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT)])}


def test_fresh_process_returns_value_with_allocator_settings():
    r = runner.run_fresh("tests.fresh_targets:echo", {"n": 3}, env=ENV,
                         alloc_conf_settings={"expandable_segments": True, "max_split_size_mb": 64})
    assert r.ok, r
    assert r.value["kwargs"] == {"n": 3}
    assert r.value["alloc_conf"] == "expandable_segments:True,max_split_size_mb:64"
    assert r.value["pid"] != os.getpid()
    assert r.unwrap() == r.value


def test_errors_come_back_as_data():
    r = runner.run_fresh("tests.fresh_targets:boom", {"message": "layers must be >= 1"}, env=ENV)
    assert not r.ok and r.error_kind == "error"
    assert "layers must be >= 1" in r.message
    with pytest.raises(runner.FreshProcessError, match="layers must be >= 1"):
        r.unwrap()


def test_out_of_memory_is_reported_as_oom():
    r = runner.run_fresh("tests.fresh_targets:oom", env=ENV)
    assert (r.ok, r.error_kind) == (False, "oom")
    assert "Tried to allocate 2.00 GiB" in r.message


def test_timeout_kills_the_child():
    r = runner.run_fresh("tests.fresh_targets:sleepy", {"seconds": 30}, timeout_s=3, env=ENV)
    assert (r.ok, r.error_kind) == (False, "timeout")
    assert r.elapsed_s < 20


def test_a_crashing_child_is_reported():
    r = runner.run_fresh("tests.fresh_targets:die", env=ENV)
    assert (r.ok, r.error_kind) == (False, "crash")
    assert "code 3" in r.message


def test_unserialisable_results_are_errors():
    r = runner.run_fresh("tests.fresh_targets:not_json", env=ENV)
    assert r.error_kind == "error" and "cannot store" in r.message


@pytest.mark.skipif(__import__("experiments.core.device", fromlist=["x"]).has_cuda(), reason="no-GPU path")
def test_memory_cap_without_gpu_is_a_clear_error():
    r = runner.run_fresh("tests.fresh_targets:echo", memory_cap_mib=512, env=ENV)
    assert r.error_kind == "error" and "needs a CUDA GPU" in r.message


@pytest.mark.parametrize("kwargs, match", [
    (dict(target="no_colon"), "target must look like"),
    (dict(target="tests.fresh_targets:echo", memory_fraction=1.5), r"memory_fraction must be in \(0, 1\]"),
    (dict(target="tests.fresh_targets:echo", memory_cap_mib=-1), "memory_cap_mib must be > 0"),
    (dict(target="tests.fresh_targets:echo", memory_cap_mib=1, memory_fraction=0.5), "not both"),
    (dict(target="tests.fresh_targets:echo", timeout_s=0), "timeout_s must be > 0"),
    (dict(target="tests.fresh_targets:echo", alloc_conf_settings={"expandable_segment": True}), "unknown allocator option 'expandable_segment'"),
])
def test_bad_arguments_are_rejected_before_starting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        runner.run_fresh(**kwargs)


def test_alloc_conf_parse_and_render_round_trip():
    text = "expandable_segments:True,roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.6"
    parsed = alloc_conf.parse(text)
    assert parsed == {"expandable_segments": True, "roundup_power2_divisions": "[256:1,512:2,>:8]",
                      "garbage_collection_threshold": 0.6}
    assert alloc_conf.render(parsed, version=(2, 11)) == text
    assert alloc_conf.render(None) == ""


@pytest.mark.parametrize("settings, match", [
    # torch's parseMaxSplitSize: "max_split_size_mb too small, must be >= " large_segment_size_mb (20)
    ({"max_split_size_mb": 19}, "max_split_size_mb must be >= 20"),
    ({"max_split_size_mb": "64"}, "non-negative integer"),
    ({"garbage_collection_threshold": 1.5}, r"must be in \(0, 1\)"),
    ({"roundup_power2_divisions": 3}, "power of two"),
    ({"expandable_segments": "yes"}, "True or False"),
    ({"backend": "magic"}, "native"),
    ("expandable_segments", "name:value"),
    ("expandable_segments:maybe", "True or False"),
])
def test_alloc_conf_rejects_bad_values(settings, match):
    with pytest.raises(ValueError, match=match):
        alloc_conf.render(settings, version=(2, 11))


def test_alloc_conf_knows_which_release_added_an_option():
    with pytest.raises(UnsupportedOptionError, match=r"needs torch >= 2.10; this is torch 2.4"):
        alloc_conf.render({"large_segment_size_mb": 40}, version=(2, 4))
    assert alloc_conf.render({"large_segment_size_mb": 40}, version=(2, 11)) == "large_segment_size_mb:40"
    # the key is a string in 2.13.0's libc10.so and absent from 2.12.0's
    with pytest.raises(UnsupportedOptionError, match=r"needs torch >= 2\.13"):
        alloc_conf.render({"pinned_max_cached_size_mb": 64}, version=(2, 12))
    assert alloc_conf.render({"max_split_size_mb": 20}, version=(2, 11)) == "max_split_size_mb:20"
