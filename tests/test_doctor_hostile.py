"""The allocator doctor on hostile and malformed snapshots.

Each input is made here, then given to ``python -m experiments doctor`` in a fresh process
with a 2 GiB address-space limit. Expected of every one: exit status 2, one line on stderr
naming what is wrong (the field, the entry, the opcode), no code run from the file (a marker
file the attack would create stays absent), and peak memory under a fixed bound of 3 x the
input plus 64 MiB over the interpreter's own. An internal error is a bug: exit 1, one line
saying so and where the traceback was written.

Each attack was tried on the code before the loader was written (the numbers are in the
commit message): the pickles ran nothing through the doctor's own loader but ran code through
chapter 1's ``al.load_snapshot``; the DAG pickle and the trace_z bomb died of MemoryError with
a traceback; wrong types printed tracebacks or were accepted; impossible traces replayed.
"""
from __future__ import annotations

import base64
import builtins
import functools
import gzip
import json
import os
import pickle
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AS_LIMIT = 2 << 30
# Peak memory is the process's own high-water mark (VmHWM): ru_maxrss would also count the
# parent's memory before exec (Linux keeps it across fork and exec).
WRAPPER = r"""
import sys
from experiments.core.cli import main
try:
    code = main(sys.argv[2:])
finally:
    hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]
    with open(sys.argv[1], "w") as f:
        f.write(hwm)
sys.exit(code)
"""


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def run_doctor(tmp_path: Path, *args: str, env: dict | None = None, pre: str = "") -> tuple[int, list[str], int]:
    """(exit status, stderr lines, peak RSS in KiB) of the doctor command in a fresh, limited process."""
    rss_file = tmp_path / "rss.txt"
    code = pre + WRAPPER
    out = subprocess.run([sys.executable, "-c", code, str(rss_file), "doctor", *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=300, preexec_fn=_limit,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path), **(env or {})))
    rss = int(rss_file.read_text()) if rss_file.exists() else -1
    return out.returncode, out.stderr.strip().splitlines(), rss


@pytest.fixture(scope="module")
def baseline_rss(tmp_path_factory) -> int:
    """Peak RSS (KiB) of the doctor on a tiny valid snapshot: the interpreter and the package."""
    tmp = tmp_path_factory.mktemp("base")
    p = tmp / "ok.json"
    p.write_text(json.dumps({"segments": [], "device_traces": [[]]}))
    code, err, rss = run_doctor(tmp, str(p), "--json")
    assert code == 0, err
    return rss


# ----------------------------------------------------------------------------- code in the pickle

class _System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (builtins.eval, (f"open({str(self.marker)!r}, 'w').write('ran')",))


class _Open:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (builtins.open, (str(self.marker), "w"))


GOOD = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 0x7F0000000000, "size": 512, "stream": 0}]],
        "allocator_settings": {}}


def _code_pickles(marker: Path) -> dict[str, bytes]:
    out = {}
    for proto in range(6):
        for cls in (_System, _Eval, _Open):
            out[f"{cls.__name__}_protocol{proto}"] = pickle.dumps(dict(GOOD, x=cls(marker)), protocol=proto)
    m = str(marker).encode()
    out["global_at_top"] = b"cos\nsystem\n(S'touch " + m + b"'\ntR."
    out["stack_global"] = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x05touch\x85R."
    out["inst"] = b"(S'touch " + m + b"'\nios\nsystem\n."
    out["gzipped"] = gzip.compress(pickle.dumps(dict(GOOD, x=_System(marker)), protocol=4))
    return out


def test_pickles_that_name_code_run_nothing(tmp_path, baseline_rss):
    marker = tmp_path / "ran.txt"
    for name, blob in _code_pickles(marker).items():
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(blob)
        code, err, _ = run_doctor(tmp_path, str(path), "--json")
        assert not marker.exists(), f"{name}: the pickle ran code"
        assert code == 2 and len(err) == 1 and err[0].startswith("error:"), (name, err)
        assert "refusing to load" in err[0] or "byte" in err[0], (name, err)


def test_chapter_1_load_snapshot_goes_through_the_same_loader(tmp_path):
    from experiments.allocator.snapshot import load_snapshot

    marker = tmp_path / "ran.txt"
    for name, blob in _code_pickles(marker).items():
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(blob)
        with pytest.raises(ValueError):
            load_snapshot(path)
        assert not marker.exists(), f"{name}: al.load_snapshot ran code"


