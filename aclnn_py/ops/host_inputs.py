"""The device copies of the host inputs a MoeDistributeBuffer result set's calls were given.

The buffer's operator methods take host arrays as well as device Tensors. A call of a result set copies
such an input into the device Tensor the set keeps for that parameter and shape (made at the first call
with that shape and type; as many shapes per parameter as the set keeps layouts) instead of a new
allocation per call, so a serving loop over host arrays allocates nothing in its steady state, also when
its token count varies among a few values, and the set's executor finds its inputs at the addresses it
bound them to.
The copy is queued on the call's stream behind the set's previous launch, the last reader of the Tensor.
A call on another stream leaves the kept Tensors to the old stream (freed once it has passed the work
queued on it) and makes new ones.
"""

from __future__ import annotations

import numpy as np

from .. import _core
from ..dtypes import DTypeLike
from ..runtime import Stream
from ..tensor import Tensor, device_layout

Key = tuple[str, tuple[int, ...]]  # a parameter and the shape of the host arrays given for it


class HostInputs:
    """One result set's kept device copies of host inputs, by parameter name and host shape, on one
    stream."""

    __slots__ = ("stream", "tensors", "last", "last_dtypes", "ids")

    def __init__(self) -> None:
        self.stream: Stream | None = None
        self.tensors: dict[Key, Tensor] = {}  # oldest first
        # per parameter, the Tensor of its last call, and the numpy dtype of the host arrays whose bytes are
        # that Tensor's as they are (None: the last one needed packing or a dtype override): the steady call
        # (an array like the last one) looks at these only
        self.last: dict[str, Tensor] = {}
        self.last_dtypes: dict[str, np.dtype | None] = {}
        self.ids: set[int] = set()  # id() of each kept Tensor: the compiled result set asks "is an input kept?"

    def on(self, stream: Stream) -> HostInputs:
        """The copies for a call on `stream`: those kept so far when they were made on it, else none."""
        held = self.stream
        if held is None or held._key != stream._key:
            self.release()
        self.stream = stream
        return self

    def upload(self, array: np.ndarray, param: str, dtype: DTypeLike | None = None, rows: int = -1) -> Tensor:
        """`array` (host data as :meth:`Tensor.from_numpy` takes it, with `dtype`) copied into the Tensor
        kept for `param`, a new one when there is none of its shape and type; with `rows` >= 0 only the
        first `rows` rows are copied (an input whose reader reads no other row)."""
        stream = self.stream
        assert stream is not None, "HostInputs.upload before on(stream)"
        kept = self.last.get(param)
        if kept is None or dtype is not None or array.__class__ is not np.ndarray \
                or array.dtype is not self.last_dtypes[param] or array.shape != kept.shape \
                or not array.flags.c_contiguous:
            # not an array like the last one for this input: its device layout, and the Tensor kept for
            # its shape (a new one when there is none of that shape and type)
            key: Key = (param, array.shape if array.__class__ is np.ndarray else np.shape(array))
            array, shape, dt = device_layout(array, dtype)
            kept = self.tensors.get(key)
            if kept is None or kept.dtype is not dt or kept.shape != shape:
                kept = self.keep(key, Tensor.empty(shape, dt))
            self.last[param] = kept
            self.last_dtypes[param] = array.dtype if dtype is None and array.shape == shape else None
        # a kept Tensor is written on its stream only: no other stream's write to wait for
        _core.upload(kept, array if rows < 0 else array[:rows], stream)
        return kept

    def keep(self, key: Key, tensor: Tensor) -> Tensor:
        """`tensor` kept for `key` (instead of the one before), the oldest shape of its parameter let go
        of when the parameter has more than a result set keeps layouts."""
        old = self.tensors.pop(key, None)
        if old is not None:
            self.ids.discard(id(old))
        same = [k for k in self.tensors if k[0] == key[0]]
        if len(same) >= _core.RESULT_SET_LAYOUTS:
            self.ids.discard(id(self.tensors.pop(same[0])))
        self.tensors[key] = tensor
        self.ids.add(id(tensor))
        return tensor

    def release(self) -> None:
        """Let go of the kept Tensors. Their memory stays allocated while work queued so far may use it:
        each copy into one, and each launch or executor that reads one, holds it on its stream."""
        self.stream, self.tensors, self.last, self.last_dtypes, self.ids = None, {}, {}, {}, set()
