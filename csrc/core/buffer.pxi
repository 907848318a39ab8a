# MoeDistributeBuffer's operator methods: CANN's Python names translated to the operators' attributes
# (one MoeConfig per distinct set, made by the buffer's _config), then one call of the operator body
# writing into the method's ring of result sets. Errors name the parameters as the caller passed them.

cdef object reraise_in = None   # aclnn_py.ops._caller.reraise, at the first error


cdef int reraise_as_caller(object exc, object names) except -1:
    global reraise_in
    if reraise_in is None:
        from .ops._caller import reraise
        reraise_in = reraise
    reraise_in(exc, names)
    return -1


cdef inline bint same_value(object a, object b):
    """The argument of this call is the last call's: the same object (a loop passes its constants), or
    an equal plain int or str."""
    return a is b or (type(a) is type(b) and (type(a) is int or type(a) is str) and a == b)


cdef Py_ssize_t DISPATCH_RESULT_PICKS[6]   # the dispatch outputs a LowLatencyDispatchResult holds
DISPATCH_RESULT_PICKS[:] = [0, 1, 2, 3, 4, 6]
cdef long long DISPATCH_RESULT_OUTPUTS = 0b1011111  # the same as bits (tp_recv_counts only with a TP domain)
cdef long long ALL_OUTPUTS = -1


cdef object picked(object cls, object items, const Py_ssize_t *picks, Py_ssize_t n):
    """An instance of the NamedTuple class `cls` holding items[picks[0]], …: allocated as the tuple it is
    (tuple.__new__ of a subclass copies an argument tuple through generic checks). `items`: a tuple or
    a tuple subclass."""
    cdef Py_ssize_t j
    result = <object>(<PyTypeObject *>cls).tp_alloc(<void *>cls, n)
    Py_DECREF(result)  # the cast took a reference of its own to the new object
    for j in range(n):
        item = <object>PyTuple_GET_ITEM(items, picks[j])
        Py_INCREF(item)  # PyTuple_SET_ITEM steals one
        PyTuple_SET_ITEM(result, j, item)
    return result


