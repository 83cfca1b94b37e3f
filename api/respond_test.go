package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/timer"
)

// TestErrStatus: the one mapping gives a refusal the caller can act on a
// 4xx, wrapped or not, and anything else 503 (a dependency not answering).
func TestErrStatus(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{ingest.ErrEmptyID, http.StatusBadRequest},
		{ingest.ErrReservedID, http.StatusBadRequest},
		{alarm.ErrBadMute, http.StatusBadRequest},
		{shard.ErrBadCursor, http.StatusBadRequest},
		{shard.ErrBadQuery, http.StatusBadRequest},
		{alarm.ErrBadQuery, http.StatusBadRequest},
		{timer.ErrBadPayload, http.StatusBadRequest},
		{alarm.ErrNoAlarm, http.StatusConflict},
		{shard.ErrDraining, http.StatusConflict},
		{errors.New("redis: connection refused"), http.StatusServiceUnavailable},
	} {
		if got := errStatus(fmt.Errorf("op: %w", c.err)); got != c.want {
			t.Errorf("%v: got %d, want %d", c.err, got, c.want)
		}
	}
}

// TestLimit: a listing's limit is 1 to its bound, defaultLimit when absent.
func TestLimit(t *testing.T) {
	for q, want := range map[string]int{"": defaultLimit, "?limit=1": 1, "?limit=1000": 1000, "?limit=0": 0, "?limit=1001": 0, "?limit=x": 0} {
		n, err := limit(httptest.NewRequest(http.MethodGet, "/v1/devices"+q, nil), 1000)
		if n != want || (want == 0) != (err != nil) {
			t.Errorf("%q: got %d, %v, want %d", q, n, err, want)
		}
	}
}
