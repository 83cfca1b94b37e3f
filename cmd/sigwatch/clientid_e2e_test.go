package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/stats"
)

// TestDuplicateClientIDRefused: a second process with a client id a live
// process holds refuses to start, naming the holder by the id it shows
// everywhere (its stats report, its shard leases, its writer report, its
// start line); once the holder is killed, a new process with the id starts
// after at most the claim's lapse.
func TestDuplicateClientIDRefused(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	same := []string{"SIGWATCH_MQTT_CLIENT_ID=sigwatch-dup", "SIGWATCH_SHARDS_INITIAL=4"}
	first := startProc(t, env, "first", append(same, "SIGWATCH_HTTP_ADDR="+addr)...)
	id := startedAs(t, first, "sigwatch-dup")

	// One id wherever the process is shown.
	testenv.WaitFor(t, 15*time.Second, "the process's report, leases and writer report", func() bool {
		var st stats.View
		var sh api.Shards
		if getJSON("http://"+addr+"/v1/stats", &st) != nil || getJSON("http://"+addr+"/v1/shards", &sh) != nil ||
			len(st.Processes) != 1 || len(sh.Drain.Writers) == 0 {
			return false
		}
		names := []string{st.Processes[0].Name}
		for _, w := range sh.Drain.Writers {
			// The generic timers write as a writer of their own.
			names = append(names, strings.TrimPrefix(w.Name, "timers-"))
		}
		for _, s := range sh.List {
			names = append(names, s.Owner)
			if s.TimersOwner != "" {
				names = append(names, s.TimersOwner)
			}
		}
		for _, n := range names {
			if n != id {
				t.Logf("shown as %q, started as %q", n, id)
				return false
			}
		}
		return true
	})

	// Bounded: a second process that started would otherwise run on.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "run")
	cmd.Env = append(os.Environ(), "SIGWATCH_REDIS_ADDRS="+env.Redis.Addr, "SIGWATCH_NATS_URL="+env.NATS.URL,
		"SIGWATCH_MQTT_BROKERS="+env.Mosquitto.URL, "SIGWATCH_HTTP_ADDR="+freeAddr(t), "SIGWATCH_MQTT_CLIENT_ID=sigwatch-dup")
	out, err := cmd.CombinedOutput()
	want := "sigwatch: mqtt.client_id sigwatch-dup is in use by process " + id + ": set SIGWATCH_MQTT_CLIENT_ID"
	if err == nil || cmd.ProcessState.ExitCode() == 0 || !strings.Contains(string(out), want) {
		t.Fatalf("second process: %v, output:\n%s\nwant a non-zero exit and %q", err, out, want)
	}
	if !strings.Contains(first.logText(), "sigwatch started") || strings.Contains(first.logText(), "lost MQTT connection") {
		t.Errorf("the first process was disturbed by the second:\n%s", tail(first.logText(), 2000))
	}

	// A killed holder does not release its claim: the next process waits
	// for it to lapse, and starts (it would be refused after ClaimTTL and
	// a renewal period).
	first.kill()
	killed := time.Now()
	next := startProc(t, env, "next", same...)
	startedAs(t, next, "sigwatch-dup")
	t.Logf("the next process started %v after the kill", time.Since(killed))
	if !strings.Contains(next.logText(), "waiting for its claim to lapse") {
		t.Errorf("the next process started without waiting for the killed one's claim to lapse")
	}
}

var startLine = regexp.MustCompile(`msg="sigwatch started" process=(\S+) mqtt_client_id=(\S+)`)

// startedAs waits for p's start line, checks it names clientID, and
// returns the process id it shows.
func startedAs(t *testing.T, p *proc, clientID string) string {
	t.Helper()
	var m []string
	testenv.WaitFor(t, ingest.ClaimTTL+20*time.Second, "the start line", func() bool {
		m = startLine.FindStringSubmatch(p.logText())
		return m != nil
	})
	if m[2] != clientID {
		t.Errorf("start line names mqtt client id %q, want %q", m[2], clientID)
	}
	return m[1]
}

func (p *proc) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func getJSON(url string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
