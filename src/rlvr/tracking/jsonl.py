"""JSON Lines logging: one JSON object per line, always on, readable with any tool.

`metrics.jsonl`, `eval.jsonl` and `samples.jsonl` of a run directory are written with
:class:`JsonlWriter` and read back with :func:`read_jsonl`. Every line is strict JSON: tensors
and numpy values become plain numbers or lists, and NaN / ±inf become ``null`` (Python's
``json`` would otherwise write the non-standard tokens ``NaN`` and ``Infinity``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO


class JsonlFormatError(ValueError):
    """A line of a JSONL file is not a JSON object; `path` and `line` (1-based) say where."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}, line {line}: {reason}")
        self.path = path
        self.line = line


def to_jsonable(value: Any, _key: str = "") -> Any:
    """`value` with tensors / numpy values as Python numbers or lists and NaN / inf as None.

    Scalars (0-d tensors and arrays, numpy scalars) keep their kind: a float stays a float, an
    integer an int, a bool a bool. Mappings, lists and tuples are converted recursively; paths
    become strings. Anything else raises TypeError naming the key.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):  # includes numpy.float64, a float subclass
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, f"{_key}.{k}" if _key else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{_key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if callable(getattr(value, "detach", None)):  # torch.Tensor (possibly requiring grad)
        value = value.detach()
    tolist = getattr(value, "tolist", None)  # torch.Tensor, numpy.ndarray, numpy scalars
    if callable(tolist):
        return to_jsonable(tolist(), _key)
    raise TypeError(
        f"cannot log {type(value).__name__} as JSON" + (f" (key {_key!r})" if _key else "")
    )


class JsonlWriter:
    """Append one JSON object per line to `path`, flushed after every write.

    Usable as a context manager (``with JsonlWriter(p) as log: log.write({...})``) or closed
    by hand with :meth:`close`. The file is opened for appending on construction and its
    parent directories are created.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = self.path.open("a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        """Append `record` as one line (converted by :func:`to_jsonable`) and flush it."""
        if not isinstance(record, Mapping):
            raise TypeError(
                f"{self.path}: a JSONL record must be a mapping, got {type(record).__name__}"
            )
        if self._file.closed:
            raise ValueError(f"{self.path}: write to a closed JsonlWriter")
        line = json.dumps(to_jsonable(record), ensure_ascii=False, allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file; further writes raise ValueError. Closing twice is harmless."""
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of a JSONL file, in order; blank lines are ignored.

    Raises:
        FileNotFoundError: if `path` does not exist (the message names it).
        JsonlFormatError: (a ValueError) if a line is not UTF-8, not valid JSON or not a JSON
            object; the message names the file and the 1-based line number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such JSONL file")
    records: list[dict[str, Any]] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise JsonlFormatError(path, number, "not UTF-8 text, so not JSON lines") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise JsonlFormatError(
                    path, number, f"malformed JSON ({exc.msg} at column {exc.colno})"
                ) from None
            if not isinstance(record, dict):
                raise JsonlFormatError(
                    path, number, f"expected a JSON object, got {type(record).__name__}"
                )
            records.append(record)
    return records
