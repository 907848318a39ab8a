# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, auto_pickle=False
# cython: annotation_typing=False
# (auto_pickle off: a copy of a base's C fields would share the handle or descriptor that it releases;
# annotation_typing off: the signatures' annotations document the Python types, they declare no C ones)
"""aclnn_py._core: every hot entry point of aclnn-py, written once (docs/developing.md, "The one route").

* The operator functions, :func:`moe_distribute_dispatch` and :func:`moe_distribute_combine`: one body
  each (``Operator.call``) that takes the steady case — device Tensors, a MoeConfig whose rules passed for
  this shape, given outputs, a Stream — directly, and calls plain Python helpers of aclnn_py.ops only for
  what is rare: uploading host data, allocating outputs, the pre-checks of a new shape, composing errors.
* The plans' ``__call__`` (:class:`Plan`, :class:`DispatchPlan`, :class:`CombinePlan`): called by
  vectorcall, they rebind their executor's slots and launch.
* ``MoeDistributeBuffer.low_latency_dispatch`` / ``low_latency_combine`` (:class:`BufferBase`): the
  buffer's names translated, then one call of the operator body, writing into the buffer's ring of
  result sets.
* The launch every call ends in (:class:`Launcher`), the stream-ordered holds it makes and the
  synchronisation that releases them (:func:`synchronize`), the Tensor and Stream fields they read
  (csrc/_core.pxd) and DLPack.
* The copies between host arrays and device memory (:func:`upload`, :func:`download`): every upload of
  host data and every download goes through them.

The backend's C functions are called through the cffi extension's trampolines, by address
(:func:`bind_backend`).
"""

from __future__ import annotations  # the signatures' annotations stay text: they document, they declare nothing

cimport cython
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t

from .errors import ClosedError, RecycledError, aclnn_error

include "core/bases.pxi"
include "core/holds.pxi"
include "core/launch.pxi"
include "core/copies.pxi"
include "core/zero_pages.pxi"
include "core/waits.pxi"
include "core/operators.pxi"
include "core/results.pxi"
include "core/buffer.pxi"
include "core/plans.pxi"
include "core/dlpack.pxi"
