package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/api"
)

// verbArgs splits a command's args into its verb and the positional
// arguments after it, parsing the flags of fs wherever they stand among
// them. Without a verb it returns use as the error.
func verbArgs(fs *flag.FlagSet, args []string, use string) (verb string, pos []string, err error) {
	if len(args) < 1 {
		return "", nil, errors.New(use)
	}
	pos, err = parseAll(fs, args[1:])
	return args[0], pos, err
}

// parseAll parses flags given before, between and after the positional
// arguments, and returns the positional ones.
func parseAll(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// ackBody is the body of an ack: resolve, or pause for or until.
func ackBody(ackFor, ackUntil string) map[string]string {
	b := map[string]string{}
	if ackFor != "" {
		b["for"] = ackFor
	}
	if ackUntil != "" {
		b["until"] = ackUntil
	}
	return b
}

// cmdDevice talks to a running sigwatch's HTTP API.
func cmdDevice(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "ls" {
		return cmdDeviceList(ctx, args[1:], stdout)
	}
	fs := flag.NewFlagSet("device", flag.ContinueOnError)
	c := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	ackFor := fs.String("for", "", "ack: pause the alarm's repeats for this long (e.g. 30m) instead of resolving it")
	ackUntil := fs.String("until", "", "ack: pause the alarm's repeats until this time (RFC 3339 or unix ms)")
	const use = "usage: sigwatch device [--api URL] [--json] get|rm <id> | threshold <id> <duration> | group <id> <group> (empty removes) | ack <id> [--for 30m | --until T] | ls [--state lost|watched] [--type T] [--all]"
	verb, pos, err := verbArgs(fs, args, use)
	if err != nil {
		return err
	}
	if len(pos) < 1 {
		return errors.New(use)
	}
	id := pos[0]
	path := "/v1/devices/" + url.PathEscape(id)
	switch {
	case verb == "get" && len(pos) == 1:
		var v api.Device
		return c.show(ctx, http.MethodGet, path, nil, &v, *asJSON, stdout, func() { printDevice(stdout, v) })
	case verb == "rm" && len(pos) == 1:
		var v struct {
			Removed       bool `json:"removed"`
			AlarmResolved bool `json:"alarm_resolved"`
		}
		return c.show(ctx, http.MethodDelete, path, nil, &v, *asJSON, stdout, func() {
			switch {
			case !v.Removed && !v.AlarmResolved:
				fmt.Fprintf(stdout, "device %s was not watched; nothing removed\n", id)
			case v.AlarmResolved:
				fmt.Fprintf(stdout, "device %s removed; its alarm resolved\n", id)
			default:
				fmt.Fprintf(stdout, "device %s removed\n", id)
			}
		})
	case verb == "threshold" && len(pos) == 2:
		var v api.Device
		return c.show(ctx, http.MethodPut, path+"/threshold", map[string]string{"threshold": pos[1]}, &v, *asJSON, stdout,
			func() { printDevice(stdout, v) })
	case verb == "group" && len(pos) == 2:
		var v api.Device
		return c.show(ctx, http.MethodPut, path+"/group", map[string]string{"group": pos[1]}, &v, *asJSON, stdout,
			func() { printDevice(stdout, v) })
	case verb == "ack" && len(pos) == 1:
		var v alarm.View
		return c.show(ctx, http.MethodPost, path+"/ack", ackBody(*ackFor, *ackUntil), &v, *asJSON, stdout,
			func() { printAck(stdout, "device "+id, v) })
	}
	return errors.New(use)
}

// show calls method on path with in, then prints the answer: as it came
// with --json, else by human (after out is decoded).
func (c *apiClient) show(ctx context.Context, method, path string, in, out any, asJSON bool, stdout io.Writer, human func()) error {
	if asJSON {
		var body []byte
		if in != nil {
			body = mustJSON(in)
		}
		b, err := c.do(ctx, method, path, body)
		if err != nil {
			return err
		}
		return printRaw(stdout, b)
	}
	if err := c.callJSON(ctx, method, path, in, out); err != nil {
		return err
	}
	human()
	return nil
}

// printDevice writes the human form of one device.
func printDevice(w io.Writer, v api.Device) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	state := "not watched"
	switch {
	case v.Lost:
		state = "LOST since " + msTime(v.LostAt)
	case v.Watched:
		state = "watched"
	}
	fmt.Fprintf(tw, "device\t%s\n", v.Device)
	fmt.Fprintf(tw, "state\t%s\n", state)
	fmt.Fprintf(tw, "type\t%s\n", orDash(v.Type))
	fmt.Fprintf(tw, "group\t%s\n", orDash(v.Group))
	fmt.Fprintf(tw, "last seen\t%s\n", msTime(v.LastSeen))
	fmt.Fprintf(tw, "deadline\t%s\n", msTime(v.Deadline))
	fmt.Fprintf(tw, "threshold\t%s\n", time.Duration(v.ThresholdMS)*time.Millisecond)
	fmt.Fprintf(tw, "shard\t%d\n", v.Shard)
	if a := v.Alarm; a != nil {
		line := a.State
		if a.Count > 0 {
			line += fmt.Sprintf(", %d notifications", a.Count)
		}
		if a.Since > 0 {
			line += ", since " + msTime(a.Since)
		}
		if a.AckedUntil > 0 {
			line += ", acked until " + msTime(a.AckedUntil)
		}
		if a.AckedBy != "" {
			line += ", acked by " + a.AckedBy
		}
		if a.State == alarm.Held {
			line += " (" + heldLegend + ")"
		}
		fmt.Fprintf(tw, "alarm\t%s\n", line)
	}
	_ = tw.Flush()
}

