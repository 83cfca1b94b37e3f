package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// cpuMeter reads the CPU time of this process and of the servers, so a
// scenario can say which of them was busy: the bottleneck on a shared
// two-core machine is whoever is near 100% of a core.
type cpuMeter struct {
	pids map[string]int // name -> pid; "sigwatch" is this process
}

func (r *runner) newCPUMeter(ctx context.Context, extra map[string]int) *cpuMeter {
	m := &cpuMeter{pids: map[string]int{"sigwatch": os.Getpid(), "nats-server": r.e.nats.pid()}}
	if info, err := r.e.redisInfo(ctx, "server"); err == nil {
		if pid, err := strconv.Atoi(info["process_id"]); err == nil {
			m.pids["redis"] = pid
		}
	}
	if pid := findProcess(filepath.Join(r.e.mosq.Dir, "mosquitto.conf")); pid > 0 {
		m.pids["mosquitto"] = pid
	}
	if r.r3 != nil {
		// The single server idles meanwhile; the cluster's nodes work.
		delete(m.pids, "nats-server")
		for j, pid := range r.r3.pids {
			m.pids[fmt.Sprintf("nats-server %d", j+1)] = pid
		}
	}
	for k, v := range extra {
		m.pids[k] = v
	}
	return m
}

// findProcess returns the pid of a process whose command line mentions arg.
func findProcess(arg string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), arg) {
			return pid
		}
	}
	return 0
}

type cpuSample struct {
	at  time.Time
	cpu map[string]time.Duration
}

func (m *cpuMeter) sample() cpuSample {
	s := cpuSample{at: time.Now(), cpu: make(map[string]time.Duration, len(m.pids))}
	for name, pid := range m.pids {
		if pid == os.Getpid() {
			s.cpu[name] = processCPU()
		} else {
			s.cpu[name] = childCPU(pid)
		}
	}
	return s
}

// cpuShares is the CPU each process used between two samples, in percent of
// one core.
type cpuShares map[string]float64

func (m *cpuMeter) since(a cpuSample) cpuShares {
	b := m.sample()
	el := b.at.Sub(a.at).Seconds()
	out := cpuShares{}
	for name, v := range b.cpu {
		out[name] = 100 * (v - a.cpu[name]).Seconds() / el
	}
	return out
}

func (s cpuShares) String() string {
	var parts []string
	names := []string{"sigwatch", "loadgen", "redis", "mosquitto", "nats-server", "postgres"}
	var more []string // such as the nodes of a NATS cluster
	for name := range s {
		if !slices.Contains(names, name) {
			more = append(more, name)
		}
	}
	slices.Sort(more)
	for _, name := range append(names, more...) {
		if v, ok := s[name]; ok {
			label := name
			if name == "sigwatch" {
				label = "harness process"
			}
			parts = append(parts, fmt.Sprintf("%s %.0f%%", label, v))
		}
	}
	return "CPU (% of one core): " + strings.Join(parts, ", ")
}
