"""Recorded results: JSON files under ``experiments/recorded/``, one per experiment and GPU.

Layout: ``recorded/<experiment id>/<gpu slug>.json`` (for example
``recorded/alloc.anatomy/nvidia-h200.json``). Each file holds the provenance of the
run and one entry per parameter point. Files are validated against
``schemas/recorded.schema.json`` (and the experiment's own data schema) on load and on
save, and written atomically so an interrupted run never leaves half a file behind.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import jsonschema

from .device import Provenance, gpu_slug
from .files import write_atomic

PACKAGE_RECORDED_DIR = Path(__file__).resolve().parent.parent / "recorded"
FORMAT_VERSION = 1
PREFERRED_GPU = "nvidia-h200"  # the lab GPU; the book shows its numbers when several exist


class NotRecordedError(LookupError):
    """No recorded result exists for the experiment, GPU or parameter point asked for."""


class RecordedFileError(ValueError):
    """A recorded file exists but is corrupt or does not match its schema."""


def recorded_dir() -> Path:
    """Where recorded results are read and written: ``$CUDA_MEMLAB_RECORDED_DIR`` or the package's."""
    env = os.environ.get("CUDA_MEMLAB_RECORDED_DIR")
    return Path(env) if env else PACKAGE_RECORDED_DIR


@lru_cache(maxsize=1)
def file_schema() -> dict[str, Any]:
    """The JSON schema every recorded file follows; its chapter numbers come from
    :data:`.chapters.NUMBERS` (the one declaration of the book's chapters)."""
    from .chapters import NUMBERS

    path = Path(__file__).resolve().parent.parent / "schemas" / "recorded.schema.json"
    schema = json.loads(path.read_text())
    schema["properties"]["chapter"] = {"type": "integer", "enum": list(NUMBERS)}
    schema["properties"]["format"] = {"const": FORMAT_VERSION}
    return schema


