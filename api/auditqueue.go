package api

import "sync"

// auditQueue holds the records waiting to be kept in Redis and published.
// One worker, started by the first record and gone once the queue is
// empty, takes them in order and in batches: the answer to a call never
// waits for Redis or NATS, the list stays newest first, and no goroutine
// is left behind an idle API.
type auditQueue struct {
	store func([]AuditRecord)
	max   int

	mu      sync.Mutex
	pending []AuditRecord
	running bool
	wg      sync.WaitGroup
}

// auditBatch bounds the records kept and published in one round trip.
const auditBatch = 500

// push queues rec, or says false when max records already wait.
func (q *auditQueue) push(rec AuditRecord) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) >= q.max {
		return false
	}
	q.pending = append(q.pending, rec)
	if !q.running {
		q.running = true
		q.wg.Go(q.run)
	}
	return true
}

func (q *auditQueue) run() {
	for {
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		n := min(len(q.pending), auditBatch)
		batch := q.pending[:n:n]
		q.pending = q.pending[n:]
		q.mu.Unlock()
		q.store(batch)
	}
}

// drain waits until every queued record is stored (or given up on).
func (q *auditQueue) drain() { q.wg.Wait() }
