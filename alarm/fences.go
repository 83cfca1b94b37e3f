package alarm

// The notifications of events and of the API have no shard owner: the
// durable consumer hands an event to any replica, and the API runs
// anywhere. They go out under the process's lapsing fences instead
// (dispatch.Lapsing), taken before the state whose notifications they
// are is read. A replica paused longer than half the de-duplication
// window finds its fence gone: the stream refuses what it held
// (dispatch.ErrFenced), the event is not acknowledged and comes again
// (to it or another), and the compare-and-set of its state makes one
// transition and one notification of it. Repeat timers publish under
// their shard's fence (repeat.go).

const (
	// notesScope names the lapsing fences of notifications in the stream.
	notesScope = "notify"
	// maxNoteLanes bounds the subjects a process's lapsing fences spread
	// over (one per worker, up to it).
	maxNoteLanes = 32
)

// beforeNotify calls the BeforeNotify test seam, if set, with the state of
// the first notification st has pending.
func (a *Alarms) beforeNotify(st stored) {
	if a.opts.BeforeNotify == nil || len(st.Pending) == 0 {
		return
	}
	a.opts.BeforeNotify(st.Pending[0].State)
}