def test_every_protocol_and_gzip_load(tmp_path):
    """Protocols 2 to 5 (Python 3.14 writes 5 by default) and gzip'd pickles give the same trace."""
    from experiments.doctor.reading.trace import read

    snap = {"segments": [{"device": 0, "address": 1 << 40, "total_size": 2 << 20, "stream": 0, "segment_type": "small",
                          "segment_pool_id": (0, 0), "is_expandable": False,
                          "blocks": [{"address": 1 << 40, "size": 512, "requested_size": 100, "state": "active_allocated"},
                                     {"address": (1 << 40) + 512, "size": (2 << 20) - 512, "requested_size": 0,
                                      "state": "inactive"}]}],
            "device_traces": [[{"action": "segment_alloc", "addr": 1 << 40, "size": 2 << 20, "stream": 0},
                               {"action": "alloc", "addr": 1 << 40, "size": 100, "stream": 0}]]}
    want = None
    for proto in (2, 3, 4, 5):
        for packed in (False, True):
            raw = pickle.dumps(snap, protocol=proto)
            path = tmp_path / f"p{proto}{'.gz' if packed else ''}"
            path.write_bytes(gzip.compress(raw) if packed else raw)
            t = read(str(path))
            got = (list(t.events), t.segments)
            want = want or got
            assert got == want == ([(3, 1 << 40, 2 << 20, 0), (0, 1 << 40, 100, 0)], got[1]), (proto, packed)


# ----------------------------------------------------------------------------- bombs

