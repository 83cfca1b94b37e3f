package check

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// compose is the part of the Compose specification deploy/compose uses;
// decoding with KnownFields refuses any key outside it, so a typo or a key
// this test does not check fails.
type compose struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]*composeVolume `yaml:"volumes"`
}

type composeVolume struct {
	Driver string `yaml:"driver"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Hostname    string            `yaml:"hostname"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test        []string `yaml:"test"`
		Interval    string   `yaml:"interval"`
		Timeout     string   `yaml:"timeout"`
		Retries     int      `yaml:"retries"`
		StartPeriod string   `yaml:"start_period"`
	} `yaml:"healthcheck"`
	StopGracePeriod string `yaml:"stop_grace_period"`
	Restart         string `yaml:"restart"`
}

var composeDir = filepath.Join(repoRoot, "deploy", "compose")

func loadCompose(t *testing.T) compose {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(composeDir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var c compose
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return c
}

// interpolate resolves ${VAR}, ${VAR:-default} and ${VAR:?message} as
// Compose does, from vars; a required variable missing is an error.
var interpolation = regexp.MustCompile(`\$\{([A-Z_][A-Z0-9_]*)(?::([?-])([^}]*))?\}`)

func interpolate(t *testing.T, s string, vars map[string]string) string {
	t.Helper()
	return interpolation.ReplaceAllStringFunc(s, func(m string) string {
		g := interpolation.FindStringSubmatch(m)
		if v, ok := vars[g[1]]; ok && v != "" {
			return v
		}
		switch g[2] {
		case "-":
			return g[3]
		case "?":
			t.Errorf("%s is required: %s", g[1], g[3])
		}
		return ""
	})
}

// TestComposeFile decodes deploy/compose/compose.yaml strictly and checks
// what docker compose config would, and what sigwatch needs of it: every
// reference resolves, Redis keeps an append-only file, NATS runs
// JetStream on a volume, Mosquitto keeps sigwatch's settings, and two
// sigwatch replicas share one MQTT group, each with its own client id, with
// a config that sigwatch itself accepts.
func TestComposeFile(t *testing.T) {
	c := loadCompose(t)
	for _, want := range []string{"redis", "mosquitto", "nats", "sigwatch-1", "sigwatch-2"} {
		if _, ok := c.Services[want]; !ok {
			t.Errorf("no service %s", want)
		}
	}
	published := map[string]string{}
	var replicas []string
	for name, s := range c.Services {
		if s.Image == "" && s.Build == nil {
			t.Errorf("%s: neither image nor build", name)
		}
		if s.Build != nil {
			ctx := filepath.Join(composeDir, s.Build.Context)
			if _, err := os.Stat(filepath.Join(ctx, s.Build.Dockerfile)); err != nil {
				t.Errorf("%s: build: %v", name, err)
			}
		}
		for dep, d := range s.DependsOn {
			target, ok := c.Services[dep]
			switch {
			case !ok:
				t.Errorf("%s depends on %s, which is not a service", name, dep)
			case !slices.Contains([]string{"service_started", "service_healthy", "service_completed_successfully"}, d.Condition):
				t.Errorf("%s depends on %s with condition %q", name, dep, d.Condition)
			case d.Condition == "service_healthy" && target.Healthcheck == nil:
				t.Errorf("%s waits for %s to be healthy, which has no healthcheck", name, dep)
			}
		}
		if s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 || s.Healthcheck.Test[0] != "CMD" {
			t.Errorf("%s: want a healthcheck [CMD, ...]", name)
		}
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				t.Errorf("%s: volume %q: want source:target", name, v)
				continue
			}
			src := parts[0]
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				if _, err := os.Stat(filepath.Join(composeDir, src)); err != nil {
					t.Errorf("%s: bind mount %s: %v", name, src, err)
				}
			} else if _, ok := c.Volumes[src]; !ok {
				t.Errorf("%s: volume %s is not declared under volumes", name, src)
			}
		}
		for _, p := range s.Ports {
			host, _, ok := strings.Cut(p, ":")
			if !ok || host == "" {
				t.Errorf("%s: port %q: want host:container", name, p)
				continue
			}
			if other, dup := published[host]; dup {
				t.Errorf("host port %s published by %s and %s", host, other, name)
			}
			published[host] = name
		}
		if strings.HasPrefix(name, "sigwatch") {
			replicas = append(replicas, name)
		}
	}

	// Redis: AOF on a volume.
	redis := c.Services["redis"]
	if cmd := strings.Join(redis.Command, " "); !strings.Contains(cmd, "--appendonly yes") {
		t.Errorf("redis command %q: want --appendonly yes", cmd)
	}
	if !slices.ContainsFunc(redis.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/data") }) {
		t.Errorf("redis volumes %v: want a volume at /data", redis.Volumes)
	}
	// NATS: JetStream, its store on a volume.
	nats := c.Services["nats"]
	if cmd := strings.Join(nats.Command, " "); !strings.Contains(cmd, "-js") || !strings.Contains(cmd, "-sd /data") {
		t.Errorf("nats command %q: want -js -sd /data", cmd)
	}
	if !slices.ContainsFunc(nats.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/data") }) {
		t.Errorf("nats volumes %v: want a volume at /data", nats.Volumes)
	}
	// Mosquitto: its config mounted, with the settings of deploy/local/mosquitto.conf
	// that keep it from dropping signals, and persistence on a volume.
	mq := c.Services["mosquitto"]
	if !slices.Contains(mq.Volumes, "./mosquitto.conf:/mosquitto/config/mosquitto.conf:ro") {
		t.Errorf("mosquitto volumes %v: want ./mosquitto.conf mounted as its config", mq.Volumes)
	}
	conf := mosquittoSettings(t, filepath.Join(composeDir, "mosquitto.conf"))
	local := mosquittoSettings(t, filepath.Join(repoRoot, "deploy", "local", "mosquitto.conf"))
	for _, k := range []string{"max_queued_messages", "max_queued_bytes", "max_inflight_messages", "persistence", "per_listener_settings", "autosave_interval"} {
		if conf[k] != local[k] {
			t.Errorf("mosquitto.conf %s %q, deploy/local has %q", k, conf[k], local[k])
		}
	}
	if conf["listener"] != "1883 0.0.0.0" {
		t.Errorf("mosquitto.conf listener %q: want 1883 on every interface of the container", conf["listener"])
	}
	if dir := conf["persistence_location"]; !slices.ContainsFunc(mq.Volumes, func(v string) bool {
		return strings.HasSuffix(v, ":"+strings.TrimSuffix(dir, "/"))
	}) {
		t.Errorf("mosquitto persistence_location %s is not on a volume (%v)", dir, mq.Volumes)
	}

	// sigwatch: two replicas, distinct host names (the default client id is
	// sigwatch-<host name>), one shared group, the API published once.
	slices.Sort(replicas)
	if len(replicas) != 2 {
		t.Fatalf("sigwatch replicas %v, want 2", replicas)
	}
	hosts := map[string]bool{}
	nPublished := 0
	vars := map[string]string{"SIGWATCH_HTTP_TOKEN": "compose-check"}
	for _, name := range replicas {
		s := c.Services[name]
		if s.Hostname == "" || hosts[s.Hostname] {
			t.Errorf("%s: host name %q: want one of its own (it names the MQTT client id)", name, s.Hostname)
		}
		hosts[s.Hostname] = true
		if slices.Contains(s.Ports, "8080:8080") {
			nPublished++
		}
		if _, ok := s.Environment["SIGWATCH_MQTT_CLIENT_ID"]; ok {
			t.Errorf("%s sets SIGWATCH_MQTT_CLIENT_ID: leave it to the host name", name)
		}
		for _, dep := range []string{"redis", "mosquitto", "nats"} {
			if s.DependsOn[dep].Condition != "service_healthy" {
				t.Errorf("%s: want depends_on %s: service_healthy", name, dep)
			}
		}
		var cfgSrc string
		for _, v := range s.Volumes {
			if src, dst, _ := strings.Cut(v, ":"); strings.HasPrefix(dst, "/etc/sigwatch/sigwatch.yaml") {
				cfgSrc = filepath.Join(composeDir, src)
			}
		}
		if cfgSrc == "" {
			t.Errorf("%s: no config mounted at /etc/sigwatch/sigwatch.yaml", name)
			continue
		}
		env := []string{"HOSTNAME=" + s.Hostname}
		for k, v := range s.Environment {
			env = append(env, k+"="+interpolate(t, v, vars))
		}
		if out, err := runSigwatch(t, env, "config", "check", "--config", cfgSrc); err != nil {
			t.Errorf("%s: sigwatch config check: %v\n%s", name, err, out)
		}
		// Without the token compose refuses to start (${...:?}), and so would sigwatch.
		if out, err := runSigwatch(t, nil, "config", "check", "--config", cfgSrc); err == nil || !strings.Contains(out, "http.token") {
			t.Errorf("%s: config without SIGWATCH_HTTP_TOKEN accepted: %s", name, out)
		}
	}
	if nPublished != 1 {
		t.Errorf("the API is published by %d replicas, want 1", nPublished)
	}
	var cfg struct {
		MQTT struct {
			SharedGroup string `yaml:"shared_group"`
			ClientID    string `yaml:"client_id"`
			Brokers     []string
		} `yaml:"mqtt"`
		Redis struct{ Addrs []string }
		NATS  struct{ URL string } `yaml:"nats"`
	}
	b, err := os.ReadFile(filepath.Join(composeDir, "sigwatch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.MQTT.SharedGroup == "" {
		t.Error("compose sigwatch.yaml: no mqtt.shared_group: both replicas would each take the whole stream")
	}
	if cfg.MQTT.ClientID != "" {
		t.Errorf("compose sigwatch.yaml hard-codes mqtt.client_id %q: both replicas would share it", cfg.MQTT.ClientID)
	}
	// The addresses name the compose services.
	for what, addr := range map[string]string{"mqtt.brokers": strings.Join(cfg.MQTT.Brokers, ","), "redis.addrs": strings.Join(cfg.Redis.Addrs, ","), "nats.url": cfg.NATS.URL} {
		host := addr
		if _, rest, ok := strings.Cut(host, "://"); ok {
			host = rest
		}
		host, _, _ = strings.Cut(host, ":")
		if _, ok := c.Services[host]; !ok {
			t.Errorf("compose sigwatch.yaml %s %q: %s is not a compose service", what, addr, host)
		}
	}
}

// mosquittoSettings reads a mosquitto.conf into key → value (the last one wins).
func mosquittoSettings(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, _ := strings.Cut(l, " ")
		m[k] = strings.TrimSpace(v)
	}
	return m
}
