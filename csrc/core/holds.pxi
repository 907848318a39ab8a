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
cdef object lock_states_fn = None    # ordered's lock's acquire and release: the segments and
cdef object unlock_states_fn = None  # checkpoints change under it
cdef list spare_events = None       # ordered's checkpoint events to record again


def bind_holds(*, dict states, make, record_checkpoint, workspace, Py_ssize_t every, lock, list spare):
    """aclnn_py.runtime.ordered's parts that the holds and synchronisations use (set when that module is
    imported)."""
    global hold_states, make_state, checkpoint, grow_workspace, checkpoint_every, spare_events
    global lock_states_fn, unlock_states_fn
    if every < 1:
        raise ValueError("bind_holds: every must be >= 1")
    hold_states, make_state, checkpoint, grow_workspace, checkpoint_every = states, make, record_checkpoint, \
        workspace, every
    lock_states_fn, unlock_states_fn, spare_events = lock.acquire, lock.release, spare


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


cdef inline int lock_states() except -1:
    lock_states_fn()
    return 0


cdef inline int unlock_states() except -1:
    unlock_states_fn()
    return 0


cdef Py_ssize_t mark_sync(StreamBase stream, Py_ssize_t *launches) except -2:
    """A synchronisation of `stream` begins: the open segment of its holds is closed. Returns that
    segment's number (-1 when the stream holds nothing yet) and sets *launches to the launches queued so
    far."""
    cdef StreamStateBase st
    launches[0] = 0
    lock_states()
    try:
        state = hold_states.get(stream._key)
        if state is None:
            return -1
        st = <StreamStateBase>state
        launches[0] = st.launches
        return st.close_segment()
    finally:
        unlock_states()


cdef int sync_passed(StreamBase stream, Py_ssize_t closed, Py_ssize_t launches) except -1:
    """The synchronisation that closed segment `closed` saw the stream complete: the segments up to it
    are released (dropped after the lock is let go: a dropped hold may run a finalizer that holds
    again), and the checkpoints that closed them are spare."""
    cdef StreamStateBase st
    cdef list released = []
    lock_states()
    try:
        state = hold_states.get(stream._key)
        if state is None:
            return 0
        st = <StreamStateBase>state
        if launches > st.launches_passed:
            st.launches_passed = launches
        st.drop_passed(closed, released)
        checkpoints = st.checkpoints
        while checkpoints and checkpoints[0][1] <= closed:
            spare_events.append(checkpoints.popleft()[0])
    finally:
        unlock_states()
    return 0


def _mark_synchronisation(StreamBase stream):
    """The first step of a synchronisation of `stream` (:func:`synchronize`): its position, (the number of
    the segment closed, the launches queued so far), for :func:`_synchronisation_passed`. For tests (a
    synchronisation of another thread that begins while a launch is being queued)."""
    cdef Py_ssize_t launches = 0
    closed = mark_sync(stream, &launches)
    return closed, launches


def _synchronisation_passed(StreamBase stream, Py_ssize_t closed, Py_ssize_t launches):
    """The last step of a synchronisation of `stream` that began at (`closed`, `launches`)
    (:func:`_mark_synchronisation`): it saw the stream complete. For tests."""
    sync_passed(stream, closed, launches)