def _compressed(piece: bytes, times: int, gz: bool) -> bytes:
    """zlib (or gzip) of ``piece * times`` (a whole number of MiB), never all in memory.

    Each 1 MiB of it is compressed after a full flush, which empties the compressor's window, so
    every MiB after the first compresses to the same bytes: those are made once and repeated,
    and the checksum of the whole is computed apart (0.4 s of CPU for 1 GiB, where compressing
    it all took 5 s)."""
    chunk = piece * ((1 << 20) // len(piece))
    n = times * len(piece) >> 20
    c = zlib.compressobj(9, zlib.DEFLATED, 31 if gz else 15)
    first = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    last = c.flush()[:-8 if gz else -4]          # the final block, less the trailer made below
    checksum = zlib.crc32 if gz else zlib.adler32
    check, size = checksum(b""), n * len(chunk)
    for _ in range(n):
        check = checksum(chunk, check)
    trailer = (check.to_bytes(4, "little") + (size & 0xFFFFFFFF).to_bytes(4, "little") if gz
               else check.to_bytes(4, "big"))
    return first + again * (n - 1) + last + trailer


@functools.lru_cache(maxsize=1)
def _bombs() -> dict[str, tuple[bytes, tuple[str, ...], str]]:
    """name -> (file bytes, extra CLI args, a word the one-line error must contain, '' if none)."""
    blk = {"address": 0, "size": 512, "requested_size": 512, "state": "active_allocated"}
    seg = {"address": 0, "total_size": 2 << 20, "stream": 0, "segment_type": "small", "blocks": [blk] * 20000}
    dag = pickle.dumps({"segments": [seg] * 20000, "device_traces": [[]]}, protocol=4)        # 80 KB
    ev = {"action": "alloc", "addr": 0, "size": 512, "stream": 0}
    refs = pickle.dumps({"segments": [], "device_traces": [[ev] * 40000]}, protocol=4)
    rng = json.dumps({"segments": [{"address": 0, "total_size": 10**16, "is_expandable": True, "stream": 0,
                                    "blocks": []}], "device_traces": [[]],
                      "allocator_settings": {"expandable_segments": True}}).encode()
    bignum = (b'{"segments":[],"device_traces":[[{"action":"alloc","addr":0,"size":' + b"9" * 150
              + b',"stream":0}]]}')
    deep = b'{"segments":[],"device_traces":[[' + b"[" * 100000 + b"]" * 100000 + b"]]}"
    zbomb = json.dumps({"format": "memlab-snapshot-1", "trace_events": 1, "segments": [],
                        "trace_z": base64.b64encode(_compressed(b"\n", 1 << 30, gz=False)).decode()}).encode()
    # a gzip bomb whose trailer lies about its size: the decompression itself must stop
    gz = bytearray(_compressed(b"N", 400 << 20, gz=True))
    gz[-4:] = (1000).to_bytes(4, "little")
    many = pickle.dumps({"segments": [], "device_traces": [[]] * 10, "x": [[0] * 1000] * 1000}, protocol=4)
    return {
        "dag_80KB_pickle": (dag, (), "blocks"),
        "shared_trace_entry": (refs, (), "second reference"),
        "huge_expandable_segment_json": (rng, (), "total_size"),
        "huge_number_json": (bignum, (), "size"),
        "deep_json": (deep, (), "nests"),
        "trace_z_zlib_bomb_1MB": (zbomb, (), "trace_z"),
        "gzip_bomb_lying_trailer": (bytes(gz), ("--max-bytes", str(64 << 20)), "decompresses"),
        "shared_lists_are_not_walked": (many, (), ""),     # valid: runs, and its junk is never walked
    }


# The names, for collection: the bombs themselves take seconds of zlib, made once, when a test runs.
BOMBS = ("dag_80KB_pickle", "deep_json", "gzip_bomb_lying_trailer", "huge_expandable_segment_json",
         "huge_number_json", "shared_lists_are_not_walked", "shared_trace_entry", "trace_z_zlib_bomb_1MB")


@pytest.mark.parametrize("name", [pytest.param(b, marks=pytest.mark.slow) if b in ("dag_80KB_pickle", "deep_json") else b
                                  for b in BOMBS])
def test_bombs_stop_early_with_one_line(tmp_path, baseline_rss, name):
    assert sorted(_bombs()) == list(BOMBS)
    blob, extra, word = _bombs()[name]
    path = tmp_path / (name + (".json" if blob[:1] == b"{" else ".pickle"))
    path.write_bytes(blob)
    code, err, rss = run_doctor(tmp_path, str(path), "--json", *extra)
    if word:
        assert code == 2 and len(err) == 1 and err[0].startswith("error:"), err
        assert word in err[0], err
    else:
        assert code == 0, err
    bound = baseline_rss + 3 * len(blob) // 1024 + 64 * 1024
    if name == "gzip_bomb_lying_trailer":
        bound = baseline_rss + 3 * len(blob) // 1024 + (64 << 10) + 64 * 1024   # the --max-bytes it was given
    assert rss < bound, f"{name}: peak {rss // 1024} MiB, bound {bound // 1024} MiB"


# ----------------------------------------------------------------------------- wrong types, impossible traces

def _entry(**kw):
    e = {"action": "alloc", "addr": 0x7F0000000000, "size": 512, "stream": 0}
    e.update(kw)
    return e


SEG = {"address": 1 << 40, "total_size": 2 << 20, "stream": 0, "segment_type": "small"}
MALFORMED = {
    # name: (snapshot, words the one line must contain)
    "size_is_a_string": ({"segments": [], "device_traces": [[_entry(size="512")]]}, ("trace entry 0", "'size'")),
    "size_is_a_bool": ({"segments": [], "device_traces": [[_entry(size=True)]]}, ("trace entry 0", "'size'")),
    "size_is_a_float": ({"segments": [], "device_traces": [[_entry(size=1.5e300)]]}, ("trace entry 0", "'size'")),
    "addr_is_none": ({"segments": [], "device_traces": [[_entry(), _entry(addr=None)]]}, ("trace entry 1", "'addr'")),
    "action_is_an_int": ({"segments": [], "device_traces": [[_entry(action=5)]]}, ("trace entry 0", "'action'")),
    "entry_is_a_list": ({"segments": [], "device_traces": [[[1, 2, 3]]]}, ("trace entry 0",)),
    "stream_missing": ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 512}]]},
                       ("trace entry 0", "'stream'")),
    "segments_is_a_dict": ({"segments": {"a": 1}, "device_traces": [[]]}, ("'segments'",)),
    "blocks_is_an_int": ({"segments": [dict(SEG, blocks=7)], "device_traces": [[]]}, ("segments[0]", "'blocks'")),
    "block_without_address": ({"segments": [dict(SEG, blocks=[{"size": 5}])], "device_traces": [[]]},
                              ("segments[0].blocks[0]", "'address'")),
    "pool_id_is_an_int": ({"segments": [dict(SEG, blocks=[], segment_pool_id=5)], "device_traces": [[]]},
                          ("segments[0]", "'segment_pool_id'")),
    "settings_is_a_string": ({"segments": [], "device_traces": [[]], "allocator_settings": "expandable"},
                             ("'allocator_settings'",)),
    "max_split_size_is_a_string": ({"segments": [], "device_traces": [[]],
                                    "allocator_settings": {"max_split_size": "big"}}, ("'max_split_size'",)),
    "device_traces_is_a_dict": ({"segments": [], "device_traces": {"0": []}}, ("'device_traces'",)),
    "total_bytes_is_a_string": ({"segments": [], "device_traces": [[]], "device_total_bytes": "lots"},
                                ("'device_total_bytes'",)),
    "negative_size": ({"segments": [], "device_traces": [[_entry(size=-512)]]}, ("trace entry 0", "'size'")),
    "negative_segment_free": ({"segments": [], "device_traces": [[{"action": "segment_free", "addr": 1 << 40,
                                                                    "size": -5, "stream": 0}]]},
                              ("trace entry 0", "segment_free", "'size'")),
    "zero_byte_alloc": ({"segments": [], "device_traces": [[_entry(size=0)]]}, ("trace entry 0", "impossible")),
    "overlapping_blocks": ({"segments": [dict(SEG, blocks=[
        {"address": 1 << 40, "size": 1 << 20, "requested_size": 5, "state": "active_allocated"},
        {"address": (1 << 40) + 512, "size": 1 << 20, "requested_size": 5, "state": "active_allocated"}])],
        "device_traces": [[]]}, ("segments[0]", "overlaps")),
    "blocks_not_adding_up": ({"segments": [dict(SEG, blocks=[
        {"address": 1 << 40, "size": 1 << 20, "requested_size": 5, "state": "active_allocated"}])],
        "device_traces": [[]]}, ("segments[0]", "total_size")),
    "overlapping_segments": ({"segments": [dict(SEG, blocks=[]), dict(SEG, address=(1 << 40) + 4096, blocks=[])],
                              "device_traces": [[]]}, ("overlap",)),
    "free_of_an_unknown_address": ({"segments": [], "device_traces": [[
        {"action": "free_requested", "addr": 0x7F0000000000, "size": 512, "stream": 0},
        {"action": "free_completed", "addr": 0x7F0000000000, "size": 512, "stream": 0}]]},
        ("trace entry 0", "free_requested", "no segment")),
    "completion_of_an_unknown_free": ({"segments": [], "device_traces": [[
        {"action": "free_completed", "addr": 0x7F0000000000, "size": 512, "stream": 0}]]},
        ("trace entry 0", "free_completed", "no segment")),
}


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_snapshots_are_one_line_naming_the_field_and_exit_2(tmp_path, name, fmt):
    snap, words = MALFORMED[name]
    path = tmp_path / f"{name}.{fmt}"
    if fmt == "pickle":
        path.write_bytes(pickle.dumps(snap, protocol=4))
    else:
        try:
            path.write_text(json.dumps(snap))
        except (TypeError, ValueError):
            pytest.skip("not expressible in JSON")
    code, err, _ = run_doctor(tmp_path, str(path), "--json")
    assert code == 2 and len(err) == 1 and err[0].startswith("error:"), err
    assert "Traceback" not in err[0] and "bug" not in err[0]
    for w in words:
        assert w in err[0], (w, err[0])


