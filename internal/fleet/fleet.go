package fleet

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Options shape the simulated fleet.
type Options struct {
	Broker             string // tcp://host:port
	ClientID           string
	Username, Password string
	TLS                *tls.Config
	Devices            int           // default 1000
	IDPrefix           string        // default "dev-"
	Topic              string        // with {id}, {type} and {group}; default "devices/{id}/signal"
	Types              []string      // device types assigned round-robin; default none
	Interval           time.Duration // each device signals once per interval, default 1s
	QoS                byte          // default 1
	SilenceEvery       time.Duration // every so often some devices go silent; 0 = never
	SilenceCount       int           // how many each time, default 1
	SilenceFor         time.Duration // how long they stay silent; 0 = forever
	// GroupSize puts devices in groups ("gw-0", "gw-1", ...) of this many,
	// in order; 0: no groups.
	GroupSize int
	// GroupDarkEvery, with groups, makes a whole group go silent so often
	// (a gateway failing), for SilenceFor; 0 = never.
	GroupDarkEvery time.Duration
	Seed           uint64
}

// Fleet publishes the signals of simulated devices.
type Fleet struct {
	opts   Options
	ids    []string
	types  []string
	groups []string
	rng    *rand.Rand
	sent   atomic.Int64
	failed atomic.Int64

	mu       sync.Mutex
	silentTo map[int]time.Time // device index -> end of silence (zero: forever)
	silenced int64
}

// New prepares a fleet; Run starts it.
func New(opts Options) *Fleet {
	if opts.Devices <= 0 {
		opts.Devices = 1000
	}
	if opts.IDPrefix == "" {
		opts.IDPrefix = "dev-"
	}
	if opts.Topic == "" {
		opts.Topic = "devices/{id}/signal"
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.QoS == 0 && opts.Broker != "" {
		opts.QoS = 1
	}
	if opts.SilenceCount <= 0 {
		opts.SilenceCount = 1
	}
	if opts.ClientID == "" {
		opts.ClientID = fmt.Sprintf("sigwatch-fleet-%d", rand.Int64())
	}
	f := &Fleet{opts: opts, rng: rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)), silentTo: map[int]time.Time{}}
	for i := 0; i < opts.Devices; i++ {
		f.ids = append(f.ids, fmt.Sprintf("%s%06d", opts.IDPrefix, i))
		t := ""
		if len(opts.Types) > 0 {
			t = opts.Types[i%len(opts.Types)]
		}
		f.types = append(f.types, t)
		g := ""
		if opts.GroupSize > 0 {
			g = fmt.Sprintf("gw-%d", i/opts.GroupSize)
		}
		f.groups = append(f.groups, g)
	}
	return f
}

// Group returns the group of device i ("" without groups).
func (f *Fleet) Group(i int) string { return f.groups[i] }

// ID returns the id of device i.
func (f *Fleet) ID(i int) string { return f.ids[i] }

// Type returns the type of device i.
func (f *Fleet) Type(i int) string { return f.types[i] }

// Topic returns the topic device i publishes on.
func (f *Fleet) Topic(i int) string {
	return strings.NewReplacer("{id}", f.ids[i], "{type}", f.types[i], "{group}", f.groups[i]).Replace(f.opts.Topic)
}

// Sent is the number of signals published; Failed those the broker refused.
func (f *Fleet) Sent() int64   { return f.sent.Load() }
func (f *Fleet) Failed() int64 { return f.failed.Load() }

// Silenced is how many silences have started so far.
func (f *Fleet) Silenced() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.silenced
}

// Silence makes device i stop signalling until the given time (zero: for
// good).
func (f *Fleet) Silence(i int, until time.Time) {
	f.mu.Lock()
	f.silentTo[i] = until
	f.silenced++
	f.mu.Unlock()
}

// Silent reports whether device i is silent at now.
func (f *Fleet) Silent(i int, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	until, ok := f.silentTo[i]
	if !ok {
		return false
	}
	if !until.IsZero() && !now.Before(until) {
		delete(f.silentTo, i)
		return false
	}
	return true
}

// Connect returns a connected MQTT client for the fleet's broker.
func (f *Fleet) Connect() (mqtt.Client, error) {
	o := mqtt.NewClientOptions().AddBroker(f.opts.Broker).SetClientID(f.opts.ClientID).
		SetCleanSession(true).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(200 * time.Millisecond).SetMaxReconnectInterval(time.Second).
		SetUsername(f.opts.Username).SetPassword(f.opts.Password).SetOrderMatters(false)
	if f.opts.TLS != nil {
		o.SetTLSConfig(f.opts.TLS)
	}
	c := mqtt.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		return nil, fmt.Errorf("fleet: connect %s: timed out", f.opts.Broker)
	}
	if err := tok.Error(); err != nil {
		return nil, fmt.Errorf("fleet: connect %s: %w", f.opts.Broker, err)
	}
	return c, nil
}

// tick is how often Run publishes the devices that are due.
const tick = 10 * time.Millisecond

// maxPending bounds publishes awaiting the broker's acknowledgement.
const maxPending = 10000

// Run publishes until ctx is done. Devices are spread evenly over the
// interval so the load is smooth.
func (f *Fleet) Run(ctx context.Context) error {
	c, err := f.Connect()
	if err != nil {
		return err
	}
	defer c.Disconnect(250)
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	nextSilence := start.Add(f.opts.SilenceEvery)
	nextDark := start.Add(f.opts.GroupDarkEvery)
	slots := int(f.opts.Interval / tick)
	if slots < 1 {
		slots = 1
	}
	// Acknowledgements are collected off the tick loop so a slow broker
	// delays the count, not the schedule; maxPending bounds memory.
	acks := make(chan mqtt.Token, maxPending)
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		for tok := range acks {
			tok.Wait()
			if tok.Error() != nil {
				f.failed.Add(1)
			} else {
				f.sent.Add(1)
			}
		}
	}()
	defer func() { close(acks); <-reaped }()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			if f.opts.SilenceEvery > 0 && now.After(nextSilence) {
				nextSilence = now.Add(f.opts.SilenceEvery)
				var until time.Time
				if f.opts.SilenceFor > 0 {
					until = now.Add(f.opts.SilenceFor)
				}
				for k := 0; k < f.opts.SilenceCount; k++ {
					f.Silence(f.rng.IntN(len(f.ids)), until)
				}
			}
			if f.opts.GroupDarkEvery > 0 && f.opts.GroupSize > 0 && now.After(nextDark) {
				nextDark = now.Add(f.opts.GroupDarkEvery)
				f.darken(f.rng.IntN((len(f.ids)+f.opts.GroupSize-1)/f.opts.GroupSize), now)
			}
			for i := n % slots; i < len(f.ids); i += slots {
				if f.Silent(i, now) {
					continue
				}
				select {
				case acks <- c.Publish(f.Topic(i), f.opts.QoS, false, []byte{}):
				case <-ctx.Done():
					return nil
				}
			}
		}
	}
}

// darken silences every device of group g (by index) for SilenceFor.
func (f *Fleet) darken(g int, now time.Time) {
	var until time.Time
	if f.opts.SilenceFor > 0 {
		until = now.Add(f.opts.SilenceFor)
	}
	for i := g * f.opts.GroupSize; i < min(len(f.ids), (g+1)*f.opts.GroupSize); i++ {
		f.Silence(i, until)
	}
}
