// Package check holds the tests of the deployable files: the Dockerfile, the
// compose file and the Kubernetes manifests. It is a module of its own so
// that the Kubernetes API types are a test dependency of this module only,
// never of the service.
package check

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// repoRoot is the sigwatch repository, two levels up.
var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}()

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
	buildOut  []byte
)

// sigwatchBinary builds sigwatch once for all tests of this package, with
// the go build command of the Dockerfile's build stage, run as it is written
// there (with /out/sigwatch replaced by a temporary path).
func sigwatchBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		args, env, err := dockerfileBuild()
		if err != nil {
			buildErr = err
			return
		}
		// One fixed place, overwritten by each run, so runs leave no litter.
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("sigwatch-deploy-check-%d", os.Getuid()))
		if buildErr = os.MkdirAll(dir, 0o755); buildErr != nil {
			return
		}
		buildBin = filepath.Join(dir, "sigwatch")
		for i, a := range args {
			if a == "/out/sigwatch" {
				args[i] = buildBin
			}
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), env...)
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("building sigwatch as the Dockerfile does: %v\n%s", buildErr, buildOut)
	}
	return buildBin
}

// dockerfileBuild returns the go build command of the Dockerfile's RUN
// line (continuations joined, cache mounts dropped) and the VAR=value
// settings before it, with ${VERSION} set to "check".
func dockerfileBuild() (args, env []string, err error) {
	runs, err := dockerfileInstructions("RUN")
	if err != nil {
		return nil, nil, err
	}
	for _, run := range runs {
		i := strings.Index(run, "go build")
		if i < 0 {
			continue
		}
		// What stands before "go build" after the last mount is the environment.
		head := run[:i]
		if j := strings.LastIndex(head, " "); j >= 0 {
			head = head[:j]
		}
		var envs []string
		for _, f := range strings.Fields(head) {
			if strings.Contains(f, "=") && !strings.HasPrefix(f, "--") {
				envs = append(envs, f)
			}
		}
		words, err := shellWords(strings.ReplaceAll(run[i:], "${VERSION}", "check"))
		if err != nil {
			return nil, nil, err
		}
		return words, envs, nil
	}
	return nil, nil, errors.New("no RUN ... go build line in the Dockerfile")
}

// dockerfileInstructions returns the arguments of each instruction named
// kind in the Dockerfile, with line continuations joined and comments left out.
func dockerfileInstructions(kind string) ([]string, error) {
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || line == "" && cur.Len() == 0 {
			continue
		}
		cont := strings.HasSuffix(line, "\\")
		cur.WriteString(strings.TrimSuffix(line, "\\"))
		cur.WriteString(" ")
		if cont {
			continue
		}
		ins := strings.TrimSpace(cur.String())
		cur.Reset()
		if name, rest, _ := strings.Cut(ins, " "); strings.EqualFold(name, kind) {
			out = append(out, strings.TrimSpace(rest))
		}
	}
	return out, sc.Err()
}

// shellWords splits s as a shell would for plain words and double-quoted
// strings, which is all the Dockerfile's build line uses.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	in, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			in = true
		case (r == ' ' || r == '\t') && !quoted:
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unbalanced quotes in %q", s)
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

// runSigwatch runs the built sigwatch with args and only env (plus PATH and
// HOME) in its environment, and returns its combined output.
func runSigwatch(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(sigwatchBinary(t), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
