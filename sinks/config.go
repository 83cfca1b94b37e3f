package sinks

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/internal/webhooks"
)

// The kinds of sink.
const (
	TypeAlertmanager = "alertmanager"
	TypePagerDuty    = "pagerduty"
	TypeSlack        = "slack"
	TypeWebhook      = "webhook"
)

// Config is one sink of the sinks section: where notifications go, which
// ones (by alarm type and group), and how fast. Secrets (Slack and webhook
// URLs, PagerDuty routing keys, webhook signing secrets) come only from
// the environment or files, named here, never written in the file.
type Config struct {
	Name string `yaml:"name"`
	Type string `yaml:"type"`
	// URL is Alertmanager's address, or PagerDuty's events endpoint
	// (default https://events.pagerduty.com): not secrets.
	URL string `yaml:"url"`
	// URLEnv or URLFile hold a Slack or webhook URL.
	URLEnv  string `yaml:"url_env"`
	URLFile string `yaml:"url_file"`
	// RoutingKeyEnv or RoutingKeyFile hold a PagerDuty routing key.
	RoutingKeyEnv  string `yaml:"routing_key_env"`
	RoutingKeyFile string `yaml:"routing_key_file"`
	// SecretsEnv and SecretsFile hold a webhook's signing secrets
	// (whsec_…); several sign with each, for a rotation.
	SecretsEnv  []string `yaml:"secrets_env"`
	SecretsFile []string `yaml:"secrets_file"`
	// Types and Groups route: the alarms of these device types, of
	// devices in these groups (and these groups' storms). Empty: all.
	Types  []string `yaml:"types"`
	Groups []string `yaml:"groups"`
	// Rate is the sink's budget, notifications per second across every
	// replica (0: the sink's published limit, see DefaultRate).
	Rate float64 `yaml:"rate"`
	// RetryFor is how long a notification the sink may take later is
	// retried before it goes to the dead letters.
	RetryFor time.Duration `yaml:"retry_for"`
	// Timeout bounds one call to the sink.
	Timeout time.Duration `yaml:"timeout"`
	// Resend is how often open alarms are sent to Alertmanager again;
	// each carries an end four re-sends away.
	Resend time.Duration `yaml:"resend"`
	// AckWait is how long a replica that stopped answering holds a
	// notification before another takes it.
	AckWait time.Duration `yaml:"-"`
}

// DefaultRate is each kind's budget when none is configured: PagerDuty
// takes about 120 events a minute per routing key, Slack one message a
// second per channel; Alertmanager and webhooks publish none.
func DefaultRate(typ string) float64 {
	switch typ {
	case TypePagerDuty:
		return 2
	case TypeSlack:
		return 1
	case TypeWebhook:
		return 10
	}
	return 0
}

// Defaults.
const (
	DefaultRetryFor = 24 * time.Hour
	DefaultResend   = time.Minute
	DefaultAckWait  = 30 * time.Second
)

