package servers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// AlertmanagerOptions configures StartAlertmanager.
type AlertmanagerOptions struct {
	// ResolveTimeout is the config's global resolve_timeout: how long an alert sent without
	// endsAt stays active unless sent again. 0 keeps Alertmanager's default, 5m.
	ResolveTimeout time.Duration
	// Port is the port to listen on; 0 picks a free one (and another if it is taken meanwhile).
	Port int
}

// Alertmanager is a Prometheus Alertmanager child process listening on 127.0.0.1, alone (no
// cluster), with one receiver that sends nowhere: what a test needs to see which alerts it holds.
type Alertmanager struct {
	Addr string // host:port
	URL  string // http://host:port
	Dir  string // working directory: alertmanager.yml, data/, alertmanager.log

	child // the current run; serialises Kill, Stop and Restart
	bin   string
	port  int
	opts  AlertmanagerOptions
}

// StartAlertmanager writes dir/alertmanager.yml, starts Alertmanager (Debian's
// prometheus-alertmanager, or alertmanager) with it on a free port of 127.0.0.1 and returns once
// GET /-/ready answers 200.
func StartAlertmanager(dir string, opts AlertmanagerOptions) (*Alertmanager, error) {
	bin, err := LookPath("prometheus-alertmanager", "alertmanager")
	if err != nil {
		// Only the tests need it, so `make deps` does not install it.
		return nil, fmt.Errorf("prometheus-alertmanager not found: run `make test-deps` (deploy/local/install.sh --browser): %w", exec.ErrNotFound)
	}
	if dir, err = prepareDir(dir); err != nil {
		return nil, fmt.Errorf("servers: alertmanager dir: %w", err)
	}
	a := &Alertmanager{Dir: dir, child: child{name: "alertmanager"}, bin: bin, opts: opts}
	if err := a.writeConf(); err != nil {
		return nil, fmt.Errorf("servers: start alertmanager: %w", err)
	}
	start := onFreePort
	if opts.Port != 0 {
		start = func(f func(int) error) error { return f(opts.Port) }
	}
	if err := start(a.start); err != nil {
		return nil, fmt.Errorf("servers: start alertmanager: %w", err)
	}
	return a, nil
}

// LogPath is the file Alertmanager writes its log to.
func (a *Alertmanager) LogPath() string { return filepath.Join(a.Dir, "alertmanager.log") }

func (a *Alertmanager) confPath() string { return filepath.Join(a.Dir, "alertmanager.yml") }

func (a *Alertmanager) writeConf() error {
	var b strings.Builder
	b.WriteString("# Written by sigwatch internal/servers for a test.\n")
	if a.opts.ResolveTimeout > 0 {
		fmt.Fprintf(&b, "global:\n  resolve_timeout: %dms\n", a.opts.ResolveTimeout.Milliseconds())
	}
	// A receiver with no integrations: alerts are held and shown, never sent.
	b.WriteString("route:\n  receiver: nowhere\nreceivers:\n  - name: nowhere\n")
	return os.WriteFile(a.confPath(), []byte(b.String()), 0o644)
}

// start runs Alertmanager on port and waits until it is ready. The caller holds a.mu or owns a
// alone.
func (a *Alertmanager) start(port int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{
		"--config.file=" + a.confPath(),
		"--storage.path=" + filepath.Join(a.Dir, "data"),
		"--web.listen-address=" + addr,
		"--cluster.listen-address=", // alone: no gossip port
	}
	p, err := startProcess(a.bin, args, a.Dir, a.LogPath())
	if err != nil {
		return err
	}
	url := "http://" + addr
	if err := p.waitReady(func() error { return httpOK(url + "/-/ready") }); err != nil {
		return err
	}
	a.cmd, a.port, a.Addr, a.URL = p, port, addr, url
	return nil
}

// Kill stops Alertmanager with SIGKILL. It keeps alerts in memory only, so they are gone after
// Restart.
func (a *Alertmanager) Kill() error { return a.child.kill() }

// Stop asks Alertmanager to shut down (SIGTERM) and waits; it kills it after 5s.
func (a *Alertmanager) Stop() error { return a.child.stop() }

// Restart starts Alertmanager again on the same port and directory.
func (a *Alertmanager) Restart() error {
	return a.child.restart(func() error { return a.start(a.port) })
}

// AlertmanagerAlert is an alert as Alertmanager's API v2 shows or takes it.
type AlertmanagerAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
	StartsAt    time.Time         `json:"startsAt,omitzero"`
	EndsAt      time.Time         `json:"endsAt,omitzero"`
	UpdatedAt   time.Time         `json:"updatedAt,omitzero"`
	Status      struct {
		State string `json:"state"` // active, suppressed, unprocessed
	} `json:"status,omitzero"`
}

// Alerts returns the alerts Alertmanager holds and has not resolved (GET /api/v2/alerts).
func (a *Alertmanager) Alerts() ([]AlertmanagerAlert, error) {
	var out []AlertmanagerAlert
	resp, err := httpClient.Get(a.URL + "/api/v2/alerts")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("alertmanager: GET /api/v2/alerts: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("alertmanager: GET /api/v2/alerts: %w", err)
	}
	return out, nil
}

// PostAlerts sends alerts (POST /api/v2/alerts), as a client of Alertmanager does.
func (a *Alertmanager) PostAlerts(alerts ...AlertmanagerAlert) error {
	body, err := json.Marshal(alerts)
	if err != nil {
		return err
	}
	resp, err := httpClient.Post(a.URL+"/api/v2/alerts", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("alertmanager: POST /api/v2/alerts: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// httpClient is for the short requests this package makes of the servers it starts. It keeps no
// idle connections, which would outlive a test as goroutines.
var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// httpOK reports whether GET url answers 200.
func httpOK(url string) error {
	resp, err := httpClient.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
