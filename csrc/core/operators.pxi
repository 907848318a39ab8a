# The operator functions: one body (Operator.call) for every call of dispatch and of combine, every
# generation, whether it comes from the function, a buffer method or a test. The steady case is taken
# here; the rare steps are plain Python helpers of aclnn_py.ops that the operator's module hands over
# (register_operator): uploading host data and applying dtype overrides, allocating outputs (after the
# pre-checks of a new shape), the pre-checks' verdict, the generation's refusals, the launchers.

cdef enum:
    NEWEST = 5   # the generation of the context + cclBufferSize entry points (aclnn_py.ops.generations.NEWEST)


@cython.final
cdef class Operator:
    """Dispatch or combine: its tensors' names, its pre-check key and its Python helpers."""

    cdef readonly str name                 # "dispatch" or "combine"
    cdef readonly tuple input_names, output_names
    cdef Py_ssize_t n_in, n_out
    cdef Py_ssize_t required_inputs        # the leading inputs a call must give
    cdef Py_ssize_t key_input[3]           # the pre-check key (op, BS, H, K): per item (input, dim)
    cdef Py_ssize_t key_dim[3]
    cdef Py_ssize_t launcher_at            # the index of its Launcher in a config's (dispatch, combine)
    cdef object outputs_type               # the tuple type of several outputs; None: one Tensor
    cdef object convert                    # convert(values, dtypes, stream) -> inputs as Tensors / None
    cdef object make_outputs               # make_outputs(config, inputs, given, dtypes, precheck, stream)
    cdef object verdict                    # verdict(config, op, inputs, outputs) -> None | error | C_DECIDES
    cdef object refuse_unsupported         # refuse_unsupported(config, op, given input names)
    cdef object launchers_for              # launchers_for(config) -> (dispatch Launcher, combine Launcher)
    cdef object resolve_config             # resolve_config(config, attrs) -> MoeConfig
    cdef object resolve_stream             # resolve_stream(stream) -> Stream
    cdef object missing                    # None, or (input index, maker) for an input None stands for
    cdef object param_invalid_type         # AclnnParamInvalid
    # the last key built and its dims: a value read and replaced with the GIL held
    cdef tuple last_key
    cdef Py_ssize_t last_dims[3]

    def __init__(self, str name, tuple input_names, tuple output_names, Py_ssize_t required_inputs, tuple key,
                 Py_ssize_t launcher_at, outputs_type, convert, make_outputs, verdict, refuse_unsupported, launchers_for,
                 resolve_config, resolve_stream, missing, param_invalid_type):
        if len(input_names) + len(output_names) > MAX_TENSORS:
            raise ValueError(f"Operator: at most {MAX_TENSORS} tensors")
        self.name, self.input_names, self.output_names = name, input_names, output_names
        self.n_in, self.n_out = len(input_names), len(output_names)
        self.required_inputs = required_inputs
        for k in range(3):
            self.key_input[k], self.key_dim[k] = key[k]
        self.launcher_at = launcher_at
        self.outputs_type = outputs_type
        self.convert, self.make_outputs, self.verdict = convert, make_outputs, verdict
        self.refuse_unsupported, self.launchers_for = refuse_unsupported, launchers_for
        self.resolve_config, self.resolve_stream = resolve_config, resolve_stream
        self.missing, self.param_invalid_type = missing, param_invalid_type

    cdef object call(self, PyObject **values, object config, dict attrs, object outputs, object stream,
                     bint precheck, tuple dtypes, ResultSet into):
        """One call: `values` the inputs in the function's order (borrowed, the caller's), `dtypes` the
        dtype overrides (all None in the steady case), `into` a buffer's result set to write (then
        `outputs` is None). Returns the outputs written."""
        cdef PyObject *ins[MAX_TENSORS]
        cdef PyObject *outs[MAX_TENSORS]
        cdef Py_ssize_t i
        cdef bint plain = True
        cdef bint overridden = False
        cdef TensorBase t
        cdef ConfigBase cfg
        cdef StreamBase s
        # the attributes and the stream
        if attrs or not isinstance(config, ConfigBase):
            config = self.resolve_config(config, attrs if attrs is not None else {})
        cfg = <ConfigBase>config
        if not (isinstance(stream, StreamBase) and (<StreamBase>stream)._open):
            stream = self.resolve_stream(stream)
        s = <StreamBase>stream
        # the inputs: device Tensors as they are, anything else through the operator's module
        for i in range(self.n_in):
            ins[i] = values[i]
            if values[i] != <PyObject *>None and not isinstance(<object>values[i], TensorBase):
                plain = False
        for i in range(PyTuple_GET_SIZE(dtypes)):
            if <object>PyTuple_GET_ITEM(dtypes, i) is not None:
                plain, overridden = False, True
        converted = None
        if not plain:
            # a buffer's call without dtype overrides (which run both phases) uploads into its set's Tensors
            kept = into.host_inputs_on(s) if into is not None and not overridden else None
            converted = self.convert(tuple([<object>values[i] for i in range(self.n_in)]), dtypes, s, kept)
            for i in range(self.n_in):
                ins[i] = <PyObject *>converted[i] if converted[i] is not None else NULL
        else:
            for i in range(self.n_in):
                if ins[i] == <PyObject *>None:
                    ins[i] = NULL
            if self.missing is not None:
                i = self.missing[0]
                if ins[i] == NULL:
                    converted = self.missing[1]()  # kept alive until the call returns
                    ins[i] = <PyObject *>converted
        for i in range(self.required_inputs):
            if ins[i] == NULL and i > 0:  # a required input given None (the context may be: generations 1-4)
                raise TypeError(f"{self.input_names[i]}: expected a Tensor or an array, got None")
        launchers = cfg.launchers
        if launchers is None:
            launchers = cfg.launchers = self.launchers_for(cfg)
        launcher = <Launcher>launchers[self.launcher_at]
        if launcher.generation != NEWEST:
            self.check_generation(cfg, ins)
        # the outputs: the caller's, a result set's, or new ones (after the pre-checks)
        made = None
        if into is not None:
            plan = into.plan_for(self, launcher, cfg, ins, dtypes, precheck, s)
            if plan is not None:  # the steady case of a buffer: the set's executor launched again
                into.launch(<Plan>plan, ins, values, self.n_in, s)
                return into.cur.outputs
            made = into.outputs_for(self, cfg, ins, dtypes, precheck, s)
            fill_outputs(made, outs, self.n_out)
        elif outputs is not None and (type(outputs) is self.outputs_type or isinstance(outputs, TensorBase)) \
                and not self.given_outputs(outputs, outs):
            made = outputs
            if precheck:
                self.precheck(cfg, ins, outs)
            problem = placement_problem(self.input_names, ins, self.n_in, self.output_names, outs, self.n_out, s.dev)
            if problem is not None:
                raise ValueError(problem)
        else:
            made = self.make_outputs(cfg, self.list_of(ins), outputs, dtypes, precheck, s)
            fill_outputs(made, outs, self.n_out)
        launcher.launch(ins, outs, packed_for(cfg, launcher), s, made)
        return made

    cdef bint given_outputs(self, object outputs, PyObject **outs) except -1:
        """The caller's outputs into `outs`: False when every one is a Tensor with a descriptor or None
        (the steady case), True when the operator's module must see them (allocation, checks)."""
        cdef Py_ssize_t j
        if isinstance(outputs, TensorBase):
            if self.n_out != 1:
                return True
            outs[0] = <PyObject *>outputs
            return not (<TensorBase>outputs).desc
        for j in range(self.n_out):
            t = <object>PyTuple_GET_ITEM(outputs, j)
            if t is None:
                outs[j] = NULL
            elif isinstance(t, TensorBase) and (<TensorBase>t).desc:
                outs[j] = <PyObject *>t
            else:
                return True
        return False

    cdef list list_of(self, PyObject **ins):
        return [None if ins[i] == NULL else <object>ins[i] for i in range(self.n_in)]

    cdef int precheck(self, ConfigBase cfg, PyObject **ins, PyObject **outs) except -1:
        """The pre-checked rules of this shape, unless they passed before for this config."""
        cdef Py_ssize_t d[3]
        cdef Py_ssize_t k
        for k in range(3):
            if ins[self.key_input[k]] == NULL:
                break
            shape = (<TensorBase>ins[self.key_input[k]]).shape
            if len(shape) != 2:
                break
            d[k] = shape[self.key_dim[k]]
        else:
            key = self.last_key
            if key is None or d[0] != self.last_dims[0] or d[1] != self.last_dims[1] or d[2] != self.last_dims[2]:
                key = (self.name, d[0], d[1], d[2])
                self.last_dims[0], self.last_dims[1], self.last_dims[2] = d[0], d[1], d[2]
                self.last_key = key
            if key in cfg._passed:
                return 0
        found = self.verdict(cfg, self.name, self.list_of(ins),
                             [None if outs[j] == NULL else <object>outs[j] for j in range(self.n_out)])
        if isinstance(found, self.param_invalid_type):
            raise found
        return 0

    cdef int check_generation(self, ConfigBase cfg, PyObject **ins) except -1:
        """The config's generation has an argument for every input given (remembered per set of inputs)."""
        cdef Py_ssize_t i
        cdef long long mask = 0
        for i in range(self.n_in):
            if ins[i] != NULL:
                mask |= 1LL << i
        key = (self.name, -1, mask)
        if key not in cfg._passed:
            self.refuse_unsupported(cfg, self.name, [self.input_names[i] for i in range(self.n_in) if ins[i] != NULL])
            cfg._passed.add(key)
        return 0


