"""One GPU's `nvmlDeviceGetFieldValues` through an array prepared once, and its answer as one tuple.

pynvml's wrapper builds a ctypes array at every call and sets each field id through its structure's
Python-level `__setattr__` (after a TypeError for each id: it first tries an (id, scope) pair); each
member read back goes through a Python-level `__getattribute__` too. A `FieldBatch` keeps, for one set
of field ids, the array pynvml would build (the ids set, the rest zero) and calls the same C function, NVML's
documented `nvmlDeviceGetFieldValues`, in the library pynvml loaded (`pynvml.nvmlLib`), copying that
pristine array over the one NVML writes first (one memmove: every call starts from exactly what pynvml's
would). pynvml has no public call that takes a prepared array; NVML's C function is public API.
`answer` reads every field's value type, return code and value bytes in one struct unpack, so a round in
which nothing changed is one tuple compared (babysit/probes/health.py `read_fields`).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import Any

FIELD_VALUES = "nvmlDeviceGetFieldValues"
_UNSIGNED = {1: "B", 2: "H", 4: "I", 8: "Q"}
# the members of nvmlFieldValue_t a field's answer is: the rest (id, scope, timestamp, latency) is not news
ANSWER_MEMBERS = ("valueType", "nvmlReturn", "value")


class FieldBatch:
    """One set of fields asked of one GPU: their names and ids, and the prepared call where it can be made.

    `fetch(handle)` is None where the library's `nvmlDeviceGetFieldValues` is not pynvml's own over its loaded
    NVML (a stand-in that replaced it) or NVML has no such function: the caller then calls the wrapper by
    name, as before."""

    __slots__ = ("_answer", "array_type", "fetch", "ids", "names")

    def __init__(self, nv: Any, names: Sequence[str], ids: Sequence[int]) -> None:
        self.names = tuple(names)
        self.ids = tuple(ids)
        value_type = getattr(nv, "c_nvmlFieldValue_t", None)
        self.array_type: Any = value_type * len(self.ids) if value_type is not None and self.ids else None
        self._answer = _answer_struct(value_type, len(self.ids)) if self.array_type is not None else None
        self.fetch = _prepared(nv, self.array_type, self.ids) if self.array_type is not None else None

    def answer(self, got: Any) -> tuple[int, ...] | None:
        """Every field's (value type, return code, value bits) of an answer to this batch, flat; None for an
        answer that is not this batch's array (a stand-in's own type)."""
        if self._answer is None or type(got) is not self.array_type:
            return None
        return self._answer.unpack_from(got)


def _answer_struct(value_type: Any, count: int) -> struct.Struct | None:
    """A struct reading ANSWER_MEMBERS of `count` consecutive nvmlFieldValue_t, laid out as ctypes has them."""
    try:
        members = sorted((getattr(value_type, m).offset, getattr(value_type, m).size) for m in ANSWER_MEMBERS)
    except AttributeError:
        return None
    if any(size not in _UNSIGNED for _, size in members):
        return None
    one, at = [], 0
    for offset, size in members:
        one.append(f"{offset - at}x{_UNSIGNED[size]}" if offset > at else _UNSIGNED[size])
        at = offset + size
    stride = ctypes.sizeof(value_type)
    tail = f"{stride - at}x" if stride > at else ""
    return struct.Struct("=" + (("".join(one) + tail) * count))


def _prepared(nv: Any, array_type: Any, ids: Sequence[int]) -> Callable[[Any], Any] | None:
    """`nvmlDeviceGetFieldValues(handle)` for `ids` into one array kept between calls, or None (see FieldBatch).

    Made only where the library's wrapper is pynvml's code over the library's own loaded NVML (`nvmlLib`, a
    ctypes CDLL, set by nvmlInit): calling that library's C function with the prepared array is then what
    the wrapper does. A stand-in that replaced the wrapper keeps its own (and never gets a real NVML
    function for its fake handles)."""
    lib = getattr(nv, "nvmlLib", None)
    wrapper = getattr(nv, FIELD_VALUES, None)
    if lib is None or getattr(wrapper, "__globals__", {}).get("nvmlLib") is not lib:
        return None
    try:
        fn = getattr(lib, FIELD_VALUES)
    except AttributeError:  # not in this NVML: the wrapper says so itself (FUNCTION_NOT_FOUND)
        return None
    fresh = array_type()
    for k, field_id in enumerate(ids):
        fresh[k].fieldId = field_id
    work = array_type()
    count = ctypes.c_int32(len(ids))
    size = ctypes.sizeof(array_type)
    memmove, byref = ctypes.memmove, ctypes.byref
    success, error = nv.NVML_SUCCESS, nv.NVMLError

    def nvmlDeviceGetFieldValues(handle: Any) -> Any:  # named as pynvml's: an error is recorded as before
        memmove(work, fresh, size)
        code = fn(handle, count, byref(work))
        if code != success:
            raise error(code)  # pynvml's NVMLError: the subclass of that code, as its wrapper raises
        return work

    return nvmlDeviceGetFieldValues