# ----------------------------------------------------------------------------- bugs are bugs

def test_an_internal_error_exits_1_says_it_is_a_bug_and_where_the_traceback_is(tmp_path):
    path = tmp_path / "ok.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_entry()]]}, protocol=4))
    inject = ("import experiments.doctor.model.engine as _e\n"
              "def _boom(self, *a, **k):\n"
              "    raise IndexError('list assignment index out of range')\n"
              "_e.Engine.malloc = _boom\n")
    code, err, _ = run_doctor(tmp_path, str(path), "--json", pre=inject)
    assert code == 1 and len(err) == 1, err
    line = err[0]
    assert "internal error" in line and "bug" in line and "IndexError" in line, line
    where = line.split("traceback is in ")[1].split(";")[0]
    text = Path(where).read_text()
    assert "Traceback (most recent call last)" in text and "_boom" in text and "IndexError" in text


def test_the_same_error_from_the_input_is_not_called_a_bug(tmp_path):
    """A ValueError raised for bad input is exit 2; the one raised by a bug (above) is exit 1."""
    path = tmp_path / "ok.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_entry()]]}, protocol=4))
    code, err, _ = run_doctor(tmp_path, str(path), "--what-if", "max_split_size_mb:abc")
    assert code == 2 and len(err) == 1 and "max_split_size_mb" in err[0] and "bug" not in err[0]
    inject = ("import experiments.doctor.model.engine as _e\n"
              "def _boom(self, *a, **k):\n"
              "    raise ValueError('an engine invariant broke')\n"
              "_e.Engine.malloc = _boom\n")
    code, err, _ = run_doctor(tmp_path, str(path), pre=inject)
    assert code == 1 and "bug" in err[0], err
