package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// AdvisoriesConfig is the nats.advisories section: the NATS server's
// reports of its MQTT listener's clients connecting and disconnecting
// ($SYS.ACCOUNT.<account>.CONNECT and .DISCONNECT). Only a user of the
// system account sees them, so the watcher logs in with credentials of its
// own, to the URL and with the TLS of the nats section.
type AdvisoriesConfig struct {
	Enabled   bool   `yaml:"enabled"`
	CredsFile string `yaml:"creds_file"`
	User      string `yaml:"user"`
	Password  string `yaml:"password"`
}

func (a AdvisoriesConfig) validate() error {
	if a.Enabled && a.CredsFile == "" && a.User == "" {
		return errors.New("nats.advisories.enabled needs nats.advisories.user or creds_file: only a system account user sees the advisories")
	}
	return nil
}

// A ClientAdvisory is the NATS server's report that an MQTT client of its
// MQTT listener connected (Up) or disconnected.
type ClientAdvisory struct {
	ClientID string // the MQTT client id
	Account  string
	Up       bool
	// Start is when the connection began: a client's later connection
	// starts later, so it orders one client's advisories.
	Start  time.Time
	Reason string // why the connection closed, in the server's words
}

// ParseClientAdvisory reads a connect or disconnect advisory; ok is false
// for a client that is not an MQTT client with a client id.
func ParseClientAdvisory(subject string, data []byte) (a ClientAdvisory, ok bool, err error) {
	var v struct {
		Client struct {
			Start    *time.Time `json:"start"`
			Account  string     `json:"acc"`
			Type     string     `json:"client_type"`
			ClientID string     `json:"client_id"`
		} `json:"client"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return a, false, err
	}
	switch {
	case strings.HasSuffix(subject, ".DISCONNECT"):
	case strings.HasSuffix(subject, ".CONNECT"):
		a.Up = true
	default:
		return a, false, fmt.Errorf("%s is no connect or disconnect advisory", subject)
	}
	if v.Client.Type != "mqtt" || v.Client.ClientID == "" {
		return a, false, nil
	}
	a.ClientID, a.Account, a.Reason = v.Client.ClientID, v.Client.Account, v.Reason
	if v.Client.Start != nil {
		a.Start = *v.Client.Start
	}
	return a, true, nil
}

// Advisories is a connection of the system account's user that follows
// the MQTT clients' advisories (DialAdvisories, Run).
type Advisories struct {
	nc  *nats.Conn
	in  chan *nats.Msg
	log *slog.Logger
}

// advisoryLanes is how many handlers run at once; one client's advisories
// always take the same lane, in the order they came.
const advisoryLanes = 8

// DialAdvisories connects the advisories' user to the NATS of c and
// subscribes to the connect and disconnect advisories of every account.
// It refuses a user outside the system account, who would see none.
// Like the main connection, it reconnects for ever; what the servers
// advise while it is away is not seen (the deadlines stay the backstop).
func DialAdvisories(ctx context.Context, c Config, log *slog.Logger) (*Advisories, error) {
	cc := c
	cc.CredsFile, cc.User, cc.Password, cc.Token = c.Advisories.CredsFile, c.Advisories.User, c.Advisories.Password, ""
	nc, err := connect(cc, log, nats.Name("sigwatch-advisories"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				log.Warn("NATS client advisories dropped: connection events come faster than they are stored")
				return
			}
			log.Warn("NATS client advisories", "err", err)
		}))
	if err != nil {
		return nil, err
	}
	a := &Advisories{nc: nc, in: make(chan *nats.Msg, 8192), log: log}
	if err := a.subscribe(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return a, nil
}

func (a *Advisories) subscribe(ctx context.Context) error {
	// Only the system account's services answer this: a user elsewhere
	// gets no responders.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := a.nc.RequestWithContext(ctx, "$SYS.REQ.SERVER.PING", nil); err != nil {
		return fmt.Errorf("nats.advisories: the user gets no answer from the system account (%v): advisories are only visible to a system account user", err)
	}
	// One channel for both subjects keeps their order of arrival.
	for _, subj := range []string{"$SYS.ACCOUNT.*.CONNECT", "$SYS.ACCOUNT.*.DISCONNECT"} {
		if _, err := a.nc.ChanSubscribe(subj, a.in); err != nil {
			return fmt.Errorf("nats.advisories: subscribe %s: %w", subj, err)
		}
	}
	if err := a.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("nats.advisories: %w", err)
	}
	return nil
}

// Close closes the connection; Run closes it too.
func (a *Advisories) Close() { a.nc.Close() }

// Run hands each MQTT client's advisory to fn until ctx is done, then
// closes the connection once the calls under way returned. fn runs on
// several goroutines at once, one client's advisories in order on one of
// them; it must not block for long, or advisories queue and then drop.
func (a *Advisories) Run(ctx context.Context, fn func(ClientAdvisory)) error {
	defer a.nc.Close()
	seed := maphash.MakeSeed()
	var wg sync.WaitGroup
	lanes := make([]chan ClientAdvisory, advisoryLanes)
	for i := range lanes {
		lanes[i] = make(chan ClientAdvisory, 256)
		wg.Go(func() {
			for adv := range lanes[i] {
				fn(adv)
			}
		})
	}
	defer func() {
		for _, l := range lanes {
			close(l)
		}
		wg.Wait()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-a.in:
			adv, ok, err := ParseClientAdvisory(m.Subject, m.Data)
			if err != nil {
				a.log.Warn("unreadable NATS client advisory", "subject", m.Subject, "err", err)
			}
			if !ok {
				continue
			}
			select {
			case lanes[maphash.String(seed, adv.ClientID)%advisoryLanes] <- adv:
			case <-ctx.Done():
				return nil
			}
		}
	}
}
