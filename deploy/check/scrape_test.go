package check

import (
	"bytes"
	"os"
	"regexp"
	"testing"

	"github.com/prometheus/common/config"
	"gopkg.in/yaml.v3"
)

// scrapeJob is the part of a Prometheus scrape job the example uses; a key
// not here is refused, as a misspelt one would be by Prometheus.
type scrapeJob struct {
	JobName       string                       `yaml:"job_name"`
	MetricsPath   string                       `yaml:"metrics_path"`
	Scheme        string                       `yaml:"scheme"`
	Authorization *config.Authorization        `yaml:"authorization"`
	KubernetesSD  []struct{ Role string }      `yaml:"kubernetes_sd_configs"`
	StaticConfigs []struct{ Targets []string } `yaml:"static_configs"`
	Relabel       []struct {
		SourceLabels []string `yaml:"source_labels"`
		Regex        string   `yaml:"regex"`
		Action       string   `yaml:"action"`
		TargetLabel  string   `yaml:"target_label"`
	} `yaml:"relabel_configs"`
}

const scrapeFile = "../prometheus/scrape.yml"

// TestScrapeConfig: the Prometheus example decodes strictly,
// every job scrapes /metrics with the metrics token from a file (the
// manifests set http.metrics_auth: token), and the Kubernetes job keeps
// exactly the sigwatch pods' http port.
func TestScrapeConfig(t *testing.T) {
	b, err := os.ReadFile(scrapeFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []scrapeJob `yaml:"scrape_configs"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("%s: %v", scrapeFile, err)
	}
	if len(cfg.ScrapeConfigs) == 0 {
		t.Fatalf("%s: no scrape job", scrapeFile)
	}
	m := loadManifests(t)
	ws := m.workloads()
	if len(ws) != 1 {
		t.Fatalf("%d workloads", len(ws))
	}
	labels := ws[0].pod.Labels
	for _, sc := range cfg.ScrapeConfigs {
		a := sc.Authorization
		if a == nil || a.Type != "Bearer" || a.CredentialsFile == "" {
			t.Errorf("job %s: want authorization Bearer with a credentials_file (the metrics token)", sc.JobName)
		}
		hc := config.HTTPClientConfig{Authorization: a}
		if err := hc.Validate(); err != nil {
			t.Errorf("job %s: %v", sc.JobName, err)
		}
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("job %s: metrics_path %s", sc.JobName, sc.MetricsPath)
		}
		if len(sc.KubernetesSD) == 0 {
			if len(sc.StaticConfigs) == 0 {
				t.Errorf("job %s: no targets", sc.JobName)
			}
			continue
		}
		if sc.KubernetesSD[0].Role != "pod" {
			t.Errorf("job %s: kubernetes_sd_configs role %q, want pod", sc.JobName, sc.KubernetesSD[0].Role)
		}
		kept := map[string]bool{}
		for _, rc := range sc.Relabel {
			if rc.Action != "keep" || len(rc.SourceLabels) != 1 {
				continue
			}
			re := regexp.MustCompile("^(?:" + rc.Regex + ")$")
			switch rc.SourceLabels[0] {
			case "__meta_kubernetes_pod_label_app_kubernetes_io_name":
				kept["pod"] = re.MatchString(labels["app.kubernetes.io/name"])
			case "__meta_kubernetes_pod_container_port_name":
				kept["port"] = re.MatchString("http")
			}
		}
		if !kept["pod"] || !kept["port"] {
			t.Errorf("job %s: keeps the sigwatch pods %v and their http port %v; want both", sc.JobName, kept["pod"], kept["port"])
		}
	}
}
