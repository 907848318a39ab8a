# Stream-ordered holds (aclnn_py.runtime.ordered keeps the segments, checkpoints and workspace blocks):
# what a launch or an asynchronous copy uses is appended to its stream's open segment after it was
# queued, and released once the stream has passed it. Appending is one step under the GIL, so no
# boundary (a checkpoint, a synchronisation) can close the segment in between.

cdef dict hold_states = None        # the stream states by stream key
cdef object make_state = None       # state(stream): the stream's state, made when missing
cdef object checkpoint = None       # checkpoint(stream): record an event closing the open segment
cdef object grow_workspace = None   # workspace(stream, size): a block of at least size bytes, its address
cdef Py_ssize_t checkpoint_every = 1
cdef Py_ssize_t states_epoch = 1    # moves on whenever a state leaves hold_states (a stream forgotten)


def bind_holds(*, dict states, make, record_checkpoint, workspace, Py_ssize_t every):
    """aclnn_py.runtime.ordered's parts that the holds use (set when that module is imported)."""
    global hold_states, make_state, checkpoint, grow_workspace, checkpoint_every
    if every < 1:
        raise ValueError("bind_holds: every must be >= 1")
    hold_states, make_state, checkpoint, grow_workspace, checkpoint_every = states, make, record_checkpoint, \
        workspace, every


def states_forgotten():
    """A state left the states (ordered.forget): the states Streams remember are looked up again."""
    global states_epoch
    states_epoch += 1


cdef inline StreamStateBase stream_state(StreamBase stream):
    """`stream`'s state: remembered by the Stream until a state is forgotten (a dict lookup per launch
    and hold otherwise)."""
    if stream.hold_epoch == states_epoch:
        return <StreamStateBase>stream.hold_state
    state = hold_states.get(stream._key)
    if state is None:
        state = make_state(stream)
    stream.hold_state, stream.hold_epoch = state, states_epoch
    return <StreamStateBase>state


cdef int hold(StreamBase stream, object obj) except -1:
    """Keep `obj` alive until `stream` passes the work queued on it so far."""
    return hold_in(stream_state(stream), stream, obj)


cdef int hold_in(StreamStateBase state, StreamBase stream, object obj) except -1:
    """hold() with `stream`'s state at hand."""
    cdef list current = state.current
    current.append(obj)
    if PyList_GET_SIZE(current) >= checkpoint_every:
        checkpoint(stream)
    return 0


def launches_passed(StreamBase stream):
    """A synchronisation of `stream` saw every operator launch queued on it complete (none queued: True).
    Both counts are read in one step under the GIL."""
    state = hold_states.get(stream._key)
    return state is None or (<StreamStateBase>state).launches == (<StreamStateBase>state).launches_passed


def hold_until_passed(StreamBase stream, obj):
    """Keep `obj` alive until `stream` passes the work queued on it so far (ordered.hold)."""
    hold(stream, obj)
