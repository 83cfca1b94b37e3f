package api

import (
	"encoding/json"
	"strings"
	"time"

	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
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

// TestPlainErrors: a wrapped error reaches the API's callers without the
// package names the logs keep.
func TestPlainErrors(t *testing.T) {
	for in, want := range map[string]string{
		"shard: list: read registry: dial tcp 127.0.0.1:6379: connect: connection refused": "list: read registry: dial tcp 127.0.0.1:6379: connect: connection refused",
		"timer: reset: dispatch: publish x: nats: timeout":                                 "reset: publish x: nats: timeout",
		"ingest: signals: context canceled":                                                "signals: context canceled",
		"bad timer: give after or at":                                                      "bad timer: give after or at",
		"device id is empty":                                                               "device id is empty",
	} {
		if got := plain(errors.New(in)); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
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

// TestRefusalsSpeakJSON: an unknown route is a JSON 404 naming it, a
// wrong method a JSON 405 naming the methods there are, and a body field
// the route does not take is named in the 400.
func TestRefusalsSpeakJSON(t *testing.T) {
	srv := httptest.NewServer(New(Options{Gatherer: prometheus.NewRegistry(), Now: time.Now}).Handler())
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"GET", "/v1/foo", "", http.StatusNotFound, "no route GET /v1/foo"},
		{"GET", "/nope", "", http.StatusNotFound, "no route GET /nope"},
		{"DELETE", "/v1/stats", "", http.StatusMethodNotAllowed, "DELETE is not allowed on /v1/stats: use GET, HEAD"},
		{"GET", "/v1/devices/d1/threshold", "", http.StatusMethodNotAllowed, "GET is not allowed on /v1/devices/d1/threshold: use PUT"},
		{"PUT", "/v1/devices/d1/threshold", `{"tresh": "90s"}`, http.StatusBadRequest, `unknown field "tresh": body must be {"threshold": "90s"}`},
		{"PUT", "/v1/devices/d1/threshold", `{"threshold": 90}`, http.StatusBadRequest, `field "threshold" cannot be a JSON number`},
		{"PUT", "/v1/devices/d1/threshold", `{"threshold": `, http.StatusBadRequest, `the body is not valid JSON`},
		{"PUT", "/v1/devices/d1/group", `{"grp": "g"}`, http.StatusBadRequest, `unknown field "grp"`},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error string }
		decErr := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.code || decErr != nil || !strings.Contains(e.Error, c.want) ||
			resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s %s: got %d %s %q (%v), want %d application/json naming %q", c.method, c.path, c.body,
				resp.StatusCode, resp.Header.Get("Content-Type"), e.Error, decErr, c.code, c.want)
		}
	}
}
