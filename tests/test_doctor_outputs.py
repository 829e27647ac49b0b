"""The doctor's ``--json`` answers on every snapshot the project records, held to a checked-in
list of their SHA-256 digests (``tests/doctor_outputs.sha256``).

The digests were written by the doctor as it stood before its re-layout into ``read/``,
``replay/``, ``answers/`` and ``allocator/`` (the commit that added this file), by this
module's own ``--write``; the re-layout changed no byte of any answer. They are not a statement
of what is right (the other doctor tests hold the answers to the GPU's recordings and the
allocator's rules): they pin the answers so that a change of code that is meant to change no
behaviour is seen to change none. A change that is meant to change an answer regenerates the
list and says in its commit which answers moved and why:

    python -m tests.test_doctor_outputs --write          # every snapshot, every variant
    python -m tests.test_doctor_outputs --diff DIR       # write each answer to DIR, to compare

The snapshots: the 21 recordings of ``alloc.doctor_snapshots``, the runs of
``alloc.doctor_cases`` (every case under every setting, in their compact form) and the raw
pickles of those cases in ``benchmarks/data/doctor_cases`` (among them the 450,000-event
training loop the benchmarks use). The variants: the command as the README shows it (no
option; two what-ifs; what-ifs under a cap; ``--suggest``).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "experiments" / "recorded"
PICKLES = ROOT / "benchmarks" / "data" / "doctor_cases"
DIGESTS = Path(__file__).resolve().parent / "doctor_outputs.sha256"

VARIANTS = {
    "plain": [],
    "what-ifs": ["--what-if", "expandable_segments:True", "--what-if", "max_split_size_mb:64"],
    "capped": ["--what-if", "garbage_collection_threshold:0.8", "--what-if", "roundup_power2_divisions:4",
               "--cap", "8589934592"],
    "suggest": ["--suggest"],
}
# The 450,000-event trace takes about a minute for its four variants: only in the full run.
# the costliest answers (11-17 s of CPU each): make test runs them, the developer loop does not
# (the runs of the cases in compact form, eager_long's among them, are all left to make test: below)
LONG = {"pickle/eager_long", "pickle/cap_two_streams", "pickle/mempools_two_capped"}


@lru_cache(maxsize=None)
def _recorded_runs() -> dict[str, dict]:
    out = {}
    for exp, param in (("alloc.doctor_snapshots", "workload"), ("alloc.doctor_cases", "case")):
        doc = json.loads((RECORDED / exp / "nvidia-h200.json").read_text())
        kind = "snapshot" if param == "workload" else "case"
        for p in doc["points"]:
            for r in p["data"]["runs"]:
                out[f"{kind}/{p['params'][param]}[{r['settings'] or 'default'}]"] = r
    return out


def snapshots() -> list[str]:
    """Every snapshot's name: snapshot/WORKLOAD[SETTINGS], case/CASE[SETTINGS], pickle/CASE."""
    return sorted(_recorded_runs()) + sorted(f"pickle/{p.name.split('.')[0]}" for p in PICKLES.glob("*.pickle.gz"))


def answer(name: str, variant: str, tmp: Path) -> str:
    """What ``python -m experiments doctor SNAPSHOT [variant] --json`` prints for ``name``."""
    from experiments.doctor.cli import main

    if name.startswith("pickle/"):
        path = PICKLES / f"{name.split('/', 1)[1]}.pickle.gz"
    else:
        path = tmp / "run.json"
        path.write_text(json.dumps(_recorded_runs()[name]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main([str(path), *VARIANTS[variant], "--json"])
    assert status == 0, (name, variant, status)
    return out.getvalue()


@contextlib.contextmanager
def one_read_and_replay():
    """While it is open, the doctor reads each snapshot file once and replays it once for each set
    of arguments: the four variants of a snapshot share its reading and its recorded run, as one
    set-up (about a third of this module's time went to doing both again for each variant).

    Only the doctor's own two calls (:func:`experiments.doctor.answers.report.doctor`'s ``read``
    and ``replay``) are shared; each variant gets its own copy of the run (``first_mismatch``,
    which the report may reword, copied too), and everything after them runs as the CLI runs it.
    """
    import copy

    from experiments.doctor.answers import report

    real_read, real_replay = report.read, report.replay
    traces: dict = {}
    runs: dict = {}

    def fresh(run):
        out = copy.copy(run)
        out.first_mismatch = copy.deepcopy(run.first_mismatch)
        return out

    def read(snapshot, **kw):
        key = (hashlib.sha256(Path(snapshot).read_bytes()).hexdigest(), repr(sorted(kw.items())))
        if key not in traces:
            traces[key] = real_read(snapshot, **kw)
        return traces[key]

    def replay(trace, **kw):
        key = (id(trace), repr(sorted(kw.items())))
        if key not in runs:
            runs[key] = fresh(real_replay(trace, **kw))   # kept as it came, before the report uses it
        return fresh(runs[key])

    report.read, report.replay = read, replay
    try:
        yield
    finally:
        report.read, report.replay = real_read, real_replay


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def recorded_digests() -> dict[tuple[str, str], str]:
    out = {}
    for line in DIGESTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, variant, sha = line.split("\t")
            out[(name, variant)] = sha
    return out


def test_every_recorded_snapshot_and_variant_has_a_digest():
    want = {(n, v) for n in snapshots() for v in VARIANTS}
    assert len(want) >= 4 * 90, len(want)
    assert set(recorded_digests()) == want


# The developer loop holds the recorded snapshots and the raw pickles (both readers); the runs of
# the doctor's cases in their compact form (two thirds of the time) are left to make test.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in LONG or n.startswith("case/") else n
                                  for n in snapshots()])
def test_the_json_answer_is_the_one_recorded_before_the_relayout(name, tmp_path):
    digests = recorded_digests()
    with one_read_and_replay():
        got = {v: digest(answer(name, v, tmp_path)) for v in VARIANTS}
    want = {v: digests[(name, v)] for v in VARIANTS}
    assert got == want, f"{name}: the doctor's --json answer changed (see this module's docstring)"


def _main(argv: list[str]) -> int:
    write = "--write" in argv
    diff = Path(argv[argv.index("--diff") + 1]) if "--diff" in argv else None
    lines = ["# sha256 of `python -m experiments doctor SNAPSHOT VARIANT --json` (tests/test_doctor_outputs.py)"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in snapshots():
            for v in VARIANTS:
                text = answer(name, v, Path(tmp))
                lines.append(f"{name}\t{v}\t{digest(text)}")
                if diff is not None:
                    f = diff / f"{name.replace('/', '__')}__{v}.json"
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_text(text)
            print(name, file=sys.stderr)
    if write:
        DIGESTS.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
