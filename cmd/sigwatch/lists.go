package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// listFlags are the flags of `device ls` and `alarm ls`.
type listFlags struct {
	c                  *apiClient
	state, typ, cursor *string
	group              *string // alarm ls only
	limit              *int
	all, json          *bool
}

func newListFlags(name, states string) (*flag.FlagSet, listFlags) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var f listFlags
	f.c = apiFlags(fs)
	f.state = fs.String("state", "", "list only this state: "+states)
	f.typ = fs.String("type", "", "list only (the alarms of) devices of this type")
	f.limit = fs.Int("limit", 100, "rows per page (at most 1000)")
	f.cursor = fs.String("cursor", "", "start at this page (the \"next\" of the previous one)")
	f.all = fs.Bool("all", false, "follow the pages to the end")
	f.json = fs.Bool("json", false, "print JSON")
	return fs, f
}

// pages fetches path's pages with f's query, one or, with --all, every
// one, and calls add with each page's body; it returns the last "next".
func (f listFlags) pages(ctx context.Context, path string, add func(body []byte) (next string, err error)) (string, error) {
	cursor := *f.cursor
	for {
		q := url.Values{}
		for k, v := range map[string]string{"state": *f.state, "type": *f.typ, "cursor": cursor} {
			if v != "" {
				q.Set(k, v)
			}
		}
		if f.group != nil && *f.group != "" {
			q.Set("group", *f.group)
		}
		q.Set("limit", strconv.Itoa(*f.limit))
		body, err := f.c.do(ctx, http.MethodGet, path+"?"+q.Encode(), nil)
		if err != nil {
			return "", err
		}
		next, err := add(body)
		if err != nil {
			return "", err
		}
		if next == "" || !*f.all {
			return next, nil
		}
		cursor = next
	}
}

// cmdDeviceList is `sigwatch device ls`.
func cmdDeviceList(ctx context.Context, args []string, stdout io.Writer) error {
	fs, f := newListFlags("device ls", "lost or watched (default: every known device, the watched first)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("usage: sigwatch device ls [--state lost|watched] [--type T] [--limit N] [--cursor C] [--all] [--json]")
	}
	var all api.DeviceList
	next, err := f.pages(ctx, "/v1/devices", func(body []byte) (string, error) {
		var p api.DeviceList
		if err := json.Unmarshal(body, &p); err != nil {
			return "", fmt.Errorf("reading the device list: %w", err)
		}
		all.Devices = append(all.Devices, p.Devices...)
		return p.Next, nil
	})
	if err != nil {
		return err
	}
	all.Next = next
	if all.Devices == nil {
		all.Devices = []shard.ListedDevice{}
	}
	if *f.json {
		return printJSON(stdout, all)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tTYPE\tGROUP\tSTATE\tLAST SEEN\tDEADLINE\tLOST AT\tTHRESHOLD")
	for _, d := range all.Devices {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Device, orDash(d.Type), orDash(d.Group), d.State, msTime(d.LastSeen),
			msTime(d.Deadline), msTime(d.LostAt), time.Duration(d.ThresholdMS)*time.Millisecond)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printNext(stdout, next)
}

// cmdAlarm is `sigwatch alarm ls`.
func cmdAlarm(ctx context.Context, args []string, stdout io.Writer) error {
	const use = "usage: sigwatch alarm ls [--state active|acked|muted|flapping|held[,…]] [--type T] [--group G] [--limit N] [--cursor C] [--all] [--json]"
	if len(args) == 0 || args[0] != "ls" {
		return errors.New(use)
	}
	fs, f := newListFlags("alarm ls", "active, acked, muted, flapping or held, or several comma-separated (default: every open alarm)")
	f.group = fs.String("group", "", "list only the alarms of this group's devices")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New(use)
	}
	var all api.AlarmList
	next, err := f.pages(ctx, "/v1/alarms", func(body []byte) (string, error) {
		var p api.AlarmList
		if err := json.Unmarshal(body, &p); err != nil {
			return "", fmt.Errorf("reading the alarm list: %w", err)
		}
		all.Alarms = append(all.Alarms, p.Alarms...)
		return p.Next, nil
	})
	if err != nil {
		return err
	}
	all.Next = next
	if all.Alarms == nil {
		all.Alarms = []alarm.Listed{}
	}
	if *f.json {
		return printJSON(stdout, all)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tTYPE\tSTATE\tSINCE\tREPEATS\tNEXT REPEAT\tACKED UNTIL\tACKED BY\tMUTE")
	held := false
	for _, l := range all.Alarms {
		held = held || l.State == alarm.ListHeld
		who := l.Device
		switch l.Scope {
		case dispatch.ScopeFleet:
			who = "(fleet storm)"
		case dispatch.ScopeGroup:
			who = "(group " + l.Group + " storm)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", who, orDash(l.Type), l.State, msTime(l.Since), l.Count,
			msTime(l.NextRepeat), msTime(l.AckedUntil), orDash(l.AckedBy), orDash(l.Mute))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if held {
		fmt.Fprintf(stdout, "\nheld: %s\n", heldLegend)
	}
	return printNext(stdout, next)
}

// heldLegend says what a held alarm is (alarm.Held): the device is lost,
// but its raise is not sent yet.
const heldLegend = "the device is lost, but its alarm is not raised yet: the raise waits out storm.hold " +
	"(by default the device's threshold, at most 1m) in case a storm of its group or of the fleet " +
	"speaks for it, and stays held while such a storm lasts"

// printNext tells how to get the next page, if there is one.
func printNext(w io.Writer, next string) error {
	if next == "" {
		return nil
	}
	_, err := fmt.Fprintf(w, "\nmore: --cursor %s (or --all)\n", next)
	return err
}
