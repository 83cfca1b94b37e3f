package timer

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// Reply is the answer to a reset request on <prefix>.timers.reset.<queue>:
// Stored resets on success; otherwise Status (400: the request is refused
// and nothing of it is stored, 503: try again) and Error.
type Reply struct {
	Stored int    `json:"stored,omitempty"`
	Status int    `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
}

// serveRequests stores the resets of the requests on
// <prefix>.timers.reset.<queue> and answers each once its resets are stored
// in Redis: one broker round trip per request, with no stream in between,
// for a service that sends one reset per message and wants it acknowledged
// only once stored. Requests arriving together are stored as one batch, by
// consumers workers at once. A request with one bad reset is refused whole.
func (s *Service) serveRequests(ctx context.Context) error {
	return s.pub.ServeTimerResets(ctx, s.batching(), s.answer)
}

// answer stores the resets of reqs as one batch and answers each request.
func (s *Service) answer(ctx context.Context, reqs []dispatch.Request) {
	now := s.opts.Now()
	prefix := strings.TrimSuffix(s.pub.Subjects().AllTimerReset(), ">")
	var (
		rs   []shard.TimerReset
		good []int // index in reqs of each request stored
		n    []int // resets of each of them
	)
	for k, req := range reqs {
		queue := strings.TrimPrefix(req.Subject, prefix)
		got, err := decodeResets(req.Data)
		if err != nil {
			s.m.invalid.WithLabelValues("bad_json").Inc()
			respond(req, Reply{Status: http.StatusBadRequest, Error: "bad_json: " + err.Error()})
			continue
		}
		ts := make([]shard.TimerReset, 0, len(got))
		for j, r := range got {
			t, err := s.opts.Limits.Reset(queue, r.ID, r, now)
			if err != nil {
				s.m.invalid.WithLabelValues(reason(err)).Inc()
				msg := reason(err) + ": " + err.Error()
				if len(got) > 1 {
					msg = reason(err) + ": reset " + strconv.Itoa(j) + ": " + err.Error()
				}
				respond(req, Reply{Status: http.StatusBadRequest, Error: msg})
				ts = nil
				break
			}
			ts = append(ts, t)
		}
		if ts == nil {
			continue
		}
		rs = append(rs, ts...)
		good, n = append(good, k), append(n, len(ts))
	}
	if len(good) == 0 {
		return
	}
	if err := s.Reset(ctx, rs); err != nil {
		if ctx.Err() == nil {
			s.warnOnce("timer reset requests not stored; refused with 503", err)
		}
		for _, k := range good {
			respond(reqs[k], Reply{Status: http.StatusServiceUnavailable, Error: err.Error()})
		}
		return
	}
	s.Stored("request", len(rs))
	for j, k := range good {
		respond(reqs[k], Reply{Stored: n[j]})
	}
}

// respond answers a request; a requester that gave up is no one's loss.
func respond(req dispatch.Request, r Reply) {
	b, _ := json.Marshal(r)
	_ = req.Respond(b)
}