var nameRule = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// withDefaults fills what is not configured.
func (c Config) withDefaults() Config {
	if c.Rate == 0 {
		c.Rate = DefaultRate(c.Type)
	}
	if c.RetryFor == 0 {
		c.RetryFor = DefaultRetryFor
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Resend == 0 {
		c.Resend = DefaultResend
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	return c
}

func (c Config) rate() float64 { return c.Rate }

// routes reports whether n is for this sink.
func (c Config) routes(n Notification) bool {
	if n.Test {
		return true
	}
	var typ, group string
	switch {
	case n.Alarm != nil:
		typ, group = n.Alarm.Type, n.Alarm.Group
	case n.Storm != nil:
		group = n.Storm.Group
	}
	if len(c.Types) > 0 && n.Alarm != nil && !slices.Contains(c.Types, typ) {
		return false
	}
	return len(c.Groups) == 0 || slices.Contains(c.Groups, group)
}

// Validate refuses sinks that cannot work, naming the key
// (sinks[<i>].<key>).
func Validate(cs []Config) error {
	var errs []error
	seen := map[string]bool{}
	for i, c := range cs {
		bad := func(key, format string, a ...any) {
			errs = append(errs, fmt.Errorf("sinks[%d].%s: %s", i, key, fmt.Sprintf(format, a...)))
		}
		if !nameRule.MatchString(c.Name) {
			bad("name", "%q: use 1-64 letters, digits, '-' or '_' (it names the sink's subjects and metrics)", c.Name)
		} else if seen[c.Name] {
			bad("name", "%q is used by two sinks", c.Name)
		}
		seen[c.Name] = true
		switch c.Type {
		case TypeAlertmanager:
			if c.URL == "" {
				bad("url", "an Alertmanager sink needs its address, e.g. http://alertmanager:9093")
			}
		case TypePagerDuty:
			if (c.RoutingKeyEnv == "") == (c.RoutingKeyFile == "") {
				bad("routing_key_env", "a PagerDuty sink needs its routing key from routing_key_env or routing_key_file (one of them)")
			}
		case TypeSlack, TypeWebhook:
			if c.URL != "" {
				bad("url", "a %s URL is a secret: give it through url_env or url_file", c.Type)
			} else if (c.URLEnv == "") == (c.URLFile == "") {
				bad("url_env", "a %s sink needs its URL from url_env or url_file (one of them)", c.Type)
			}
			if c.Type == TypeWebhook && len(c.SecretsEnv)+len(c.SecretsFile) == 0 {
				bad("secrets_env", "a webhook sink signs what it sends: name the secret's variable (secrets_env) or file (secrets_file)")
			}
		default:
			bad("type", "%q: use alertmanager, pagerduty, slack or webhook", c.Type)
		}
		if c.Rate < 0 || c.Rate > 1000 {
			bad("rate", "%v: use 0 (the sink's published limit) or 0.001-1000 per second", c.Rate)
		}
		if c.RetryFor < 0 || c.Timeout < 0 || c.Resend < 0 {
			bad("retry_for", "durations must not be negative")
		}
	}
	return errors.Join(errs...)
}

// secrets of one sink, read from the environment and files at start.
type secrets struct {
	url, routingKey string
	signing         []webhooks.Secret
}

// resolve reads c's secrets; an error names the key and the variable or
// file, never the secret.
func (c Config) resolve(getenv func(string) string) (secrets, error) {
	var s secrets
	var err error
	read := func(key, env, file string) (string, error) {
		if env != "" {
			v := strings.TrimSpace(getenv(env))
			if v == "" {
				return "", fmt.Errorf("sink %s: %s: the variable %s is empty or not set", c.Name, key, env)
			}
			return v, nil
		}
		if file != "" {
			b, err := os.ReadFile(file)
			if err != nil {
				return "", fmt.Errorf("sink %s: %s: cannot read %s: %v", c.Name, key, file, errors.Unwrap(err))
			}
			if v := strings.TrimSpace(string(b)); v != "" {
				return v, nil
			}
			return "", fmt.Errorf("sink %s: %s: %s is empty", c.Name, key, file)
		}
		return "", nil
	}
	if s.url, err = read("url", c.URLEnv, c.URLFile); err != nil {
		return s, err
	}
	if s.url == "" {
		s.url = c.URL
	}
	if s.routingKey, err = read("routing_key", c.RoutingKeyEnv, c.RoutingKeyFile); err != nil {
		return s, err
	}
	// Each signing secret comes from a variable or a file; both lists
	// may hold several (a rotation).
	type source struct{ key, env, file string }
	var sources []source
	for _, env := range c.SecretsEnv {
		sources = append(sources, source{"secrets_env", env, ""})
	}
	for _, file := range c.SecretsFile {
		sources = append(sources, source{"secrets_file", "", file})
	}
	for _, src := range sources {
		v, err := read(src.key, src.env, src.file)
		if err != nil {
			return s, err
		}
		sec, err := webhooks.ParseSecret(v)
		if err != nil {
			return s, fmt.Errorf("sink %s: %s: %s: %v", c.Name, src.key, src.env+src.file, err)
		}
		s.signing = append(s.signing, sec)
	}
	return s, nil
}