// printAck writes what an ack did to who's alarm.
func printAck(w io.Writer, who string, v alarm.View) {
	if v.AckedUntil > 0 {
		fmt.Fprintf(w, "alarm of %s acked: repeats paused until %s\n", who, msTime(v.AckedUntil))
		return
	}
	fmt.Fprintf(w, "alarm of %s acked: %s\n", who, v.State)
}

// cmdMute adds, lists and removes alarm mutes through the HTTP API.
func cmdMute(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("mute", flag.ContinueOnError)
	c := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	device := fs.String("device", "", "add: mute this device")
	typ := fs.String("type", "", "add: mute every device of this type")
	dur := fs.String("for", "", "add: for this long (e.g. 1h)")
	until := fs.String("until", "", "add: until this time (RFC 3339 or unix ms)")
	comment := fs.String("comment", "", "add: why")
	const use = "usage: sigwatch mute [--api URL] [--json] add (--device ID | --type T) (--for 1h | --until T) [--comment text] | ls | rm <id>"
	verb, pos, err := verbArgs(fs, args, use)
	if err != nil {
		return err
	}
	switch {
	case verb == "add" && len(pos) == 0:
		b := map[string]string{"device": *device, "type": *typ, "for": *dur, "until": *until, "comment": *comment}
		for k, v := range b {
			if v == "" {
				delete(b, k)
			}
		}
		var m alarm.Mute
		return c.show(ctx, http.MethodPost, "/v1/mutes", b, &m, *asJSON, stdout, func() {
			fmt.Fprintf(stdout, "mute %s added: %s until %s\n", m.ID, muteWhat(m), msTime(m.Until))
		})
	case verb == "ls" && len(pos) == 0:
		var ms []alarm.Mute
		return c.show(ctx, http.MethodGet, "/v1/mutes", nil, &ms, *asJSON, stdout, func() {
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tMUTES\tFROM\tUNTIL\tCOMMENT")
			for _, m := range ms {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.ID, muteWhat(m), msTime(m.Start), msTime(m.Until), orDash(m.Comment))
			}
			_ = tw.Flush()
		})
	case verb == "rm" && len(pos) == 1:
		b, err := c.do(ctx, http.MethodDelete, "/v1/mutes/"+url.PathEscape(pos[0]), nil)
		if err != nil {
			return err
		}
		if *asJSON {
			return printRaw(stdout, b)
		}
		_, err = fmt.Fprintf(stdout, "mute %s removed\n", pos[0])
		return err
	}
	return errors.New(use)
}

func muteWhat(m alarm.Mute) string {
	if m.Device != "" {
		return "device " + m.Device
	}
	return "type " + m.Type
}

// mustJSON encodes v, a body the CLI built itself.
func mustJSON(v any) []byte {
	var b strings.Builder
	_ = printJSON(&b, v)
	return []byte(b.String())
}
