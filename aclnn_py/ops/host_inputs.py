"""The device copies of the host inputs a MoeDistributeBuffer result set's calls were given.

The buffer's operator methods take host arrays as well as device Tensors. A call of a result set copies
such an input into the device Tensor the set keeps for that parameter (made at the first call with that
shape and type) instead of a new allocation per call, so a serving loop over host arrays allocates
nothing in its steady state, and the set's executor finds its inputs at the addresses it bound them to.
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


class HostInputs:
    """One result set's kept device copies of host inputs, by parameter name, on one stream."""

    __slots__ = ("stream", "tensors", "host_dtypes")

    def __init__(self) -> None:
        self.stream: Stream | None = None
        self.tensors: dict[str, Tensor] = {}  # the compiled result set reads it (is an input one of them?)
        # per parameter, the numpy dtype of the host arrays whose bytes are the kept Tensor's as they are
        # (None: the last one needed packing or a dtype override)
        self.host_dtypes: dict[str, np.dtype | None] = {}

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
        kept = self.tensors.get(param)
        if kept is None or dtype is not None or array.__class__ is not np.ndarray \
                or array.dtype is not self.host_dtypes[param] or array.shape != kept.shape \
                or not array.flags.c_contiguous:
            # not an array like the last one for this input: its device layout, a new Tensor when it differs
            array, shape, dt = device_layout(array, dtype)
            if kept is None or kept.dtype is not dt or kept.shape != shape:
                kept = self.tensors[param] = Tensor.empty(shape, dt)
            self.host_dtypes[param] = array.dtype if dtype is None and array.shape == shape else None
        # a kept Tensor is written on its stream only: no other stream's write to wait for
        _core.upload(kept, array if rows < 0 else array[:rows], stream)
        return kept

    def release(self) -> None:
        """Let go of the kept Tensors. Their memory stays allocated while work queued so far may use it:
        each copy into one, and each launch or executor that reads one, holds it on its stream."""
        self.stream, self.tensors, self.host_dtypes = None, {}, {}
