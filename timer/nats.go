package timer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// consume stores the resets published on sigwatch.timers.set.<queue> until
// ctx is done. A message is acknowledged only once every reset it holds is
// stored (or refused as malformed, and dead-lettered); one that cannot be
// stored is handed out again after a second.
func (s *Service) consume(ctx context.Context) error {
	return s.pub.ConsumeTimerResets(ctx, s.opts.AckWait, s.batching(), s.storeMsgs)
}

// consumers is how many batches of resets one process stores at once.
const consumers = 4

// batching is how resets from NATS are taken: Fetch messages at once,
// consumers batches at a time.
func (s *Service) batching() dispatch.Batching {
	return dispatch.Batching{Size: s.opts.Fetch, Workers: consumers, Warn: s.warnOnce}
}

// storeMsgs stores the resets of msgs as one batch; an error hands the
// messages back to be delivered again.
func (s *Service) storeMsgs(ctx context.Context, msgs []dispatch.TimerMsg) error {
	now := s.opts.Now()
	var (
		rs  []shard.TimerReset
		bad []dispatch.Message
	)
	prefix := strings.TrimSuffix(s.pub.Subjects().AllTimerSet(), ">")
	for _, m := range msgs {
		queue := strings.TrimPrefix(m.Subject, prefix)
		reqs, err := decodeResets(m.Data)
		if err != nil {
			bad = append(bad, s.invalid(m, 0, "bad_json", err, now))
			continue
		}
		for j, r := range reqs {
			t, err := s.opts.Limits.Reset(queue, r.ID, r, now)
			if err != nil {
				bad = append(bad, s.invalid(m, j, reason(err), err, now))
				continue
			}
			rs = append(rs, t)
		}
	}
	if err := s.Reset(ctx, rs); err != nil {
		if ctx.Err() == nil {
			s.warnOnce("timer resets from NATS not stored; delivered again", err)
		}
		return err
	}
	s.Stored("nats", len(rs))
	if len(bad) > 0 {
		// Dead-lettered best effort: the resets beside them are stored.
		_ = s.pub.Publish(ctx, bad)
	}
	return nil
}

// decodeResets reads one reset object or an array of them.
func decodeResets(b []byte) ([]Request, error) {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var rs []Request
		err := json.Unmarshal(b, &rs)
		return rs, err
	}
	var r Request
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return []Request{r}, nil
}

// reason is the invalid event's reason for a refused reset.
func reason(err error) string {
	switch {
	case errors.Is(err, ErrBadQueue):
		return "bad_queue"
	case errors.Is(err, ErrBadPayload):
		return "bad_payload"
	}
	return "bad_timer"
}

// invalid is the dead-letter event of reset j of m, with an id from the
// message's stream sequence so that a redelivery is stored once.
func (s *Service) invalid(m dispatch.TimerMsg, j int, why string, err error, now time.Time) dispatch.Message {
	s.m.invalid.WithLabelValues(why).Inc()
	id := "timers/" + strconv.Itoa(j)
	if seq := m.Seq(); seq != 0 {
		id = "timers/" + strconv.FormatUint(seq, 10) + "/" + strconv.Itoa(j)
	}
	ev := dispatch.NewInvalid(id, why+": "+err.Error(), m.Subject, m.Data, now.UnixMilli())
	msg, _ := dispatch.Encode(s.pub.Subjects(), ev)
	return msg
}