cdef int fill_outputs(object made, PyObject **outs, Py_ssize_t n) except -1:
    """`outs` from outputs the operator's module or a result set gave: one Tensor, or a tuple of Tensors
    and Nones."""
    cdef Py_ssize_t j
    if isinstance(made, TensorBase):
        outs[0] = <PyObject *>made
        return 0
    if not isinstance(made, tuple):
        made = tuple(made)
    for j in range(n):  # PyTuple_GET_ITEM: indexing a NamedTuple goes through a Python-level __getitem__
        t = <object>PyTuple_GET_ITEM(made, j)
        outs[j] = NULL if t is None else <PyObject *>t
    return 0


cdef Operator dispatch_operator = None
cdef Operator combine_operator = None


def register_operator(Operator operator):
    """Install the operator's helpers (its module does, when imported)."""
    global dispatch_operator, combine_operator
    if operator.name == "dispatch":
        dispatch_operator = operator
    elif operator.name == "combine":
        combine_operator = operator
    else:
        raise ValueError(f"register_operator: unknown operator {operator.name!r}")


cdef inline Operator the(Operator operator, str module):
    if operator is None:
        raise RuntimeError(f"aclnn_py.ops.{module} is not imported (import aclnn_py)")
    return operator


def moe_distribute_dispatch(context: Tensor | None, x: TensorArg, expert_ids: TensorArg, *,
                            config: MoeConfig | None = None, scales: TensorArg | None = None,
                            x_active_mask: TensorArg | None = None, expert_scales: TensorArg | None = None,
                            elastic_info: TensorArg | None = None, performance_info: TensorArg | None = None,
                            x_dtype: DTypeLike | None = None, scales_dtype: DTypeLike | None = None,
                            y_dtype: DTypeLike | None = None,
                            outputs: DispatchOutputs | Mapping[str, Tensor | None] | None = None,
                            stream: StreamArg = None, precheck: bool = True,
                            **attrs: int | str) -> DispatchOutputs:
    """Dispatch (``aclnnMoeDistributeDispatch…``, the generation of `config`): phase 1 and phase 2 on
    `stream` (default: the current stream). Returns the seven outputs; each remembers the stream, and
    ``Tensor.numpy()`` waits for it. `config` (or its attributes as keywords: ``ep_world_size=…,
    ep_rank_id=…, moe_expert_num=…, ccl_buffer_size=…``, …) gives the attributes. Inputs are Tensors or
    host arrays (uploaded on the stream); `x_dtype` / `scales_dtype` record the element type of host data
    given as raw codes (HiFloat8, packed fp4, e8m0), `y_dtype` selects expand_x's type. Outputs are
    allocated with the shapes of docs/operators.md unless given (`outputs`: DispatchOutputs, or a mapping
    of output names to Tensors; an output given None is passed as NULL). With `precheck`, the attribute,
    mode, size and window rules are checked in Python first, with the C wording, where phase 1 would reach
    them: the answer is the same either way."""
    cdef PyObject *values[8]
    values[0], values[1], values[2] = <PyObject *>context, <PyObject *>x, <PyObject *>expert_ids
    values[3], values[4], values[5] = <PyObject *>scales, <PyObject *>x_active_mask, <PyObject *>expert_scales
    values[6], values[7] = <PyObject *>elastic_info, <PyObject *>performance_info
    return the(dispatch_operator, "dispatch").call(values, config, attrs, outputs, stream, precheck,
                                                   (x_dtype, scales_dtype, y_dtype), None)


