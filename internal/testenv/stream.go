package testenv

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/nats-io/nats.go"
)

// StreamMessages returns the messages of the stream whose subjects start with prefix, in
// stream order, each with the time the stream stored it (RawStreamMsg.Time).
func StreamMessages(t testing.TB, nc *nats.Conn, stream, prefix string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	s := waitStream(t, nc, stream)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("testenv: stream %s: %v", stream, err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // removed: a lapsed fence, say
		}
		if err != nil {
			t.Fatalf("testenv: stream %s message %d: %v", stream, seq, err)
		}
		if strings.HasPrefix(m.Subject, prefix) {
			out = append(out, m)
		}
	}
	return out
}

// MaxInWindow returns the most times that fall in any window [t, t+w), and the start of the
// first such window.
func MaxInWindow(times []time.Time, w time.Duration) (n int, at time.Time) {
	ts := slices.Clone(times)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	j := 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= w {
			j++
		}
		if i-j+1 > n {
			n, at = i-j+1, ts[j]
		}
	}
	return n, at
}
