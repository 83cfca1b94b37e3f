package bench

import (
	"fmt"
	"os/exec"
	"strings"
)

// pprofTop runs `go tool pprof -top` on the profile at path and returns the
// summary lines and the n heaviest functions by flat time, then by
// cumulative time.
func pprofTop(path string, n int) ([]string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	var out []string
	for _, mode := range [][]string{{"-top"}, {"-top", "-cum"}} {
		args := append([]string{"tool", "pprof"}, mode...)
		args = append(args, fmt.Sprintf("-nodecount=%d", n), path)
		b, err := exec.Command(goBin, args...).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, b)
		}
		keep := false
		for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
			switch {
			case strings.HasPrefix(line, "Duration:") && len(out) == 0:
				out = append(out, line)
			case strings.Contains(line, "flat%") && strings.Contains(line, "cum%"):
				keep = true
				if len(mode) == 2 {
					out = append(out, "", "sorted by cumulative time:")
				}
				out = append(out, line)
			case keep:
				out = append(out, line)
			}
		}
	}
	return out, nil
}