def to_jsonable(obj: Any) -> Any:
    """Convert results to plain JSON values.

    Tuples become lists, numpy and torch scalars become Python numbers, dataclasses
    become dicts, and non-finite floats become ``None`` (JSON has no NaN).

    Raises:
        TypeError: for values with no JSON form (tensors must be reduced first).
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "shape") and hasattr(obj, "tolist"):  # numpy values, torch tensors
        if tuple(obj.shape) == ():
            return to_jsonable(obj.item())
        if type(obj).__module__.startswith("numpy"):
            return to_jsonable(obj.tolist())
    raise TypeError(f"cannot store a {type(obj).__name__} in a recorded result; reduce it to numbers first")


def params_key(params: Mapping[str, Any]) -> str:
    """Canonical text key of a parameter point (sorted JSON)."""
    return json.dumps(to_jsonable(dict(params)), sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class RecordedPoint:
    """One parameter point: the parameters, the measured data, and how long it took (s)."""

    params: dict[str, Any]
    data: dict[str, Any]
    elapsed_s: float


@dataclasses.dataclass(frozen=True)
class RecordedFile:
    """The content of one recorded file."""

    experiment: str
    chapter: int
    provenance: Provenance
    points: tuple[RecordedPoint, ...]
    path: Path | None = None

    def find(self, params: Mapping[str, Any]) -> RecordedPoint | None:
        """The point recorded with exactly these parameters, or None."""
        key = params_key(params)
        for p in self.points:
            if params_key(p.params) == key:
                return p
        return None

    def param_values(self) -> dict[str, list[Any]]:
        """For each parameter, the distinct values present in the recording, sorted."""
        values: dict[str, list[Any]] = {}
        for p in self.points:
            for k, v in p.params.items():
                if v not in values.setdefault(k, []):
                    values[k].append(v)
        for k, vs in values.items():
            try:
                values[k] = sorted(vs)
            except TypeError:
                pass
        return values

    def to_document(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "experiment": self.experiment,
            "chapter": self.chapter,
            "provenance": self.provenance.to_dict(),
            "points": [dataclasses.asdict(p) for p in self.points],
        }


def _validator(schema: Mapping[str, Any], format_checker: Any = None) -> Any:
    """A validator for ``schema``, the schema itself checked once per process.

    ``jsonschema.validate`` checks the schema on every call, and that check cost 20 times the
    validation itself: most of the time a recorded page took to build (each explorer view loads
    its recording, and each point's data is checked against the experiment's data schema).

    Raises:
        jsonschema.SchemaError: the schema is not a valid JSON schema.
    """
    key = (json.dumps(schema, sort_keys=True, default=repr), format_checker is not None)
    validator = _VALIDATORS.get(key)
    if validator is None:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        validator = _VALIDATORS[key] = cls(schema, format_checker=format_checker)
    return validator


def _validate(validator: Any, instance: Any) -> None:
    """``jsonschema.validate`` with a made validator: raises the same (best-matching) error."""
    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    if error is not None:
        raise error


_VALIDATORS: dict[tuple[str, bool], Any] = {}


def validate_document(doc: Any, data_schema: Mapping[str, Any] | None = None, *, where: str = "recorded file") -> None:
    """Check a recorded document against the file schema and the experiment's data schema.

    Raises:
        RecordedFileError: saying which field is wrong and where; for a file of another
            format than :data:`FORMAT_VERSION`, saying to re-record it.
    """
    if isinstance(doc, Mapping) and "format" in doc and doc["format"] != FORMAT_VERSION:
        raise RecordedFileError(
            f"{where}: recorded in format {doc['format']!r}, but this code reads format {FORMAT_VERSION} only; "
            f"re-record it on a GPU: python -m experiments record --experiment {doc.get('experiment', 'ID')}")
    try:
        _validate(_validator(file_schema(), jsonschema.FormatChecker()), doc)
    except jsonschema.ValidationError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise RecordedFileError(f"{where}: {path}: {e.message}") from None
    try:  # jsonschema checks "date-time" only with an optional package; check it here
        if _dt.datetime.fromisoformat(doc["provenance"]["date"]).tzinfo is None:
            raise ValueError("no time zone")
    except ValueError as e:
        raise RecordedFileError(f"{where}: provenance/date: {doc['provenance']['date']!r} is not an ISO 8601 "
                                f"date-time with a time zone ({e})") from None
    if data_schema is not None:
        data_validator = _validator(data_schema)
        for i, point in enumerate(doc["points"]):
            try:
                _validate(data_validator, point["data"])
            except jsonschema.ValidationError as e:
                path = "/".join(str(p) for p in e.absolute_path) or "(data)"
                raise RecordedFileError(f"{where}: point {i} data/{path}: {e.message}") from None


def path_for(experiment: str, gpu: str, root: Path | None = None) -> Path:
    """File of ``experiment`` recorded on ``gpu`` (a GPU name or slug)."""
    return (root or recorded_dir()) / experiment / f"{gpu_slug(gpu)}.json"


def recorded_gpus(experiment: str, root: Path | None = None) -> list[str]:
    """GPU slugs with a recorded file for ``experiment``, sorted."""
    folder = (root or recorded_dir()) / experiment
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.json"))


def save(
    experiment: str,
    chapter: int,
    provenance: Provenance,
    points: Iterable[RecordedPoint],
    *,
    data_schema: Mapping[str, Any] | None = None,
    root: Path | None = None,
) -> Path:
    """Validate and write one experiment's recording atomically; return the file path.

    Raises:
        RecordedFileError: if the content does not match the schemas (nothing is written).
    """
    rec = RecordedFile(experiment, chapter, provenance,
                       tuple(RecordedPoint(to_jsonable(p.params), to_jsonable(p.data), float(p.elapsed_s))
                             for p in points))
    doc = rec.to_document()
    validate_document(doc, data_schema, where=f"{experiment} on {provenance.gpu_name}")
    path = path_for(experiment, provenance.gpu_name, root)
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=False, allow_nan=False) + "\n")
    return path


def read_file(path: Path, data_schema: Mapping[str, Any] | None = None) -> RecordedFile:
    """Load and validate one recorded file.

    Raises:
        RecordedFileError: unreadable JSON or a schema violation, naming the file.
    """
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RecordedFileError(f"{path}: not readable JSON ({e})") from None
    validate_document(doc, data_schema, where=str(path))
    return RecordedFile(
        experiment=doc["experiment"],
        chapter=doc["chapter"],
        provenance=Provenance.from_dict(doc["provenance"]),
        points=tuple(RecordedPoint(p["params"], p["data"], p["elapsed_s"]) for p in doc["points"]),
        path=Path(path),
    )


def _parse_date(s: str) -> _dt.datetime:
    try:
        return _dt.datetime.fromisoformat(s)
    except ValueError:
        return _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)


def load(
    experiment: str,
    gpu: str | None = None,
    *,
    data_schema: Mapping[str, Any] | None = None,
    root: Path | None = None,
) -> RecordedFile:
    """The recording of ``experiment``.

    Args:
        gpu: GPU name or slug; default ``$CUDA_MEMLAB_GPU``, else the lab GPU
            (``nvidia-h200``) when recorded, else the most recently recorded GPU.

    Raises:
        NotRecordedError: nothing recorded for this experiment (or this GPU).
        RecordedFileError: the file is corrupt.
    """
    gpus = recorded_gpus(experiment, root)
    if not gpus:
        raise NotRecordedError(
            f"no recorded results for {experiment!r}; record them on a GPU with "
            f"`python -m experiments record --experiment {experiment}`"
        )
    wanted = gpu or os.environ.get("CUDA_MEMLAB_GPU")
    if wanted:
        slug = gpu_slug(wanted)
        if slug not in gpus:
            raise NotRecordedError(f"{experiment!r} has no recording on {wanted!r}; recorded GPUs: {gpus}")
        return read_file(path_for(experiment, slug, root), data_schema)
    if PREFERRED_GPU in gpus:
        return read_file(path_for(experiment, PREFERRED_GPU, root), data_schema)
    files = [read_file(path_for(experiment, g, root), data_schema) for g in gpus]
    return max(files, key=lambda f: _parse_date(f.provenance.date))