cdef class BufferBase:
    """The compiled part of MoeDistributeBuffer: its communicator, context and configs, the methods'
    rings of result sets, and the two operator methods."""

    cdef public object context          # the int32 context tensor (None: a group-string generation)
    cdef public object comm             # the EP Communicator
    cdef public dict _configs           # config key -> MoeConfig (made by _config)
    cdef ResultRing dispatch_ring, combine_ring
    cdef tuple dispatch_attrs, combine_attrs     # the last call's attribute arguments
    cdef object dispatch_config, combine_config  # their MoeConfigs
    cdef object dispatch_stream, combine_stream  # the last stream checked against the communicator's device
    cdef object dispatch_names, combine_names    # operator name -> the caller's name (errors)
    cdef object result_type                      # LowLatencyDispatchResult
    cdef object current_stream                   # current_stream(): the stream of a call without stream=
    cdef object tp_counts_of                     # with a TP domain: a dispatch result's ep_recv_counts Tensor ->
                                                 # its tp_recv_counts (weakly keyed); None without one

    def _set_up_calls(self, Py_ssize_t result_sets, dispatch_names, combine_names, result_type, current_stream,
                      bint tp_domain, read_rows=None, tuple row_elements=None):
        """Rings of `result_sets` sets per method, and what the methods read (MoeDistributeBuffer.__init__);
        with `tp_domain` combine finds the tp_recv_counts of the dispatch whose ep_recv_counts it is given;
        `read_rows` and `row_elements`: how dispatch's outputs are written row by row (ResultRing)."""
        self.dispatch_ring = ResultRing("low_latency_dispatch", result_sets, read_rows, row_elements)
        self.combine_ring = ResultRing("low_latency_combine", result_sets)
        self.dispatch_names, self.combine_names = dispatch_names, combine_names
        self.result_type, self.current_stream = result_type, current_stream
        if tp_domain:
            from weakref import WeakKeyDictionary
            self.tp_counts_of = WeakKeyDictionary()
        self._forget_calls()

    def _forget_calls(self):
        """Drop the remembered configs and streams and let the result sets go (a new communicator,
        close()): Tensors handed out keep their memory while they live."""
        self.dispatch_attrs = self.combine_attrs = None
        self.dispatch_config = self.combine_config = None
        self.dispatch_stream = self.combine_stream = None
        if self.dispatch_ring is not None:
            self._close_result_plans()
            self.dispatch_ring = ResultRing(self.dispatch_ring.method, self.dispatch_ring.size,
                                            self.dispatch_ring.read_rows, self.dispatch_ring.row_elements)
            self.combine_ring = ResultRing(self.combine_ring.method, self.combine_ring.size)

    def _close_result_plans(self):
        """Let go of the result sets' executors (each once the stream of its last launch has passed it);
        a later call makes new ones."""
        if self.dispatch_ring is not None:
            self.dispatch_ring.close_plans()
            self.combine_ring.close_plans()

    property result_sets:
        """How many result sets each operator method keeps: a result stays valid until that many more
        calls of the same method."""
        def __get__(self):
            return self.dispatch_ring.size

    property held_result_sets:
        """(dispatch, combine): how many result sets hold outputs now."""
        def __get__(self):
            return self.dispatch_ring.held, self.combine_ring.held

    cdef object stream_for(self, object stream, bint combine):
        """The call's Stream, of the communicator's device (checked once per stream)."""
        given = stream
        if stream is None:
            stream = self.current_stream()
        last = self.combine_stream if combine else self.dispatch_stream
        if stream is last and (<StreamBase>stream)._open:
            return stream
        checked = self.comm.stream_for(given)  # None: its message says "the current stream"
        if combine:
            self.combine_stream = checked
        else:
            self.dispatch_stream = checked
        return checked

    def low_latency_dispatch(self, x: TensorArg, topk_idx: TensorArg, num_experts: int, *,
                             quant_mode: int = 0, comm_alg: str = "", x_smooth_scale: TensorArg | None = None,
                             x_active_mask: TensorArg | None = None, topk_weights: TensorArg | None = None,
                             zero_expert_num: int = 0, copy_expert_num: int = 0, const_expert_num: int = 0,
                             elastic_info: TensorArg | None = None, expert_shard_type: int = 0,
                             shared_expert_num: int = 1, shared_expert_rank_num: int = 0,
                             expert_token_nums_type: int = 1, num_max_dispatch_tokens_per_rank: int = 0,
                             y_dtype: DTypeLike | None = None, x_dtype: DTypeLike | None = None,
                             x_smooth_scales_dtype: DTypeLike | None = None, stream: StreamArg = None,
                             keep: bool = False) -> LowLatencyDispatchResult:
        """Dispatch this rank's tokens to the ranks of their experts. Host arrays are uploaded on
        `stream` (default: the current stream) into device Tensors the call's result set keeps (a steady
        loop allocates nothing); the results are device Tensors whose ``numpy()`` waits for the stream. ``global_bs = num_max_dispatch_tokens_per_rank * world_size`` as CANN passes it.

        Results: the six Tensors stay valid until :attr:`result_sets` more calls of this method (two by
        default: a layer-pipelined loop dispatching layer i+1 before it combines layer i); then the
        memory they view holds a later call's result, and reading them raises
        :class:`~aclnn_py.RecycledError`. ``keep=True`` hands out results of their own instead (new
        memory from the pool each call), as does ``clone()`` of one result.

        Ascend950 only: ``y_dtype`` selects expand_x's type (int8, ``DataType.HIFLOAT8``,
        ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2``, ``DataType.FLOAT4_E2M1`` / ``FLOAT4_E1M2`` — a packed
        fp4 expand_x downloads as (A, H/2) bytes); ``x_dtype`` records the element type of a
        low-precision x given as uint8 codes (HiFloat8, or packed fp4 of shape (BS, H/2));
        ``x_smooth_scales_dtype`` that of ``x_smooth_scale`` (e.g. ``DataType.FLOAT8_E8M0`` for per-token
        e8m0 bytes). Each takes a numpy / ml_dtypes dtype or an ``aclnn_py.DataType``."""
        cdef PyObject *values[8]
        cdef tuple last = self.dispatch_attrs
        try:
            cfg = self.dispatch_config
            if last is None or not (same_value(num_experts, last[0]) and same_value(comm_alg, last[1])
                                    and same_value(quant_mode, last[2]) and same_value(zero_expert_num, last[3])
                                    and same_value(copy_expert_num, last[4]) and same_value(const_expert_num, last[5])
                                    and same_value(expert_shard_type, last[6])
                                    and same_value(shared_expert_num, last[7])
                                    and same_value(shared_expert_rank_num, last[8])
                                    and same_value(expert_token_nums_type, last[9])
                                    and same_value(num_max_dispatch_tokens_per_rank, last[10])):
                cfg = self._config("low_latency_dispatch", num_experts=num_experts, comm_alg=comm_alg,
                                   quant_mode=quant_mode, zero_expert_num=zero_expert_num,
                                   copy_expert_num=copy_expert_num, const_expert_num=const_expert_num,
                                   expert_shard_type=expert_shard_type, shared_expert_num=shared_expert_num,
                                   shared_expert_rank_num=shared_expert_rank_num,
                                   expert_token_nums_type=expert_token_nums_type,
                                   num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank)
                self.dispatch_attrs = (num_experts, comm_alg, quant_mode, zero_expert_num, copy_expert_num,
                                       const_expert_num, expert_shard_type, shared_expert_num, shared_expert_rank_num,
                                       expert_token_nums_type, num_max_dispatch_tokens_per_rank)
                self.dispatch_config = cfg
            elif not self.comm._open:
                self.comm.require_open("run low_latency_dispatch")
            s = <StreamBase>self.stream_for(stream, False)
            values[0], values[1], values[2] = <PyObject *>self.context, <PyObject *>x, <PyObject *>topk_idx
            values[3], values[4] = <PyObject *>x_smooth_scale, <PyObject *>x_active_mask
            values[5], values[6], values[7] = <PyObject *>topk_weights, <PyObject *>elastic_info, <PyObject *>None
            into = None if keep else self.dispatch_ring.take()
            made = the(dispatch_operator, "dispatch").call(values, cfg, None, None, s, True,
                                                          (x_dtype, x_smooth_scales_dtype, y_dtype), into)
            out = made if into is None else (<ResultSet>into).hand_out(
                s, DISPATCH_RESULT_OUTPUTS if self.tp_counts_of is None else ALL_OUTPUTS)
            if self.tp_counts_of is not None:  # CANN's six results leave tp_recv_counts out: combine finds it
                self.tp_counts_of[<object>PyTuple_GET_ITEM(out, 4)] = <object>PyTuple_GET_ITEM(out, 5)
            return picked(self.result_type, out, DISPATCH_RESULT_PICKS, 6)
        except Exception as exc:
            reraise_as_caller(exc, self.dispatch_names)

    def low_latency_combine(self, x: TensorArg, topk_idx: TensorArg, topk_weights: TensorArg | None,
                            assist_info_for_combine: TensorArg, ep_send_counts: TensorArg, *,
                            num_experts: int = 0, comm_alg: str = "", comm_quant_mode: int = 0,
                            x_active_mask: TensorArg | None = None, expand_scales: TensorArg | None = None,
                            shared_expert_x: TensorArg | None = None, elastic_info: TensorArg | None = None,
                            ori_x: TensorArg | None = None, const_expert_alpha_1: TensorArg | None = None,
                            const_expert_alpha_2: TensorArg | None = None,
                            const_expert_v: TensorArg | None = None, zero_expert_num: int = 0,
                            copy_expert_num: int = 0, const_expert_num: int = 0,
                            expert_shared_type: int = 0, shared_expert_num: int = 1,
                            shared_expert_rank_num: int = 0, num_max_dispatch_tokens_per_rank: int = 0,
                            tp_send_counts: TensorArg | None = None, stream: StreamArg = None,
                            keep: bool = False) -> Tensor:
        """Send the expert outputs `x` back to the tokens' ranks and reduce them per token, weighted by
        `topk_weights` (None: an unweighted sum). Returns x_out (BS, H) as a device Tensor, valid until
        :attr:`result_sets` more calls of this method (``keep=True``: one of its own).
        `expert_shared_type` is CANN's spelling of the operator's expert_shard_type.

        With a TP domain (``tp_comm``) combine needs the dispatch's tp_recv_counts, which CANN's six
        results leave out: given the ep_recv_counts of this buffer's dispatch result as `ep_send_counts`,
        the buffer passes that dispatch's tp_recv_counts itself; `tp_send_counts` gives them explicitly."""
        cdef PyObject *values[19]
        cdef Py_ssize_t i
        cdef tuple last = self.combine_attrs
        try:
            if assist_info_for_combine is None or ep_send_counts is None:
                raise ValueError("low_latency_combine: assist_info_for_combine and ep_send_counts are required "
                                 "(pass the dispatch outputs)")
            cfg = self.combine_config
            if last is None or not (same_value(num_experts, last[0]) and same_value(comm_alg, last[1])
                                    and same_value(comm_quant_mode, last[2]) and same_value(zero_expert_num, last[3])
                                    and same_value(copy_expert_num, last[4]) and same_value(const_expert_num, last[5])
                                    and same_value(expert_shared_type, last[6])
                                    and same_value(shared_expert_num, last[7])
                                    and same_value(shared_expert_rank_num, last[8])
                                    and same_value(num_max_dispatch_tokens_per_rank, last[9])):
                cfg = self._config("low_latency_combine", num_experts=num_experts, comm_alg=comm_alg,
                                   comm_quant_mode=comm_quant_mode, zero_expert_num=zero_expert_num,
                                   copy_expert_num=copy_expert_num, const_expert_num=const_expert_num,
                                   expert_shared_type=expert_shared_type, shared_expert_num=shared_expert_num,
                                   shared_expert_rank_num=shared_expert_rank_num,
                                   num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank)
                self.combine_attrs = (num_experts, comm_alg, comm_quant_mode, zero_expert_num, copy_expert_num,
                                      const_expert_num, expert_shared_type, shared_expert_num, shared_expert_rank_num,
                                      num_max_dispatch_tokens_per_rank)
                self.combine_config = cfg
            elif not self.comm._open:
                self.comm.require_open("run low_latency_combine")
            s = <StreamBase>self.stream_for(stream, True)
            if tp_send_counts is None and self.tp_counts_of is not None:
                tp_send_counts = self.tp_counts_of.get(ep_send_counts) if isinstance(ep_send_counts, TensorBase) \
                    else None
                if tp_send_counts is None:
                    raise ValueError("tp_send_counts: combine in a TP domain needs the tp_recv_counts of the dispatch "
                                     "it answers; pass as ep_send_counts the ep_recv_counts Tensor of this buffer's "
                                     "low_latency_dispatch result, or pass tp_send_counts")
            for i in range(19):
                values[i] = <PyObject *>None
            values[0], values[1], values[2] = <PyObject *>self.context, <PyObject *>x, <PyObject *>topk_idx
            values[3], values[4] = <PyObject *>assist_info_for_combine, <PyObject *>ep_send_counts
            values[5], values[6], values[7] = <PyObject *>topk_weights, <PyObject *>tp_send_counts, \
                <PyObject *>x_active_mask
            values[11], values[12], values[13] = <PyObject *>expand_scales, <PyObject *>shared_expert_x, \
                <PyObject *>elastic_info
            values[14], values[15] = <PyObject *>ori_x, <PyObject *>const_expert_alpha_1
            values[16], values[17] = <PyObject *>const_expert_alpha_2, <PyObject *>const_expert_v
            into = None if keep else self.combine_ring.take()
            made = the(combine_operator, "combine").call(values, cfg, None, None, s, True, NO_DTYPES, into)
            return made if into is None else (<ResultSet>into).hand_out(s, 1)[0]
        except Exception as exc:
            reraise_as_caller(exc, self.combine_names)
