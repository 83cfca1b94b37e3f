package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// clientFrom is an HTTP client whose connections come from the loopback
// address ip, so that the server sees several clients.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 64}}
}

// timedGet calls url with token from c and returns the status and how long
// the answer took.
func timedGet(t *testing.T, c *http.Client, url, token string) (int, time.Duration) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return 0, 0
	}
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// goodLatencies times n calls of a good token from 127.0.0.1.
func goodLatencies(t *testing.T, url, token string, n int) []time.Duration {
	c := clientFrom("127.0.0.1")
	var out []time.Duration
	for range n {
		code, d := timedGet(t, c, url, token)
		if code != http.StatusOK {
			t.Errorf("good token: %d", code)
		}
		out = append(out, d)
	}
	return out
}

// TestWrongTokensAreSlowedAlone: 1,000 wrong-token requests from one
// address, 50 at a time, get their answers held back (a few a second, the
// rest 429 at once), while a good token's requests and another address's
// first wrong guess are answered as fast as without them.
func TestWrongTokensAreSlowedAlone(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "viewer")
	const good = "viewer-0123456789abcdef"
	if err := os.WriteFile(f, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	a := New(Options{Config: Config{Tokens: []TokenConfig{{Name: "dash", Role: "viewer", TokenFile: f}}, RequestTimeout: 10 * time.Second},
		Gatherer: reg, Registerer: reg, Now: time.Now})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	url := srv.URL + "/v1/whoami"

	base := goodLatencies(t, url, good, 200)

	const attacks, parallel = 1000, 50
	codes := map[int]int{}
	var attackTimes []time.Duration
	var mu sync.Mutex
	var wg sync.WaitGroup
	attacker := clientFrom("127.0.0.2")
	next := make(chan int)
	start := time.Now()
	for range parallel {
		wg.Go(func() {
			for k := range next {
				code, d := timedGet(t, attacker, url, fmt.Sprintf("guess-%04d-0123456789", k))
				mu.Lock()
				codes[code]++
				attackTimes = append(attackTimes, d)
				mu.Unlock()
			}
		})
	}
	var during []time.Duration
	var other int
	var otherTook time.Duration
	measured := make(chan struct{})
	go func() {
		defer close(measured)
		time.Sleep(200 * time.Millisecond) // the attack is under way
		during = goodLatencies(t, url, good, 200)
		other, otherTook = timedGet(t, clientFrom("127.0.0.3"), url, "typo-0123456789abcdef")
	}()
	for k := range attacks {
		next <- k
	}
	close(next)
	wg.Wait()
	<-measured
	took := time.Since(start)

	t.Logf("attack: %d requests in %v: %v; answer p50 %v, p99 %v", attacks, took.Round(time.Millisecond), codes,
		quantile(attackTimes, 0.5), quantile(attackTimes, 0.99))
	t.Logf("the same attack without the throttle: %d wrong guesses answered 401 in %v", attacks, unthrottled(t, parallel, attacks).Round(time.Millisecond))
	t.Logf("good token: p50 %v, p99 %v alone; p50 %v, p99 %v during the attack", quantile(base, 0.5), quantile(base, 0.99),
		quantile(during, 0.5), quantile(during, 0.99))
	t.Logf("another address's wrong token during the attack: %d in %v", other, otherTook)

	// Slowed: past the free ones, at most one refusal per step, however
	// many come at once; the rest are told to come back later.
	if maxRefused := a.throttle.free + int(took/a.throttle.step) + 1; codes[http.StatusUnauthorized] > maxRefused {
		t.Errorf("%d wrong guesses answered in %v, want at most %d", codes[http.StatusUnauthorized], took, maxRefused)
	}
	if codes[http.StatusUnauthorized]+codes[http.StatusTooManyRequests] != attacks {
		t.Errorf("attack answers %v, want only 401 and 429", codes)
	}
	if p := quantile(attackTimes, 0.99); p < time.Second {
		t.Errorf("the attack's p99 answer came in %v: not held back", p)
	}
	// Nobody else slowed.
	if p, b := quantile(during, 0.5), quantile(base, 0.5); p > 5*b+20*time.Millisecond {
		t.Errorf("good token p50 %v during the attack, %v without it", p, b)
	}
	if other != http.StatusUnauthorized || otherTook > 200*time.Millisecond {
		t.Errorf("another address's wrong token: %d in %v, want 401 at once", other, otherTook)
	}
}

// unthrottled times n wrong-token requests, parallel at a time, against an
// API whose throttle never holds: the rate a guesser would get without it.
func unthrottled(t *testing.T, parallel, n int) time.Duration {
	reg := prometheus.NewRegistry()
	t.Setenv("THROTTLE_TEST_TOKEN", "viewer-0123456789abcdef")
	a := New(Options{Config: Config{Tokens: []TokenConfig{{Name: "dash", Role: "viewer", TokenEnv: "THROTTLE_TEST_TOKEN"}}, RequestTimeout: 10 * time.Second},
		Gatherer: reg, Registerer: reg, Now: time.Now})
	a.throttle.free = n + 1
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	c := clientFrom("127.0.0.2")
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range parallel {
		wg.Go(func() {
			for k := range next {
				if code, _ := timedGet(t, c, srv.URL+"/v1/whoami", fmt.Sprintf("guess-%04d-0123456789", k)); code != http.StatusUnauthorized {
					t.Errorf("unthrottled guess: %d", code)
				}
			}
		})
	}
	for k := range n {
		next <- k
	}
	close(next)
	wg.Wait()
	return time.Since(start)
}
