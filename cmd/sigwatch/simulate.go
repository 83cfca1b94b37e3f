package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/internal/fleet"
)

// cmdSimulate publishes a simulated fleet's signals to any MQTT broker.
func cmdSimulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	broker := fs.String("broker", "tcp://127.0.0.1:1883", "MQTT broker URL")
	user := fs.String("username", "", "MQTT username")
	pass := fs.String("password", "", "MQTT password")
	devices := fs.Int("devices", 1000, "simulated devices")
	interval := fs.Duration("interval", time.Second, "each device signals once per interval")
	topic := fs.String("topic", "devices/{id}/signal", "topic template with {id} and {type}")
	types := fs.String("types", "", "comma-separated device types, assigned round-robin")
	silenceEvery := fs.Duration("silence-every", 2*time.Second, "how often some devices go silent (0: never)")
	silenceCount := fs.Int("silence-count", 1, "devices silenced each time")
	silenceFor := fs.Duration("silence-for", 30*time.Second, "how long they stay silent (0: forever)")
	duration := fs.Duration("duration", 0, "stop after this long (0: until Ctrl-C)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var ts []string
	if *types != "" {
		ts = strings.Split(*types, ",")
	}
	fl := fleet.New(fleet.Options{Broker: *broker, Username: *user, Password: *pass, Devices: *devices,
		Interval: *interval, Topic: *topic, Types: ts, SilenceEvery: *silenceEvery,
		SilenceCount: *silenceCount, SilenceFor: *silenceFor, Seed: uint64(time.Now().UnixNano())})
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	done := make(chan error, 1)
	go func() { done <- fl.Run(ctx) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := int64(0)
	for {
		select {
		case err := <-done:
			fmt.Fprintf(stdout, "sent %d signals, %d failed, %d silences\n", fl.Sent(), fl.Failed(), fl.Silenced())
			return err
		case <-tick.C:
			s := fl.Sent()
			fmt.Fprintf(stdout, "signals/s %6d  sent %9d  failed %d  silences %d\n", s-last, s, fl.Failed(), fl.Silenced())
			last = s
		}
	}
}