def moe_distribute_combine(context: Tensor | None, expand_x: TensorArg, expert_ids: TensorArg,
                           assist_info_for_combine: TensorArg, ep_send_counts: TensorArg,
                           expert_scales: TensorArg | None = None, *, config: MoeConfig | None = None,
                           tp_send_counts: TensorArg | None = None, x_active_mask: TensorArg | None = None,
                           activation_scale: TensorArg | None = None, weight_scale: TensorArg | None = None,
                           group_list: TensorArg | None = None, expand_scales: TensorArg | None = None,
                           shared_expert_x: TensorArg | None = None, elastic_info: TensorArg | None = None,
                           ori_x: TensorArg | None = None, const_expert_alpha_1: TensorArg | None = None,
                           const_expert_alpha_2: TensorArg | None = None, const_expert_v: TensorArg | None = None,
                           performance_info: TensorArg | None = None, x_out: Tensor | None = None,
                           stream: StreamArg = None, precheck: bool = True, **attrs: int | str) -> Tensor:
    """Combine (``aclnnMoeDistributeCombine…``, the generation of `config`): phase 1 and phase 2 on
    `stream`; returns x_out (``numpy()`` waits for the stream). `expert_scales` None (or a (0,) float32
    tensor) makes combine an unweighted sum. x_out is (BS, H) in expand_x's dtype (bf16 when expand_x is
    int32) unless given. Arguments as :func:`moe_distribute_dispatch`."""
    cdef PyObject *values[19]
    values[0], values[1], values[2] = <PyObject *>context, <PyObject *>expand_x, <PyObject *>expert_ids
    values[3], values[4] = <PyObject *>assist_info_for_combine, <PyObject *>ep_send_counts
    values[5], values[6], values[7] = <PyObject *>expert_scales, <PyObject *>tp_send_counts, <PyObject *>x_active_mask
    values[8], values[9], values[10] = <PyObject *>activation_scale, <PyObject *>weight_scale, <PyObject *>group_list
    values[11], values[12], values[13] = <PyObject *>expand_scales, <PyObject *>shared_expert_x, <PyObject *>elastic_info
    values[14], values[15] = <PyObject *>ori_x, <PyObject *>const_expert_alpha_1
    values[16], values[17] = <PyObject *>const_expert_alpha_2, <PyObject *>const_expert_v
    values[18] = <PyObject *>performance_info
    return the(combine_operator, "combine").call(values, config, attrs, x_out, stream, precheck, NO_DTYPES, None)


cdef tuple NO_DTYPES = (None,)
